"""The RAM conversation cache's parking policy: budget, slots, the parking floor, and
park-the-prefix-that-fits / truncate-before-evict (``truncate``, off by default: the
park-truncate episode).

Without ``truncate`` parking is all-or-nothing, as the engine did before: a conversation whose
snapshot fails the byte budget or the RAM gate is discarded, and making room evicts the oldest
entries whole. With ``truncate``:

* **park side**: when the outgoing chain fails the byte budget or the RAM gate (``available >=
  snapshot + min_free``), walk its checkpoints deepest-first and park the first prefix that
  passes both, even below ``min_tokens`` (a root-deep mirror still saves the shared prefix);
* **eviction side**: an already-parked entry asked to make room is first shrunk to the deepest of
  its own checkpoints that makes the new snapshot fit (K/V past the landing and the deeper
  checkpoints' states go) and dropped whole only when no landing fits or the landing is below
  ``min_tokens``. Pinned entries are never truncated (nor evicted for bytes); slot-count pressure
  still evicts whole, since truncation does not reduce the count.

Single-stage layouts only: a layer-split (multi-stage) layout stores each stage's K/V apart and
has no per-checkpoint byte split to walk, so it parks all-or-nothing even with ``truncate``.
Sizes come from :class:`SizeModel`; the memory probe is injectable so low-RAM cases can be tested.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from stratastore.chain.model import Conversation
from stratastore.chain.prefix_index import Match, PrefixIndex
from stratastore.errors import ConfigError

__all__ = ["ConversationCache", "ParkOutcome", "SizeModel"]

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class SizeModel:
    """Bytes of a snapshot: K/V of every token plus the running state of every checkpoint."""

    token_bytes: int
    state_bytes: int = 0

    def snapshot_bytes(self, conv: Conversation, length: int | None = None) -> int:
        n = len(conv.tokens) if length is None else length
        states = sum(1 for c in conv.checkpoints if c.length <= n)
        return n * self.token_bytes + states * self.state_bytes


@dataclass
class ParkOutcome:
    parked_tokens: int | None  #: tokens kept (None: discarded)
    truncated: bool = False  #: the prefix that fits, not the whole chain
    evicted: list[str] = field(default_factory=list)
    shrunk: list[tuple[str, int]] = field(default_factory=list)  #: (entry, landing)


@dataclass
class _Entry:
    conv: Conversation
    nbytes: int
    pinned: bool = False


class ConversationCache:
    """Parked conversations in RAM, with their prefix index. ``park``, ``take``, ``lookup``."""

    def __init__(
        self,
        model: bytes,
        sizes: SizeModel,
        *,
        budget_bytes: int,
        slots: int,
        min_tokens: int = 0,
        min_free_bytes: int = 2560 * MIB,
        truncate: bool = False,
        available: Callable[[], int] | None = None,
        multi_stage: bool = False,
    ) -> None:
        if budget_bytes < 0 or slots < 1 or min_tokens < 0 or min_free_bytes < 0:
            raise ConfigError(
                "conversation cache: budget, min_tokens and min_free must be >= 0 and slots >= 1"
            )
        self.model = model
        self.sizes = sizes
        self.budget = budget_bytes
        self.slots = slots
        self.min_tokens = min_tokens
        self.min_free = min_free_bytes
        self.truncate = truncate and not multi_stage
        self.available = available or (lambda: 1 << 62)
        #: called with an entry's conversation before it is evicted (its owner may spill it)
        self.on_evict: Callable[[Conversation], None] | None = None
        #: called with an entry's conversation after it was shrunk to a landing
        self.on_shrink: Callable[[Conversation], None] | None = None
        self.entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self.index = PrefixIndex()
        self.counters = {
            "parks": 0,
            "truncated_parks": 0,
            "discards": 0,
            "evictions": 0,
            "truncations": 0,
        }

    @property
    def used(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def _ram_ok(self, nbytes: int) -> bool:
        return self.available() >= nbytes + self.min_free

    # -- parking ------------------------------------------------------------------------------
    def park(self, conv: Conversation, *, pinned: bool = False) -> ParkOutcome:
        """Park ``conv`` (the cache keeps its own reference; do not mutate it afterwards)."""
        if conv.conv_id in self.entries:
            self._drop(conv.conv_id)
        full = self.sizes.snapshot_bytes(conv)
        length: int | None = len(conv.tokens)
        if full > self.budget or not self._ram_ok(full):
            length = self._prefix_that_fits(conv) if self.truncate else None
        elif len(conv.tokens) < self.min_tokens:
            length = None
        if length is None:
            self.counters["discards"] += 1
            return ParkOutcome(None)
        out = ParkOutcome(length, truncated=length < len(conv.tokens))
        if out.truncated:
            conv.truncate_to(length)
        need = self.sizes.snapshot_bytes(conv)
        if not self._make_room(need, out):
            self.counters["discards"] += 1
            return ParkOutcome(None, evicted=out.evicted, shrunk=out.shrunk)
        self.entries[conv.conv_id] = _Entry(conv, need, pinned)
        self.index.add(self.model, conv)
        self.counters["parks"] += 1
        self.counters["truncated_parks"] += out.truncated
        return out

    def pin(self, conv_id: str, pinned: bool = True) -> bool:
        """Pin (or unpin) a parked entry: a pinned entry is never truncated, nor evicted to make
        room for another park; it leaves when it is taken or parked again. False
        when ``conv_id`` is not parked."""
        entry = self.entries.get(conv_id)
        if entry is None:
            return False
        entry.pinned = pinned
        return True

    @contextlib.contextmanager
    def gate(self, available: int, min_free: int) -> Iterator[None]:
        """Within the block, the RAM gate of :meth:`park` is ``available >= snapshot +
        min_free`` with this measure of the free RAM: what an owner whose own admission
        measured it (once, for one park) hands the cache, so that a snapshot failing only that
        floor parks the prefix that fits (with ``truncate``) instead of being refused whole."""
        saved = self.available, self.min_free
        self.available, self.min_free = (lambda: available), min_free
        try:
            yield
        finally:
            self.available, self.min_free = saved

    def _prefix_that_fits(self, conv: Conversation) -> int | None:
        for c in reversed(conv.checkpoints):
            nbytes = self.sizes.snapshot_bytes(conv, c.length)
            if c.length > 0 and nbytes <= self.budget and self._ram_ok(nbytes):
                return c.length
        return None

    def _make_room(self, need: int, out: ParkOutcome) -> bool:
        """Evict (or, with ``truncate``, shrink) the oldest entries until ``need`` fits in the
        budget and a slot is free; False (having touched nothing) when even evicting every
        unpinned entry would not make room."""
        pinned = [e for e in self.entries.values() if e.pinned]
        if len(pinned) >= self.slots or sum(e.nbytes for e in pinned) + need > self.budget:
            return False
        while len(self.entries) >= self.slots:  # slot pressure: whole entries only
            victim = next((k for k, e in self.entries.items() if not e.pinned), None)
            if victim is None:
                return False
            self._evict(victim, out)
        while self.used + need > self.budget:
            victim = next((k for k, e in self.entries.items() if not e.pinned), None)
            if victim is None:
                return False
            landing = self._landing(victim, need) if self.truncate else None
            if landing is None:
                self._evict(victim, out)
            else:
                self._shrink(victim, landing, out)
        return True

    def _landing(self, conv_id: str, need: int) -> int | None:
        """The deepest checkpoint of an entry that makes ``need`` fit, if not below min_tokens."""
        entry = self.entries[conv_id]
        others = self.used - entry.nbytes
        for c in reversed(entry.conv.checkpoints):
            if c.length >= len(entry.conv.tokens):
                continue
            if others + self.sizes.snapshot_bytes(entry.conv, c.length) + need <= self.budget:
                return c.length if c.length >= self.min_tokens and c.length > 0 else None
        return None

    def _shrink(self, conv_id: str, landing: int, out: ParkOutcome) -> None:
        entry = self.entries[conv_id]
        self.index.remove(conv_id)
        entry.conv.truncate_to(landing)
        entry.nbytes = self.sizes.snapshot_bytes(entry.conv)
        self.index.add(self.model, entry.conv)
        if self.on_shrink is not None:
            self.on_shrink(entry.conv)
        self.entries.move_to_end(conv_id, last=False)  # still the oldest
        self.counters["truncations"] += 1
        out.shrunk.append((conv_id, landing))

    def _evict(self, conv_id: str, out: ParkOutcome) -> None:
        if self.on_evict is not None:
            self.on_evict(self.entries[conv_id].conv)
        self._drop(conv_id)
        self.counters["evictions"] += 1
        out.evicted.append(conv_id)

    def _drop(self, conv_id: str) -> None:
        del self.entries[conv_id]
        self.index.remove(conv_id)

    # -- reading ------------------------------------------------------------------------------
    def lookup(
        self, prompt: Sequence[int] | npt.NDArray[np.integer], *, page_tokens: int | None = None
    ) -> Match | None:
        return self.index.lookup(self.model, prompt, page_tokens=page_tokens)

    def take(self, conv_id: str) -> Conversation:
        """Remove a parked entry to mount it live (the engine resumes from it)."""
        entry = self.entries[conv_id]
        self._drop(conv_id)
        return entry.conv
