"""Records a chunk store keeps beside its pages: a small payload an adapter stores under a chunk
key given as ``keep`` at open (the LMCache plugin's chunk layout), written and read through the
store's levels as a page is, but never let go of.

- **Written once, durably, on every level, the last first**: :func:`put_record` stores the
  record on each level with the level's durable protocol (spec F-DUR), from the last level up
  to the first (room made for it there as for a page). A level that holds the record already
  is left as it is; where it holds another one (a store of another configuration recorded it
  first on a level both share, the last as a rule), nothing more is written (``"present"``)
  and :func:`get_record` tells the two apart. So two stores whose first levels are their own
  and whose last level is shared agree on one record: the first to reach the shared level.
  It is not a page: ``puts``, ``put_bytes`` and ``entries`` do not count it (the levels' bytes
  do), and only the first level's room is reserved for it.
- **Never deleted by the store**: an eviction (budget or age, the last level's) passes over
  it (:class:`~stratastore.chunks.room.ChunkRoom`), and ``remove`` refuses it; the cascade may
  move a copy down a level as it moves the oldest page (a copy already there stays, the
  moved one goes). A read that fails counts nothing and removes nothing: a damaged record is
  the operator's to repair (``strata fsck --repair``), never replaced by this module. (A copy
  the cascade cannot read as it moves it is discarded, as any unreadable segment is:
  :meth:`~stratastore.levels.cascade.DiskLevel.degrade_to_next`.)
- **Read validated, every copy** (:func:`get_record`): each level's copy, every page hashed in
  this process's memory before the bytes are compared or returned (F-SC-3), the sidecar
  checked above the seam (model, kind, key: F-READ-1). Copies that differ are a
  :class:`KeptRecordConflict`: the levels hold the records of two configurations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratastore.chunks.keys import ChunkKeyError, stored_key
from stratastore.chunks.puts import PutOutcome
from stratastore.chunks.reads import buffer_view
from stratastore.chunks.room import stored_bytes
from stratastore.errors import ConfigError, StrataError
from stratastore.format import Kind
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.reader import get_checked_bytes
from stratastore.levels.sealing import Buffer

if TYPE_CHECKING:
    from stratastore.chunks.store import ChunkStore

__all__ = ["KeptRecordConflict", "get_record", "put_record"]

#: the most bytes of another store's record read to compare it with the one being put
_COMPARE_BYTES = 1 << 20


class KeptRecordConflict(ConfigError):
    """Two levels of a chunk store keep different records under one kept key: stores of two
    configurations share a level (``levels``: the levels, first to last, that hold each)."""

    def __init__(self, what: str, holders: list[tuple[str, str]]) -> None:
        self.holders = holders
        shown = "; ".join(f"{level}: {body}" for level, body in holders)
        super().__init__(
            f"the levels hold different records of {what} ({shown}): stores of two "
            "configurations share a level; give each configuration levels of its own, or run "
            "every store that shares a level with one configuration"
        )


def _kept_key(store: ChunkStore, key: bytes) -> bytes:
    """The stored key of the kept record ``key``; a :class:`ChunkKeyError` naming the fix when
    ``store`` does not keep it (a page's key would be a record its eviction may take)."""
    skey = stored_key(key)
    if skey not in store.kept:
        raise ChunkKeyError(
            f"chunk key {key.hex()[:16]} is not kept by the {store.config.name} store: give it "
            "in keep= at ChunkStore.open, or put it as a page (put)"
        )
    return skey


def _read(store: ChunkStore, backend: SegmentBackend, skey: bytes, max_bytes: int) -> bytes:
    return get_checked_bytes(
        backend, skey, store.fingerprint, max_bytes=max_bytes, kind=Kind.STATE, tokens=(0, 0)
    )


def put_record(store: ChunkStore, key: bytes, data: Buffer) -> PutOutcome:
    """:meth:`ChunkStore.put_kept <stratastore.chunks.ChunkStore.put_kept>` (its docstring is
    the contract)."""
    from stratastore.chunks.store import refuse_closed

    skey = _kept_key(store, key)
    view = buffer_view(data, writable=False)
    if not view.nbytes:
        raise StoreError(f"an empty record cannot be kept ({store.config.name} {key.hex()})")
    refuse_closed(store, "put")
    body, wrote = bytes(view), False
    for i in reversed(range(len(store.levels))):
        backend = store.levels[i].store
        if skey in backend:
            try:
                held = _read(store, backend, skey, _COMPARE_BYTES)
            except StrataError:  # unreadable here (damaged: the operator's): left as it is
                continue
            if held != body:  # another configuration's record: nothing written above it
                return "present"
            continue
        token = store.room.reserve(skey, stored_bytes(len(body))) if i == 0 else None
        if i == 0 and token is None:
            return "stored" if wrote else "refused"
        try:
            done = backend.put_state(key, view, token_pos=0)
        finally:
            if token is not None:
                store.room.release(token)
        if not done.created and _read(store, backend, skey, _COMPARE_BYTES) != body:
            return "present"  # another store recorded first, meanwhile
        wrote = wrote or done.created
    return "stored" if wrote else "present"


def get_record(store: ChunkStore, key: bytes, max_bytes: int) -> bytes | None:
    """:meth:`ChunkStore.get_kept <stratastore.chunks.ChunkStore.get_kept>` (its docstring is
    the contract)."""
    skey = _kept_key(store, key)
    if store.closed:
        return None
    failed: StrataError | None = None
    found: list[tuple[str, bytes]] = []
    for lvl, shown in zip(store.levels, store.config.levels, strict=True):
        try:
            found.append((shown.shown, _read(store, lvl.store, skey, max_bytes)))
        except SegmentNotFound:
            continue  # not here, or moved down meanwhile: the next level may hold it
        except StrataError as e:
            failed = failed or e  # another level may hold a valid copy
    if len({body for _, body in found}) > 1:
        raise KeptRecordConflict(
            f"chunk key {key.hex()[:16]}",
            [(level, body[:200].decode("utf-8", "replace")) for level, body in found],
        )
    if found:
        return found[0][1]
    if failed is not None:
        raise failed
    return None
