"""Disk levels and the cascade: warm -> cold, degrade instead of delete (seed 000).

A level is a :class:`SegmentStore` with a byte budget, an optional age limit and a next level.
When a level's GC runs (:meth:`DiskLevel.enforce_budget`, :meth:`DiskLevel.enforce_age`) and a
next level is set, its oldest entry is *degraded*: handed to the next level
(:meth:`degrade_to_next` -> :meth:`adopt`), which makes room for it, writes its own sidecar
(its level, a re-sealed age) and takes the data file by hard link on one volume or a durable copy
across two; only then does this level drop its copy. All or nothing: if the next level refuses
(budget with ``when_full=reject``, an image larger than its whole budget, an I/O error), nothing
moves and the entry stays. Only the last level deletes: FIFO by budget, and by age when asked.
A degradation is not an eviction: ``disk_evictions`` and ``age_evictions`` do not move. The
correctness paths still discard: an unreadable image is deleted, not degraded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

from ..errors import StrataError
from ..format import ChecksumMismatch, FormatError
from ..io.errors import NotARegularFile, SymlinkRefused
from ..store import SegmentStore

__all__ = ["DiskLevel", "LevelCounters", "LevelRefused"]


class LevelRefused(StrataError):
    """A level cannot take an entry (full with when_full=reject, or larger than its budget)."""


@dataclass
class LevelCounters:
    disk_evictions: int = 0  #: deleted by budget (last level only)
    age_evictions: int = 0  #: deleted by age (last level only)
    degradations: int = 0  #: handed to the next level
    adopted: int = 0  #: taken from the level above
    refusals: int = 0  #: entries the next level refused (they stayed here)
    discards: int = 0  #: unreadable images deleted on the way
    hits: int = 0  #: restores served from this level

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class DiskLevel:
    def __init__(
        self,
        name: str,
        store: SegmentStore,
        budget_bytes: int,
        *,
        max_age_s: int = 0,
        when_full: Literal["evict", "reject"] = "evict",
        next_level: DiskLevel | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.name = name
        self.store = store
        self.budget = budget_bytes
        self.max_age_ns = max_age_s * 1_000_000_000
        self.when_full = when_full
        self.next = next_level
        self.clock = clock
        self.counters = LevelCounters()
        self.last_refusal = ""
        #: keys capacity GC must not remove (saved sessions, spec F-CHAIN-5)
        self.pinned: Callable[[], set[bytes]] = set

    @property
    def is_last(self) -> bool:
        return self.next is None

    def used(self) -> int:
        return self.store.stats().disk_bytes

    def oldest_first(self) -> list[tuple[int, bytes, int]]:
        """``(sealed_at_ns, key, bytes)`` of every entry capacity GC may move or delete, oldest
        first (FIFO order); pinned keys are left out."""
        pinned = self.pinned()
        rows = [(rec.sealed_at_ns, key, rec.total_bytes) for key, rec in self.store.records()
                if key not in pinned]  # fmt: skip
        return sorted(rows)

    # -- making room --------------------------------------------------------------------------
    def make_room(self, size: int) -> None:
        """Free space for ``size`` more bytes: the last level deletes its oldest (unless
        ``when_full=reject``); a level with a next one degrades its oldest. Raises
        :class:`LevelRefused` when it cannot."""
        if size > self.budget:
            raise LevelRefused(
                f"{self.name} level: an entry of {size:,} bytes is larger than its whole budget "
                f"({self.budget:,} bytes); raise the level's budget"
            )
        while self.used() + size > self.budget:
            if self.is_last and self.when_full == "reject":
                raise LevelRefused(
                    f"{self.name} level is full ({self.used():,} of {self.budget:,} bytes) and "
                    "when_full=reject; raise its budget or set when_full=evict"
                )
            oldest = self.oldest_first()
            if not oldest:
                raise LevelRefused(f"{self.name} level cannot free {size:,} bytes")
            key = oldest[0][1]
            if self.is_last:
                self.store.delete(key)
                self.counters.disk_evictions += 1
            elif not self.degrade_to_next(key):
                raise LevelRefused(
                    f"{self.name} level is full and its next level refused its oldest entry: "
                    f"{self.last_refusal}"
                )

    def enforce_budget(self) -> None:
        """Bring the level within its budget (degrading, or deleting on the last level); an entry
        the next level refuses stays, and the pass stops there."""
        while self.used() > self.budget:
            oldest = self.oldest_first()
            if not oldest:
                return
            key = oldest[0][1]
            if self.is_last:
                self.store.delete(key)
                self.counters.disk_evictions += 1
            elif not self.degrade_to_next(key):
                return

    def enforce_age(self) -> None:
        """Entries sealed more than ``max_age_s`` ago go to the next level (or are deleted)."""
        if not self.max_age_ns:
            return
        limit = self.clock() - self.max_age_ns
        for sealed, key, _ in self.oldest_first():
            if sealed > limit:
                return
            if self.is_last:
                self.store.delete(key)
                self.counters.age_evictions += 1
            elif not self.degrade_to_next(key):
                return

    # -- the cascade --------------------------------------------------------------------------
    def degrade_to_next(self, key: bytes) -> bool:
        """Hand ``key`` to the next level; False (the entry stays here) when it refuses. An
        I/O error is raised, not turned into a refusal: a park that needed this room must fail
        loudly (``Store.flush`` re-raises it), never be counted as a quiet discard."""
        assert self.next is not None
        try:
            self.next.adopt(self, key)
        except (FormatError, ChecksumMismatch, SymlinkRefused, NotARegularFile):
            # an unreadable image is discarded, not degraded; so is one whose data file is a
            # link or not a regular file (never the store's own, F-DIR-8: unindexed here, the
            # name itself left in place for fsck to report), so it cannot wedge the level
            self.store.delete(key)
            self.counters.discards += 1
            return True
        except LevelRefused as e:
            self.counters.refusals += 1
            self.last_refusal = str(e)
            return False
        self.counters.degradations += 1
        return True

    def adopt(self, src: DiskLevel, key: bytes) -> None:
        """Take ``key`` from the level above, making room first; all or nothing."""
        size = src.store.record(key).total_bytes
        self.make_room(size)
        self.store.adopt(src.store, key)
        self.counters.adopted += 1
