"""Disk levels and the cascade: each level degrades into the next, only the last deletes.

A level is a segment backend (:class:`~stratastore.levels.backend.SegmentBackend`; a
:class:`SegmentStore` on a local directory) with a byte budget, an optional age limit and a
next level; the levels are an ordered list (``levels = [...]``; warm and cold are the names
the flat settings give them). When a level's GC runs (:meth:`DiskLevel.enforce_budget`,
:meth:`DiskLevel.enforce_age`) and a next level is set, its oldest entry is *degraded*: handed
to the next level (:meth:`degrade_to_next` -> :meth:`adopt`), which makes room for it and takes
it by rename-or-copy (:meth:`~stratastore.levels.backend.SegmentBackend.relocate_from`); only
then does this level drop its copy. All or nothing: if the next level refuses (budget with
``when_full=reject``, an image larger than its whole budget, an I/O error), nothing moves and the
entry stays. An entry another process moved or deleted meanwhile is taken as moved (a race is
never an error out of a park).

The last level deletes, but never a segment by itself: it asks the shared catalog's GC
(:class:`~stratastore.catalog.gc.Collector`, through ``free``) to shorten the oldest
conversation, which deletes only segments no manifest names any more (spec F-CAT-4). A
degradation is not an eviction: ``disk_evictions`` and ``age_evictions`` do not move. An
unreadable image found on the way is discarded, and the conversations naming it are cut before
it (``discard``), so no segment is left after a hole.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

from stratastore.errors import StrataError
from stratastore.format import ChecksumMismatch, FormatError
from stratastore.io.errors import NotARegularFile, SymlinkRefused
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.errors import DataMissing, SegmentNotFound

__all__ = ["DiskLevel", "LevelCounters", "LevelRefused", "open_cascade"]


class LevelRefused(StrataError):
    """A level cannot take an entry (full with when_full=reject, or larger than its budget)."""


@dataclass
class LevelCounters:
    disk_evictions: int = 0  #: conversations shortened by budget (last level only)
    age_evictions: int = 0  #: conversations shortened by age (last level only)
    degradations: int = 0  #: handed to the next level
    adopted: int = 0  #: taken from the level above
    refusals: int = 0  #: entries the next level refused (they stayed here)
    discards: int = 0  #: unreadable images deleted on the way
    raced: int = 0  #: entries another process had moved or deleted first
    hits: int = 0  #: restores served from this level

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class DiskLevel:
    def __init__(
        self,
        name: str,
        store: SegmentBackend,
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
        #: the last level's way to free space (sealed before the time given, for age GC): how
        #: much went, 0 when nothing may go. A Store always sets it to the catalog's GC (whole
        #: chains, F-CAT-4); the default, for a level used on its own without manifests (the
        #: cascade's tests, the LMCache plugin's chunks), lets go of its oldest segment
        self.free: Callable[[int | None], int] = self._delete_oldest
        #: an unreadable segment leaves: cut the chains naming it, then delete it
        self.discard: Callable[[bytes], bool] = self._delete
        #: what the budget counts (:meth:`used`): the store's bytes; a user whose writers
        #: reserve room before they commit (several threads putting at once) adds those
        self.usage: Callable[[], int] = lambda: self.store.used()
        #: how the default ``free`` lets go of the oldest entry: True deleted, False gone
        #: already (another process deleted it: the budget is looked at again), None held (a
        #: user's pin: the next oldest is tried). Deleting under the user's own exclusion
        #: lets a pin taken meanwhile never lose its entry. The default deletes it
        self.let_go: Callable[[bytes], bool | None] = lambda key: self.store.delete(key)

    @property
    def is_last(self) -> bool:
        return self.next is None

    def used(self) -> int:
        """The bytes the budget counts (:attr:`usage`)."""
        return self.usage()

    def _delete(self, key: bytes) -> bool:
        self.store.delete(key)
        return True

    def _delete_oldest(self, before_ns: int | None) -> int:
        """A level used on its own: let go of (:attr:`let_go`) the oldest entry not held,
        sealed before ``before_ns`` when given; 0 when every such entry is held."""
        for key, rec in self.store.oldest():
            if before_ns is not None and rec.sealed_at_ns > before_ns:
                return 0
            went = self.let_go(key)
            if went is not None:
                return int(went) or 1
        return 0

    def oldest_age_s(self) -> float | None:
        """Seconds since the oldest entry was sealed (O(log n), the index's age table; a
        tenth of a second, as ``strata monitor`` scans it), ``None`` while the level is empty:
        the level's ``oldest_age_s`` in ``Store.stats()``."""
        for _, rec in self.store.oldest():
            return round(max(0, self.clock() - rec.sealed_at_ns) / 1e9, 1)
        return None

    def _oldest(self) -> bytes | None:
        """The oldest sealed entry's key (O(log n), the index's age table)."""
        for key, _ in self.store.oldest():
            return key
        return None

    # -- making room --------------------------------------------------------------------------
    def make_room(self, size: int) -> None:
        """Free space for ``size`` more bytes: the last level shortens the oldest conversations
        (unless ``when_full=reject``); a level with a next one degrades its oldest. Raises
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
            if not self._free_one():
                if self.used() + size <= self.budget:  # freed meanwhile (another process)
                    break
                raise LevelRefused(
                    f"{self.name} level cannot free {size:,} bytes: "
                    + (
                        self.last_refusal
                        if not self.is_last
                        else "what it holds is pinned "
                        "prefixes, saved sessions or parks in flight, or the oldest conversations' "
                        "segments live in another level; raise its budget"
                    )
                )

    def _free_one(self) -> bool:
        """One step of making room: False when nothing more can go."""
        if self.is_last:
            if not self.free(None):
                return False
            self.counters.disk_evictions += 1
            return True
        key = self._oldest()
        return key is not None and self.degrade_to_next(key)

    def enforce_budget(self) -> None:
        """Bring the level within its budget; stops where nothing more can go."""
        while self.used() > self.budget and self._free_one():
            pass

    def enforce_age(self) -> None:
        """Entries sealed more than ``max_age_s`` ago go to the next level; on the last level,
        conversations sealed that long ago are shortened (never sessions, never pinned
        prefixes)."""
        if not self.max_age_ns:
            return
        limit = self.clock() - self.max_age_ns
        if self.is_last:
            while self.free(limit):
                self.counters.age_evictions += 1
            return
        for key, rec in self.store.oldest():
            if rec.sealed_at_ns > limit or not self.degrade_to_next(key):
                return

    # -- the cascade --------------------------------------------------------------------------
    def degrade_to_next(self, key: bytes) -> bool:
        """Hand ``key`` to the next level; False (the entry stays here) when it refuses. An
        I/O error is raised, not turned into a refusal: a park that needed this room must fail
        loudly (``Store.flush`` re-raises it), never be counted as a quiet discard."""
        assert self.next is not None
        try:
            self.next.adopt(self, key)
        except SegmentNotFound:
            self.counters.raced += 1  # another process moved or deleted it first: look again
            return True
        except (FormatError, ChecksumMismatch, SymlinkRefused, NotARegularFile, DataMissing):
            # an unreadable image is discarded, not degraded; so is one whose data file is a
            # link or not a regular file (never the store's own, F-DIR-8: unindexed here, the
            # name itself left in place for fsck to report), or gone (its sidecar set aside
            # into strata-quarantine/, as repair does, F-DUR-7), so it cannot wedge the level;
            # not while a park in flight names it (it goes once that park has committed)
            if not self.discard(key):
                self.counters.refusals += 1
                self.last_refusal = f"segment {key.hex()[:16]} is unreadable and a park needs it"
                return False
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
        """Take ``key`` from the level above, making room first; all or nothing. Raises
        :class:`~stratastore.levels.errors.SegmentNotFound` when ``src`` no longer holds it."""
        size = src.store.record(key).total_bytes
        self.make_room(size)
        self.store.relocate_from(src.store, key)
        self.counters.adopted += 1


def open_cascade(
    count: int, open_one: Callable[[int, DiskLevel | None], DiskLevel]
) -> list[DiskLevel]:
    """``count`` levels, first to last, each linked to the next: made last first by
    ``open_one(i, next_level)`` (which closes what it opened itself when it fails); every level
    made is closed again when a later one fails. What a store's flow and a chunk store open."""
    levels: list[DiskLevel] = []
    try:
        for i in reversed(range(count)):  # the last first: each links to the next
            levels.insert(0, open_one(i, levels[0] if levels else None))
    except BaseException:
        for lvl in levels:
            lvl.store.close()
        raise
    return levels
