"""Moving a committed segment between two directory stores, all or nothing (spec F-DUR-8).

:func:`relocate` is ``SegmentStore.relocate_from``: it takes both write locks (the source's, then
this one's: callers keep that order) and makes the data file here by hard link on one volume or
durable copy across two, writes this level's own sidecar (its level, a new ``sealed_at``),
indexes it, and only then deletes the segment from the source. Any failure undoes what was done
here and leaves the segment whole in the source. A source of another kind goes through
:func:`~stratastore.levels.relocation.relocate_by_copy`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratastore.errors import StrataError
from stratastore.format import DATA_OFFSET, IndexRecord, encode_sidecar
from stratastore.io import durable_write, guard
from stratastore.io.relocate import link_or_copy
from stratastore.levels.relocation import Relocated, relocate_by_copy, resealed

if TYPE_CHECKING:
    from stratastore.levels.backend import SegmentBackend
    from stratastore.levels.local.segment_store import SegmentStore

__all__ = ["relocate"]


def relocate(dst: SegmentStore, src: SegmentBackend, key: bytes) -> Relocated:
    """``dst.relocate_from(src, key)``; see the module docstring."""
    from stratastore.levels.local.segment_store import SegmentStore  # it imports this module

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
