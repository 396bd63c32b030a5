"""Typed errors of the segment store."""

from __future__ import annotations

import errno

from stratastore.errors import StrataError
from stratastore.io.errors import StrataIOError

__all__ = ["DataMissing", "SegmentNotFound", "StoreError"]


class StoreError(StrataError):
    """A store directory cannot be used as asked (wrong filesystem, bad index, bad argument)."""


class SegmentNotFound(StoreError, KeyError):
    """No committed segment has that key in this directory."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DataMissing(StrataIOError):
    """A committed sidecar whose data file is gone (fsck's ``DATA_MISSING``): damage, not a
    read that may work later. A reader's miss; the level moves the sidecar into
    ``strata-quarantine/`` (as ``strata fsck --repair`` does) when a put, a move or a delete of
    its key finds it (spec F-DUR-7), so the next put writes the segment again. ``path`` is the
    data file."""

    def __init__(self, path: str) -> None:
        super().__init__(
            "open",
            path,
            errno.ENOENT,
            "its sidecar commits a data file that is gone (DATA_MISSING)",
            "the segment is lost: put it again, or run strata fsck --repair on the directory",
        )
