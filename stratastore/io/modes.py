"""The permission modes of store files and directories (spec F-DIR-9).

Store files are private by default: created with :data:`DEFAULT_FILE_MODE` (``0o600``; chain
manifests hold a conversation's token ids and segments its K/V), directories with
:func:`dir_mode` of the store's file mode (``0o700``), unless the configuration's ``file_mode``
says otherwise (e.g. ``0o640`` / ``0o750`` for a group). The process umask may remove bits,
never add them. A file repair rewrites keeps its mode; one it creates takes after its directory
(:func:`inherited_mode`). fsck warns when others can read a store (:func:`others_can_read`).

Pure functions of mode bits: reading a file's bits is :func:`stratastore.io.files.permissions`.
"""

from __future__ import annotations

import stat

__all__ = [
    "DEFAULT_FILE_MODE",
    "dir_mode",
    "file_mode_problem",
    "inherited_mode",
    "others_can_read",
]

#: the mode store files are created with unless the configuration says otherwise (spec F-DIR-9):
#: chain manifests hold a conversation's token ids and segments its K/V, so private by default
DEFAULT_FILE_MODE = 0o600


def dir_mode(file_mode: int) -> int:
    """The mode of a store directory for a store ``file_mode``: an x bit for each r bit
    (``0o600`` -> ``0o700``, ``0o640`` -> ``0o750``)."""
    return file_mode | ((file_mode & 0o444) >> 2)


def file_mode_problem(mode: object) -> str | None:
    """Why ``mode`` cannot be a store's ``file_mode``, or None: only permission bits (no
    setuid, setgid, sticky or x bits) and the owner must be able to read and write."""
    if isinstance(mode, bool) or not isinstance(mode, int):
        return f"{mode!r} is not an integer (write it in octal, e.g. 0o640)"
    if mode & ~0o666:
        return f"{mode:#o} has bits other than r/w permission bits (allowed: within 0o666)"
    if mode & 0o600 != 0o600:
        return f"{mode:#o} does not let the owner read and write (it needs 0o600)"
    return None


def others_can_read(mode: int) -> bool:
    """Whether permission bits ``mode`` let users outside the owner and group read (or, for a
    directory, enter) it (spec F-DIR-9: fsck warns)."""
    return bool(mode & (stat.S_IROTH | stat.S_IXOTH))


def inherited_mode(perms: int) -> int:
    """The file mode for a file created by a tool that has no configuration (repair), taking
    after an existing store directory or file with permission bits ``perms``: its r/w bits, the
    owner's always (a ``0o700`` directory gives ``0o600``, ``0o750`` gives ``0o640``), spec
    F-DIR-9."""
    return (perms & 0o666) | 0o600
