"""Room in a chunk store: its levels' budgets and the cascade
(:class:`~stratastore.levels.cascade.DiskLevel`, the policy every user of the levels shares), the
puts in flight that reserved room, and the pins that exclude a deletion.

- **Budget and cascade**: before a put, :meth:`ChunkRoom.reserve` has the first level make room
  (:meth:`DiskLevel.make_room <stratastore.levels.cascade.DiskLevel.make_room>`) until the page
  fits its budget beside what it counts: the level's bytes (stored data and sidecars, spec
  F-IDX-1) plus the puts in flight not yet committed (:meth:`ChunkRoom.used`). A level with a
  next one *degrades* its oldest page into it (the next makes room the same way, then takes it
  all or nothing, F-DUR-8); only the last level deletes, its oldest page not pinned first. The
  reservation holds until the put returned. A page larger than the first level's budget, or
  one that cannot fit beside pinned pages, is refused (logged; nothing reserved).
- **Pins and deletions** of one page exclude each other: a page chosen for deletion (an
  eviction, a removal, a damaged copy) is marked under the lock before it is deleted
  (:meth:`ChunkRoom.deleting`), and a pin of a marked page fails; an eviction passes over a
  pinned page and the keys the store keeps (the next oldest goes instead). A pinned page may
  still be degraded: it moves to the next level, it is not lost.
- Several processes may share a level: pins hold in the process that pinned, and each process
  reserves room only for its own puts in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

from stratastore.format import DATA_OFFSET
from stratastore.format.sidecar import SIDECAR_HEAD, TRAILER_BYTES
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.cascade import DiskLevel, LevelRefused
from stratastore.levels.sealing import STATE_PAGE_BYTES

__all__ = ["ChunkRoom", "stored_bytes"]

log = logging.getLogger("stratastore.chunks")

_DIGEST_BYTES = 32  #: one BLAKE3-256 digest a page in the sidecar (F-SC-3)


def stored_bytes(payload_bytes: int) -> int:
    """What a page of ``payload_bytes`` adds to a directory level's ``used()``: its data file
    (F-SEG-1: the header block, then the pages) and its sidecar (F-SC-1: the head, one digest a
    page of :data:`~stratastore.levels.sealing.STATE_PAGE_BYTES`, the trailer). Levels that keep
    no data file header (``memory://``, Redis) count less: this is what a put reserves, an
    upper bound there and exact on a directory."""
    pages = -(-payload_bytes // STATE_PAGE_BYTES)
    return DATA_OFFSET + payload_bytes + SIDECAR_HEAD.size + _DIGEST_BYTES * pages + TRAILER_BYTES


def _held(store: SegmentBackend, keys: Sequence[bytes]) -> list[bool]:
    """Whether ``store`` holds each of ``keys``: one call where the level answers many at once
    (a directory's index, a shared level), else one look-up each."""
    many = getattr(store, "contains_many", None)
    if many is not None and keys:
        return list(many(keys))
    return [k in store for k in keys]


class ChunkRoom:
    """The budgets, reservations and pins of a chunk store's ``levels`` (first to last, each
    linked to the next); thread-safe. ``keep``: keys no eviction takes; ``count(name)``: adds
    one to a store counter (``evictions``: each page this process's eviction deleted)."""

    def __init__(
        self,
        levels: Sequence[DiskLevel],
        *,
        keep: frozenset[bytes],
        count: Callable[[str], None],
    ) -> None:
        self.levels = tuple(levels)
        self.level = self.levels[0]  #: where pages are put
        self.level.usage = self.used
        for lvl in self.levels:
            lvl.let_go = partial(self._evict, lvl)
        self._keep = keep
        self._count = count
        self._lock = threading.Lock()  #: pins, marks, reservations (never held over I/O)
        self._room = threading.Lock()  #: one put (or GC) at a time makes room
        self._pins: dict[bytes, int] = {}
        self._doomed: dict[bytes, int] = {}  #: keys being deleted: a pin of one fails
        #: the puts in flight that made room: (stored key, bytes) by put
        self._reserved: dict[object, tuple[bytes, int]] = {}
        #: called with the stored key of each page this process's eviction deletes from the
        #: last level, on the thread that made room, after the delete (the vLLM tier's
        #: ``BlockRemoved`` events); quick, and never calling back into the store
        self.on_evicted: Callable[[bytes], None] | None = None

    @property
    def budget_bytes(self) -> int:
        """The first level's budget (where pages are put)."""
        return self.level.budget

    def holds(self, key: bytes) -> bool:
        """Whether some level holds the stored key ``key`` (its index or listing)."""
        return any(key in lvl.store for lvl in self.levels)

    # -- the budget ---------------------------------------------------------------------------
    def used(self) -> int:
        """What the first level's budget counts: its bytes and the puts in flight not yet
        counted in them."""
        return sum(self._committed_and_in_flight())

    def _committed_and_in_flight(self) -> tuple[int, int]:
        """The first level's bytes and the bytes of the puts in flight not yet counted in them:
        a put whose page is held already (committed, its reservation not yet dropped) counts
        once. The level is read between two looks at which reserved pages it holds, and again
        when a commit came in between, so no put counts twice or not at all."""
        store = self.level.store
        while True:
            with self._lock:
                reserved = list(self._reserved.values())
            keys = [k for k, _ in reserved]
            before = _held(store, keys)
            used = store.used()
            after = _held(store, keys)
            if before == after:
                in_flight = (
                    n for (_, n), indexed in zip(reserved, after, strict=True) if not indexed
                )
                return used, sum(in_flight)

    def reserve(self, key: bytes, size: int) -> object | None:
        """Make room for ``size`` more bytes in the first level (its oldest pages degraded,
        the last level's oldest unpinned deleted) and reserve them for the put of ``key``: the
        reservation's token, to :meth:`release` once the put returned; None (nothing reserved,
        logged) when the page cannot fit."""
        with self._room:
            try:
                self.level.make_room(size)
            except LevelRefused as e:
                if size > self.budget_bytes:
                    log.warning(
                        "stratastore: a page of %d bytes is larger than the whole budget of "
                        "%s (%d bytes); raise its budget",
                        size,
                        self.level.store.path,
                        self.budget_bytes,
                    )
                else:
                    used, in_flight = self._committed_and_in_flight()
                    log.warning(
                        "stratastore: %s is full (%d of %d bytes, %d in flight) and holds only "
                        "pages it may not let go of (pinned, or refused below: %s): a page was "
                        "not stored",
                        self.level.store.path,
                        used,
                        self.budget_bytes,
                        in_flight,
                        e,
                    )
                return None
            token = object()
            with self._lock:
                self._reserved[token] = (key, size)
            return token

    def release(self, token: object) -> None:
        """Drop a reservation (its put committed, or failed)."""
        with self._lock:
            del self._reserved[token]

    def in_flight_bytes(self) -> int:
        with self._lock:
            return sum(n for _, n in self._reserved.values())

    def collect(self) -> None:
        """GC, first level to last: pages past their level's age limit go down (the last
        level's are deleted, pinned ones aside), then each level is brought within its budget
        (as far as what it may let go of allows)."""
        with self._room:
            for lvl in self.levels:
                lvl.enforce_age()
                lvl.enforce_budget()

    def _evict(self, level: DiskLevel, key: bytes) -> bool | None:
        """The last level letting go of its oldest entry ``key``: None (passed over) for a kept
        key or a pinned page; else deleted, marked meanwhile so that a pin of it fails. True
        when this delete removed it (counted), False when another process had."""
        if key in self._keep:
            return None
        with self.deleting(key, unless_pinned=True) as marked:
            if not marked:
                return None
            deleted = level.store.delete(key)
        if deleted:
            self._count("evictions")
            if self.on_evicted is not None:
                self.on_evicted(key)
        return deleted

    # -- pins ---------------------------------------------------------------------------------
    @contextmanager
    def deleting(self, key: bytes, *, unless_pinned: bool) -> Iterator[bool]:
        """Mark ``key`` as being deleted for the block (a pin of it fails meanwhile); yields
        False (nothing marked: leave it) when ``unless_pinned`` and it is pinned."""
        with self._lock:
            marked = not (unless_pinned and self._pins.get(key, 0) > 0)
            if marked:
                self._doomed[key] = self._doomed.get(key, 0) + 1
        try:
            yield marked
        finally:
            if marked:
                with self._lock:
                    n = self._doomed.pop(key, 0)
                    if n > 1:
                        self._doomed[key] = n - 1

    def pin(self, key: bytes) -> bool:
        """Pin the page ``key``: True when it is held and now pinned (no eviction or removal
        without force deletes it until unpinned); False when it is not held or is being
        deleted."""
        with self._lock:
            if key in self._doomed:
                return False
            self._pins[key] = self._pins.get(key, 0) + 1
        if self.holds(key):
            return True
        self.unpin(key)
        return False

    def unpin(self, key: bytes) -> int:
        """Drop one pin of ``key``; how many it had."""
        with self._lock:
            n = self._pins.get(key, 0)
            if n > 1:
                self._pins[key] = n - 1
            else:
                self._pins.pop(key, None)
        return n

    def drop_pins(self, key: bytes) -> None:
        """Forget every pin of ``key`` (it was removed)."""
        with self._lock:
            self._pins.pop(key, None)

    def pinned(self, key: bytes) -> bool:
        with self._lock:
            return self._pins.get(key, 0) > 0

    def pinned_count(self) -> int:
        """How many pages are pinned."""
        with self._lock:
            return len(self._pins)
