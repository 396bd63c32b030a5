"""Typed errors of the io layer."""

from __future__ import annotations

import errno as _errno
import os

from ..errors import StrataError

__all__ = ["StrataIOError"]

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

    def __init__(self, op: str, path: str, err: int, detail: str = "") -> None:
        self.op = op
        self.path = path
        self.errno = err
        fix = _FIX.get(err, "check the path and the volume")
        why = detail or os.strerror(err)
        super().__init__(f"{op} {path}: {why} (errno {err}); {fix}")
