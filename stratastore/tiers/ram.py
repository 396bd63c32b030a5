"""The RAM level: parked captures in the pre-reserved arena, chosen by the conversation cache
(budget, slots, seed 001's truncation), with their running states.

What the cache evicts is handed to ``spill`` (with ``spill_on = evict``: its last chance to
reach disk) before its arena chunks are released; a restore that continues a RAM conversation
takes it out (it is mounted live: the slot owns it now).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..chain import Conversation, Match
from ..chain.parking import ConversationCache, SizeModel
from ..config import StoreConfig
from ..format import ModelFingerprint
from ..restore import Destination, FlatKV
from .admission import MIB
from .arena import DEFAULT_CHUNK, Allocation, Arena
from .records import Snapshot

__all__ = ["RamLevel"]


class RamLevel:
    def __init__(self, cfg: StoreConfig, fp: ModelFingerprint,
                 spill: Callable[[Snapshot], bool]) -> None:  # fmt: skip
        self.fp = fp
        self.tb = fp.token_bytes
        self.spill_on_evict = cfg.spill_on == "evict"
        self.spill = spill
        # the arena first: an impossible ram_mib fails before any level is opened
        self.arena = (Arena(cfg.ram_mib * MIB + cfg.slots * DEFAULT_CHUNK,
                            setting=f"ram_mib={cfg.ram_mib} (with slots={cfg.slots})")
                      if cfg.ram_mib else None)  # fmt: skip
        self.cache = ConversationCache(fp.digest(), SizeModel(self.tb),
                                       budget_bytes=cfg.ram_mib * MIB, slots=cfg.slots,
                                       min_tokens=cfg.min_tokens, min_free_bytes=0,
                                       truncate=cfg.park_truncate)  # fmt: skip
        self.cache.on_evict = self._evicted
        self.cache.on_shrink = self._shrunk
        self._allocs: dict[str, Allocation] = {}
        self._states: dict[str, dict[int, bytes]] = {}
        self.evict_spills = 0  #: evicted entries written down (spill_on = evict)

    @property
    def on(self) -> bool:
        return self.arena is not None

    def close(self) -> None:
        if self.arena is not None:
            self.arena.close()

    @property
    def entries(self) -> dict[str, Any]:
        """The conversations RAM holds: id -> the cache's entry (its ``conv``)."""
        return self.cache.entries

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self.cache.entries

    def park(self, snap: Snapshot) -> bool:
        """Keep ``snap`` (or the prefix of it that fits, seed 001); False when RAM refuses."""
        assert self.arena is not None
        conv_id = snap.conv.conv_id
        if conv_id in self._allocs:
            self._release(conv_id)
        out = self.cache.park(snap.conv)
        if out.parked_tokens is None:
            return False
        nbytes = out.parked_tokens * self.tb
        alloc = self.arena.alloc(nbytes)
        if alloc is None:  # chunk rounding left the arena short: treat as a RAM refusal
            self.cache.take(conv_id)
            return False
        self.arena.write(alloc, snap.kv[:nbytes])
        self._allocs[conv_id] = alloc
        self._states[conv_id] = {n: s for n, s in snap.states.items()
                                 if n <= out.parked_tokens}  # fmt: skip
        return True

    def restore(self, m: Match, dest: Destination) -> bytes | None:
        """Copy a RAM hit into ``dest``; the running state at its length, if one was saved.
        A hit on the whole of its conversation takes it out of RAM (mounted live)."""
        self.read(m.conv_id, m.length, dest)
        state = self._states.get(m.conv_id, {}).get(m.length)
        if m.length == len(self.cache.entries[m.conv_id].conv.tokens):
            self.cache.take(m.conv_id)
            self._release(m.conv_id)
        return state

    def read(self, conv_id: str, length: int, dest: Destination) -> None:
        """Copy ``[0, length)`` of a RAM entry (stored page layout) into ``dest``."""
        alloc = self._allocs[conv_id]
        assert self.arena is not None
        if isinstance(dest, FlatKV):
            self.arena.read_into(alloc, dest.buf, length * self.tb)
            return
        kv = np.empty(length * self.tb, dtype=np.uint8)
        self.arena.read_into(alloc, kv, length * self.tb)
        for start, end in self.cache.entries[conv_id].conv.boundaries():  # no keys to hash
            if start >= length:
                break
            end = min(end, length)
            dest.write_pages(start, end - start, kv[start * self.tb : end * self.tb],
                             self.fp.page_tokens)  # fmt: skip

    def _release(self, conv_id: str) -> None:
        self._states.pop(conv_id, None)
        alloc = self._allocs.pop(conv_id)
        assert self.arena is not None
        self.arena.release(alloc)

    def _evicted(self, conv: Conversation) -> None:
        alloc = self._allocs[conv.conv_id]
        if self.spill_on_evict:
            kv = np.empty(alloc.nbytes, dtype=np.uint8)
            assert self.arena is not None
            self.arena.read_into(alloc, kv)
            if self.spill(Snapshot(conv, kv, dict(self._states.get(conv.conv_id, {})))):
                self.evict_spills += 1
        self._release(conv.conv_id)

    def _shrunk(self, conv: Conversation) -> None:
        alloc = self._allocs[conv.conv_id]
        assert self.arena is not None
        keep = len(conv.tokens) * self.tb
        kv = np.empty(keep, dtype=np.uint8)
        self.arena.read_into(alloc, kv, keep)
        self.arena.release(alloc)
        new = self.arena.alloc(keep)
        assert new is not None  # a shrink only frees chunks
        self.arena.write(new, kv)
        self._allocs[conv.conv_id] = new
        states = self._states.get(conv.conv_id, {})
        self._states[conv.conv_id] = {n: s for n, s in states.items() if n <= len(conv.tokens)}

    def stats(self) -> dict[str, int]:
        c = self.cache
        return {"entries": len(c.entries), "bytes": c.used, "budget": c.budget, **c.counters}

    def held_tokens(self) -> int:
        return sum(len(e.conv.tokens) for e in self.cache.entries.values())
