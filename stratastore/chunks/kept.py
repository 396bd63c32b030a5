"""Records a chunk store keeps beside its pages: a small payload an adapter stores under a chunk
key given as ``keep`` at open (the LMCache plugin's chunk layout), written and read through the
store's levels as a page is, but never let go of.

- **Written once, durably**: :func:`put_record` stores the record on the first level as a put
  stores a page (room made for it, the level's durable protocol, spec F-DUR), unless some
  level holds it already (``"present"``: nothing written, nothing replaced). It is not a page:
  ``puts``, ``put_bytes`` and ``entries`` do not count it (the level's bytes do).
- **Never deleted by the store**: an eviction (budget or age, the last level's) passes over
  it (:class:`~stratastore.chunks.room.ChunkRoom`); the cascade may move it down a level as it
  moves the oldest page (a level with a next one holds nothing back: it would stop making
  room), so it is read from whichever level holds it. A read that fails counts nothing and removes
  nothing: a damaged record is the operator's to repair (``strata fsck --repair``), never
  replaced by this module. (A copy the cascade cannot read as it moves it is discarded, as any
  unreadable segment is: :meth:`~stratastore.levels.cascade.DiskLevel.degrade_to_next`.)
- **Read validated** (:func:`get_record`): from the first level holding a valid copy, every
  page hashed in this process's memory before the bytes are returned (F-SC-3), the sidecar
  checked above the seam (model, kind, key: F-READ-1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stratastore.chunks.keys import ChunkKeyError, stored_key
from stratastore.chunks.puts import PutOutcome
from stratastore.chunks.reads import buffer_view
from stratastore.chunks.room import stored_bytes
from stratastore.errors import StrataError
from stratastore.format import Kind
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.reader import get_checked_bytes
from stratastore.levels.sealing import Buffer

if TYPE_CHECKING:
    from stratastore.chunks.store import ChunkStore

__all__ = ["get_record", "put_record"]


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


def put_record(store: ChunkStore, key: bytes, data: Buffer) -> PutOutcome:
    """:meth:`ChunkStore.put_kept <stratastore.chunks.ChunkStore.put_kept>` (its docstring is
    the contract)."""
    from stratastore.chunks.store import refuse_closed

    skey = _kept_key(store, key)
    view = buffer_view(data, writable=False)
    if not view.nbytes:
        raise StoreError(f"an empty record cannot be kept ({store.config.name} {key.hex()})")
    refuse_closed(store, "put")
    if store.room.holds(skey):
        return "present"
    token = store.room.reserve(skey, stored_bytes(view.nbytes))
    if token is None:
        return "refused"
    try:
        done = store.levels[0].store.put_state(key, view, token_pos=0)
    finally:
        store.room.release(token)
    return "stored" if done.created else "present"


def get_record(store: ChunkStore, key: bytes, max_bytes: int) -> bytes | None:
    """:meth:`ChunkStore.get_kept <stratastore.chunks.ChunkStore.get_kept>` (its docstring is
    the contract)."""
    skey = _kept_key(store, key)
    if store.closed:
        return None
    failed: StrataError | None = None
    for lvl in store.levels:
        try:
            return get_checked_bytes(
                lvl.store,
                skey,
                store.fingerprint,
                max_bytes=max_bytes,
                kind=Kind.STATE,
                tokens=(0, 0),
            )
        except SegmentNotFound:
            continue  # not here, or moved down meanwhile: the next level may hold it
        except StrataError as e:
            failed = failed or e  # a later level may hold a valid copy
    if failed is not None:
        raise failed
    return None
