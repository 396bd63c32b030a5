"""Putting pages into a chunk store: room made for each page, the pages committed together on
the first level (a directory: each page's files written and fsynced, then one group commit,
spec F-DUR-2). :meth:`ChunkStore.put_many <stratastore.chunks.ChunkStore.put_many>` is the
contract; ``put`` and ``batch_put`` are built on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from stratastore.chunks.keys import stored_key
from stratastore.chunks.reads import buffer_view
from stratastore.chunks.room import stored_bytes
from stratastore.errors import StrataError
from stratastore.levels.backend import PutResult, SegmentBackend
from stratastore.levels.common import SealedLevel
from stratastore.levels.errors import StoreError
from stratastore.levels.sealing import Buffer

if TYPE_CHECKING:
    from stratastore.chunks.store import ChunkStore

__all__ = ["BatchMismatch", "PutOutcome", "put_pages"]

PutOutcome = Literal["stored", "present", "refused"]


class BatchMismatch(StoreError, ValueError):
    """A batch call given as many keys as pages (or buffers) it is not: nothing is done."""


def check_batch(keys: Sequence[bytes], items: Sequence[object], what: str) -> None:
    """:class:`BatchMismatch` unless ``keys`` and ``items`` (pages or buffers) pair up."""
    if len(keys) != len(items):
        raise BatchMismatch(
            f"{len(keys)} keys for {len(items)} {what}: give one {what[:-1]} for each key"
        )


def put_pages(
    store: ChunkStore, keys: Sequence[bytes], pages: Sequence[Buffer]
) -> list[PutOutcome | StrataError]:
    """:meth:`ChunkStore.put_many <stratastore.chunks.ChunkStore.put_many>` (its docstring is
    the contract)."""
    from stratastore.chunks.store import refuse_closed

    check_batch(keys, pages, "pages")
    skeys = [stored_key(k) for k in keys]
    views = [buffer_view(p, writable=False) for p in pages]
    for k, v in zip(keys, views, strict=True):
        if not v.nbytes:
            raise StoreError(f"an empty page cannot be stored ({store.config.name} {k.hex()})")
    refuse_closed(store, "put")
    out: list[PutOutcome | StrataError | None] = [None] * len(keys)
    first: dict[bytes, int] = {}  #: stored key -> the page of the batch that puts it
    batch: dict[int, object] = {}  #: page -> its reservation, pages not yet committed
    try:
        for i, (skey, view) in enumerate(zip(skeys, views, strict=True)):
            if skey in first:
                continue  # the same key twice: as its first put goes (below)
            if store.failures.holds_whole(skey):  # before making room: it evicts nothing
                store.count("puts_deduped")
                out[i] = "present"
                continue
            token = store.room.reserve(skey, stored_bytes(view.nbytes))
            if token is None and batch:  # the batch's own pages fill the room: commit them
                _commit(store, keys, views, batch, out)
                token = store.room.reserve(skey, stored_bytes(view.nbytes))
            if token is None:
                store.count("puts_refused")
                out[i] = "refused"
                continue
            first[skey] = i
            batch[i] = token
        _commit(store, keys, views, batch, out)
    finally:
        for token in batch.values():
            store.room.release(token)
    for i, skey in enumerate(skeys):
        j = first.get(skey, i)
        if out[i] is None and j != i:
            store.count("puts_deduped")
            out[i] = "present" if out[j] == "stored" else out[j]
    if any(r is None for r in out):
        raise StoreError(f"{out.count(None)} of {len(out)} pages were not answered")
    return [r for r in out if r is not None]


def _commit(
    store: ChunkStore,
    keys: Sequence[bytes],
    views: Sequence[memoryview],
    batch: dict[int, object],
    out: list[PutOutcome | StrataError | None],
) -> None:
    """Put the pages of ``batch`` (page -> reservation) on the first level together, their
    outcomes into ``out``; the reservations are released and ``batch`` emptied."""
    todo = list(batch)
    try:
        done = _put_states(store.levels[0].store, [(keys[i], views[i]) for i in todo])
    finally:
        for token in batch.values():
            store.room.release(token)
        batch.clear()
    for i, res in zip(todo, done, strict=True):
        if isinstance(res, StrataError):
            out[i] = res
        elif res.created:
            store.count("puts")
            store.count("put_bytes", views[i].nbytes)
            out[i] = "stored"
        else:
            store.count("puts_deduped")
            out[i] = "present"


def _put_states(
    level: SegmentBackend, items: Sequence[tuple[bytes, memoryview]]
) -> list[PutResult | StrataError]:
    """The running-state puts of ``items`` on ``level``: several committed together where it
    can (a :class:`~stratastore.levels.common.SealedLevel`: a directory's group commit), one
    through the level's ``put_state`` (which joins the same group commit); a backend registered
    from outside gets them one at a time."""
    if isinstance(level, SealedLevel) and len(items) > 1:
        return level.put_states(items, token_pos=0)
    out: list[PutResult | StrataError] = []
    for key, view in items:
        try:
            out.append(level.put_state(key, view, token_pos=0))
        except StrataError as e:
            out.append(e)
    return out
