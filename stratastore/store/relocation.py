"""Moving a committed segment from one level to another, all or nothing (spec F-DUR-8).

:func:`relocate` is ``SegmentStore.relocate_from``: between two directory stores it takes both
write locks (the source's, then this one's: callers keep that order) and makes the data file here
by hard link on one volume or durable copy across two, writes this level's own sidecar (its
level, a new ``sealed_at``), indexes it, and only then deletes the segment from the source. Any
failure undoes what was done here and leaves the segment whole in the source.

:func:`relocate_by_copy` is the generic path any backend can use for any source (it needs only
the :class:`~stratastore.levels.backend.SegmentBackend` protocol): read the stored payload,
validate it (``put_sealed`` checks every page), put it, then delete it from the source; if that
delete fails and the source still holds the segment, the copy here is deleted again.

Races (issue 12 item 4): a source that no longer holds the key (another process moved it down
or deleted it) raises :class:`~stratastore.store.errors.SegmentNotFound`, never another error;
a key this level already holds returns ``"present"`` after the source's copy is dropped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Literal

from ..errors import StrataError
from ..format import DATA_OFFSET, IndexRecord, Level, Sidecar, encode_sidecar
from ..io import durable_write, guard
from ..io.relocate import link_or_copy

if TYPE_CHECKING:
    from ..levels.backend import SegmentBackend
    from .segment_store import SegmentStore

__all__ = ["relocate", "relocate_by_copy", "resealed"]

Relocated = Literal["link", "copy", "present"]


def resealed(sc: Sidecar, level: Level) -> Sidecar:
    """``sc`` as the level ``level`` commits it: its own level, sealed now (F-DUR-8)."""
    return dataclasses.replace(sc, level=level, sealed_at_ns=time.time_ns())


def relocate(dst: SegmentStore, src: SegmentBackend, key: bytes) -> Relocated:
    """``dst.relocate_from(src, key)``; see the module docstring."""
    from .segment_store import SegmentStore  # the module imports this one

    dst.fingerprint.require_same(src.fingerprint, f"segment {key.hex()} of {src.path}")
    if not isinstance(src, SegmentStore):
        return relocate_by_copy(dst, src, key)
    with src._write_lock(), dst._write_lock():
        sc, _ = src._inspect(key)  # SegmentNotFound when src lost it meanwhile
        if dst._committed(key):
            src._delete_locked(key)
            return "present"
        mine = resealed(sc, dst.level)
        side = encode_sidecar(mine)
        guard.remove_store_file(dst._data_path(key), missing_ok=True)  # a crashed move's
        try:
            how = link_or_copy(src._data_path(key), dst._data_path(key))
            durable_write(dst._sidecar_path(key), side, mode=dst.file_mode)
            size = DATA_OFFSET + sc.stored_bytes
            dst._index.put(key, IndexRecord.from_sidecar(mine, len(side), size))
        except BaseException:
            dst._roll_back(key)
            raise
        try:
            src._delete_locked(key)
        except StrataError:
            if src._committed(key):  # still whole there: undo the copy here instead
                dst._roll_back(key)
                src._reindex(key)
                raise
            # its sidecar is gone, so the segment lives here alone; a leftover data file in
            # src is an orphan (invisible; fsck reports it)
    return how


def relocate_by_copy(dst: SegmentBackend, src: SegmentBackend, key: bytes) -> Relocated:
    """Move ``key`` from ``src`` into ``dst`` through the protocol alone: read the stored
    payload, put it (``put_sealed`` validates every page), delete it from ``src``. Returns
    ``"copy"``, or ``"present"`` when ``dst`` held it already. ``SegmentNotFound`` when
    ``src`` does not hold it; a failure before the delete leaves ``src`` as it was."""
    dst.fingerprint.require_same(src.fingerprint, f"segment {key.hex()} of {src.path}")
    with src.open_reader(key) as seg:  # SegmentNotFound when src lost it meanwhile
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
