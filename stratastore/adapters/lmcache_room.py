"""Room in the LMCache plugin's chunk directory: the disk level's budget and oldest-first
eviction (:class:`~stratastore.tiers.disk.DiskLevel`, the policy every user of a segment store
shares), the puts in flight that reserved room, and the pins that exclude a deletion.

- **Budget**: before a put, :meth:`ChunkRoom.reserve` has the level make room
  (:meth:`DiskLevel.make_room <stratastore.tiers.disk.DiskLevel.make_room>`: its oldest
  entries, by seal time from the index's age table, let go of one at a time) until the chunk
  fits ``budget_bytes`` beside what the level counts: the store's bytes (data files and
  sidecars, spec F-IDX-1) plus the puts in flight not yet committed (:meth:`ChunkRoom.used`).
  The reservation holds until the put returned. A chunk larger than the whole budget, or one
  that cannot fit beside pinned chunks, is refused (logged; nothing reserved).
- **Pins and deletions** of one chunk exclude each other: a chunk chosen for deletion (an
  eviction, a removal, a damaged copy) is marked under the lock before it is deleted
  (:meth:`ChunkRoom.deleting`), and a pin of a marked chunk fails; an eviction passes over a
  pinned chunk and the layout record (the level then lets go of the next oldest).
- Several processes may share the directory: pins hold in the process that pinned, and each
  process reserves room only for its own puts in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from stratastore.levels.local import SegmentStore
from stratastore.tiers.disk import DiskLevel, LevelRefused

__all__ = ["ChunkRoom"]

log = logging.getLogger("stratastore.adapters.lmcache")


class ChunkRoom:
    """The budget, reservations and pins of the chunks in ``store``; thread-safe. ``keep``: the
    key no eviction takes (the layout record); ``count(name)``: adds one to a plugin counter
    (``evictions``, each chunk this process's eviction deleted)."""

    def __init__(
        self, store: SegmentStore, budget_bytes: int, *, keep: bytes, count: Callable[[str], None]
    ) -> None:
        self.store = store
        self.level = DiskLevel("LMCache chunk", store, budget_bytes)
        self.level.usage = self.used
        self.level.let_go = self._evict
        self._keep = keep
        self._count = count
        self._lock = threading.Lock()  #: pins, marks, reservations (never held over I/O)
        self._room = threading.Lock()  #: one put at a time makes room
        self._pins: dict[bytes, int] = {}
        self._doomed: dict[bytes, int] = {}  #: chunks being deleted: a pin of one fails
        #: the puts in flight that made room: (chunk key, stored bytes) by put
        self._reserved: dict[object, tuple[bytes, int]] = {}

    @property
    def budget_bytes(self) -> int:
        return self.level.budget

    # -- the budget ---------------------------------------------------------------------------
    def used(self) -> int:
        """What the level's budget counts: the store's bytes and the puts in flight not yet
        counted in them."""
        return sum(self._committed_and_in_flight())

    def _committed_and_in_flight(self) -> tuple[int, int]:
        """The store's bytes and the bytes of the puts in flight not yet counted in them: a put
        whose chunk is indexed already (committed, its reservation not yet dropped) counts
        once. The index is read between two looks at which reserved chunks are indexed, and
        again when a commit came in between, so no put counts twice or not at all."""
        while True:
            with self._lock:
                reserved = list(self._reserved.values())
            before = [self.store.contains(k) for k, _ in reserved]
            used = self.store.used()
            after = [self.store.contains(k) for k, _ in reserved]
            if before == after:
                in_flight = (
                    n for (_, n), indexed in zip(reserved, after, strict=True) if not indexed
                )
                return used, sum(in_flight)

    def reserve(self, key: bytes, size: int) -> object | None:
        """Make room for ``size`` more bytes (the oldest unpinned chunks evicted) and reserve
        them for the put of ``key``: the reservation's token, to :meth:`release` once the put
        returned; None (nothing reserved, logged) when the chunk cannot fit."""
        with self._room:
            try:
                self.level.make_room(size)
            except LevelRefused:
                if size > self.budget_bytes:
                    log.warning(
                        "stratastore: a chunk of %d bytes is larger than the whole "
                        "budget of %s (%d bytes); raise budget_mib",
                        size,
                        self.store.path,
                        self.budget_bytes,
                    )
                else:
                    used, in_flight = self._committed_and_in_flight()
                    log.warning(
                        "stratastore: %s is full (%d of %d bytes, %d in flight) and "
                        "holds only pinned chunks: a chunk was not stored",
                        self.store.path,
                        used,
                        self.budget_bytes,
                        in_flight,
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

    def _evict(self, key: bytes) -> bool | None:
        """The level letting go of its oldest entry ``key``: None (passed over) for the layout
        record or a pinned chunk; else deleted, marked meanwhile so that a pin of it fails.
        True when this delete removed it (counted), False when another process had."""
        if key == self._keep:
            return None
        with self.deleting(key, unless_pinned=True) as marked:
            if not marked:
                return None
            deleted = self.store.delete(key)
        if deleted:
            self._count("evictions")
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
        """Pin the stored chunk ``key``: True when it is stored and now pinned (no eviction or
        removal without force deletes it until unpinned); False when it is not stored or is
        being deleted."""
        with self._lock:
            if key in self._doomed:
                return False
            self._pins[key] = self._pins.get(key, 0) + 1
        if self.store.contains(key):
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
        """How many chunks are pinned."""
        with self._lock:
            return len(self._pins)
