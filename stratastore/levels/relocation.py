"""Moving a committed segment from one level to another through the protocol alone (spec F-DUR-8).

:func:`relocate_by_copy` is the generic path any backend can use for any source (it needs only
the :class:`~stratastore.levels.backend.SegmentBackend` protocol): read the stored payload,
validate it (``put_sealed`` checks every page), put it, then delete it from the source; if that
delete fails and the source still holds the segment, the copy here is deleted again. Two
directory stores move a segment by link or copy of its file instead
(:meth:`stratastore.levels.local.SegmentStore.relocate_from`).

Races: a source that no longer holds the key (another process moved it down or deleted it)
raises :class:`~stratastore.levels.errors.SegmentNotFound`, never another error; a key this
level already holds returns ``"present"`` after the source's copy is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Literal

from stratastore.errors import StrataError
from stratastore.format import Level, Sidecar
from stratastore.levels.reader import open_checked

if TYPE_CHECKING:
    from stratastore.levels.backend import SegmentBackend

__all__ = ["Relocated", "relocate_by_copy", "resealed"]

Relocated = Literal["link", "copy", "present"]


def resealed(sc: Sidecar, level: Level) -> Sidecar:
    """``sc`` as the level ``level`` commits it: its own level, sealed now (F-DUR-8)."""
    return dataclasses.replace(sc, level=level, sealed_at_ns=time.time_ns())


def relocate_by_copy(dst: SegmentBackend, src: SegmentBackend, key: bytes) -> Relocated:
    """Move ``key`` from ``src`` into ``dst`` through the protocol alone: read the stored
    payload, put it (``put_sealed`` validates every page), delete it from ``src``. Returns
    ``"copy"``, or ``"present"`` when ``dst`` held it already. ``SegmentNotFound`` when
    ``src`` does not hold it; a failure before the delete leaves ``src`` as it was."""
    dst.fingerprint.require_same(src.fingerprint, f"segment {key.hex()} of {src.path}")
    # SegmentNotFound when src lost it meanwhile; a FormatError when it answers with another
    # segment (checked above the seam: what is moved is the segment asked for)
    with open_checked(src, key, dst.fingerprint) as seg:
        sc = seg.sidecar
        if key in dst:
            src.delete(key)
            return "present"
        stored = seg.stored()
    dst.put_sealed(sc, stored)
    try:
        src.delete(key)
    except StrataError:
        if key in src:  # still whole there: drop the copy here instead
            dst.delete(key)
            raise
    return "copy"
