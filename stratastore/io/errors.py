"""Typed errors of the io layer."""

from __future__ import annotations

import errno as _errno
import os
import stat

from stratastore.errors import StrataError

__all__ = [
    "NotARegularFile",
    "NotAStoreName",
    "ShortRead",
    "StrataIOError",
    "SymlinkRefused",
    "kind_of",
    "refusal",
]

_FIX = {
    _errno.ENOSPC: "free space on that volume or lower the level's budget",
    _errno.EDQUOT: "raise the disk quota or lower the level's budget",
    _errno.EROFS: "the volume is read-only; remount it read-write or point the level elsewhere",
    _errno.EACCES: "give this process write permission on the directory",
    _errno.EPERM: "give this process write permission on the directory",
    _errno.EIO: "the device reported an I/O error; check the disk (dmesg) before retrying",
}


class StrataIOError(StrataError):
    """An operating-system I/O call failed. ``errno`` is the OS error, ``path`` the object."""

    def __init__(self, op: str, path: str, err: int, detail: str = "", fix: str = "") -> None:
        self.op = op
        self.path = path
        self.errno = err
        fix = fix or _FIX.get(err, "check the path and the volume")
        why = detail or os.strerror(err)
        super().__init__(f"{op} {path}: {why} (errno {err}); {fix}")


class NotARegularFile(StrataIOError):
    """A store name (spec F-DIR-1..4) that is not a regular file: a FIFO, a device, a socket, or
    a directory where a file belongs (or a file where ``strata-index/`` belongs). The io layer
    never reads from it (a FIFO would block forever) and never removes or moves it (spec
    F-DIR-8); callers skip it and report it. ``kind`` says what it is."""

    def __init__(self, op: str, path: str, kind: str) -> None:
        self.kind = kind
        super().__init__(
            op,
            path,
            _errno.EINVAL,
            f"{kind}, not a regular file",
            "stratastore never reads, moves or removes it: remove or rename it by hand if it "
            "does not belong in the store directory",
        )


class SymlinkRefused(StrataIOError):
    """A symbolic link inside a store directory where a store file or ``strata-index/`` /
    ``strata-quarantine/`` belongs. The io layer never follows one (spec F-DIR-8): reading
    through it could read another store's files, and removing "through" it could delete files
    outside the store."""

    def __init__(self, op: str, path: str) -> None:
        super().__init__(
            op,
            path,
            _errno.ELOOP,
            "a symbolic link inside a store directory",
            "stratastore never follows it: replace the link by the real file or directory, or "
            "remove it by hand (point the store's configuration at the real directory instead)",
        )


class NotAStoreName(StrataIOError):
    """A destructive operation (unlink, rmdir, quarantine) was asked for a name that is not a
    store name directly inside a store directory (spec F-DIR-8); nothing was done. This is a
    bug in the caller, never a property of the directory."""

    def __init__(self, op: str, path: str) -> None:
        super().__init__(
            op,
            path,
            _errno.EPERM,
            "not a store file name inside a store directory",
            "stratastore only removes its own files (strata-conv-, strata-chain-, strata-tmp- "
            "names and the index files in strata-index/); report this as a bug",
        )


class ShortRead(StrataIOError):
    """A file ended before the bytes a reader had checked were there: it was truncated (or
    replaced by a shorter one) while being read. Reads go into memory the process owns, so
    this is an error at the read, never a SIGBUS at a later access of a mapping; a restore's
    ladder stops at it (spec F-SC-3) and nothing of the short read is delivered."""

    def __init__(self, path: str, ended_at: int, wanted_to: int) -> None:
        self.ended_at = ended_at
        self.wanted_to = wanted_to
        super().__init__(
            "read",
            path,
            _errno.ENODATA,
            f"the file ends at byte {ended_at:,}, bytes up to {wanted_to:,} were expected "
            "(truncated while being read)",
            "the segment is damaged or being replaced: run `strata fsck` on its store",
        )


def kind_of(st_mode: int) -> str:
    """What a file is, in words, from its ``st_mode`` (for messages and findings)."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(st_mode):
            return name
    return "a special file"


def refusal(op: str, path: str, st_mode: int) -> StrataIOError:
    """The error refusing ``op`` on ``path``, which is not what it must be (spec F-DIR-8):
    :class:`SymlinkRefused` for a symbolic link, else :class:`NotARegularFile` naming its kind."""
    if stat.S_ISLNK(st_mode):
        return SymlinkRefused(op, path)
    return NotARegularFile(op, path, kind_of(st_mode))
