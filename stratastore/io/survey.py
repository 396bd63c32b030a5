"""A survey of a directory as it is now, for the monitor: the names in it and, for each, whether
it is a regular file, its size and modification time.

Unlike :mod:`stratastore.io.files`' primitives these look-ups bypass the fault seam and never
raise for a name that vanished meanwhile (another process deletes and renames as we look):
they report what they saw. Nothing is ever followed (``lstat``, spec F-DIR-8).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

__all__ = ["RegularFile", "error_text", "names_in", "regular_file"]


@dataclass(frozen=True, slots=True)
class RegularFile:
    size: int
    mtime: float  #: seconds since the epoch


def names_in(directory: str) -> list[str]:
    """The names in ``directory`` (``os.listdir``: an :class:`OSError` when it cannot be read)."""
    return os.listdir(directory)


def regular_file(path: str) -> RegularFile | None:
    """``path``'s size and mtime when it is a regular file (``lstat``: a link is not one); None
    when it is something else or no longer there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return RegularFile(st.st_size, st.st_mtime) if stat.S_ISREG(st.st_mode) else None


def error_text(err: int) -> str:
    """The system's words for errno ``err``."""
    return os.strerror(err)
