"""The RAM level: parked captures in the pre-reserved arena, chosen by the conversation cache
(budget, slots, park truncation), with their running states.

What the cache evicts is handed to ``spill`` (with ``spill_on = evict``: its last chance to
reach disk) before its arena chunks are released; a restore that continues a RAM conversation
takes it out (it is mounted live: the slot owns it now).

The arena is reserved only when parks go to RAM (``reserve``): for a disk park target the RAM
level keeps nothing and is off. Its pages are populated as it is used
(``ram_prefault``, :mod:`.arena`), never all at open unless asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.chain import Conversation, Match
from stratastore.chain.parking import ConversationCache, SizeModel
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.io.system import mem_total
from stratastore.restore import Destination, FlatKV, deliver_capture
from stratastore.tiers.admission import MIB, Admission
from stratastore.tiers.arena import DEFAULT_CHUNK, Allocation, Arena
from stratastore.tiers.records import Snapshot

__all__ = ["RamLevel", "fit_default_ram", "reserve_arena"]


def fit_default_ram(
    cfg: StoreConfig, warn: Callable[[str], None], physical: int | None = None
) -> StoreConfig:
    """``cfg`` as given, or, when ``ram_mib`` is the default and the RAM level it sizes does
    not fit in this machine's physical memory (``physical``, default MemTotal: an 8 GiB
    machine has less than 8192 MiB plus the slots' slack), ``cfg`` with ``ram_mib`` lowered
    to half of that memory, said in a warning: the defaults open on an ordinary machine. A
    ``ram_mib`` other than the default that does not fit stays the user's error
    (:func:`reserve_arena`). (An explicit ``ram_mib = 8192`` cannot be told from the default:
    it is lowered too, with the same warning.)"""
    default = StoreConfig.__dataclass_fields__["ram_mib"].default
    total = mem_total() if physical is None else physical
    if cfg.ram_mib != default or total is None:
        return cfg
    if cfg.ram_mib * MIB + cfg.slots * DEFAULT_CHUNK <= total:
        return cfg
    fit = max(1, total // 2 // MIB)
    warn(
        f"ram_mib: the default {default} MiB does not fit this machine's "
        f"{total / MIB:,.0f} MiB of physical memory; the RAM level takes {fit} MiB (set "
        "ram_mib to choose)"
    )
    return dataclasses.replace(cfg, ram_mib=fit)


def reserve_arena(
    cfg: StoreConfig, physical: int | None = None, admission: Admission | None = None
) -> Arena:
    """The RAM level's arena: ``ram_mib`` plus a chunk of slack per slot (chunk rounding),
    address space only, populated as ``ram_prefault`` says, a slot's share kept populated ahead
    of use in the background while ``admission``'s parking floor holds with a chunk more (free
    RAM is not spent ahead of a park that would be refused). More than the machine's physical
    memory (``physical``, default its MemTotal) is a :class:`ConfigError` naming ``ram_mib``,
    and so is a reservation the system refuses (the address space, ``RLIMIT_AS``,
    overcommit)."""
    size = cfg.ram_mib * MIB + cfg.slots * DEFAULT_CHUNK
    setting = f"ram_mib={cfg.ram_mib} (with slots={cfg.slots})"
    total = mem_total() if physical is None else physical
    if total is not None and size > total:
        raise ConfigError(
            f"{setting} asks for {size / MIB:,.0f} MiB of RAM (the budget and "
            f"{DEFAULT_CHUNK // MIB} MiB of chunk slack a slot) but this machine has "
            f"{total / MIB:,.0f} MiB of physical memory (MemTotal, or the container's "
            "memory.max); lower ram_mib to fit beside the parking floor (min_free_mib) and "
            "the engine, or set park = disk (the RAM level then keeps nothing)"
        )
    room = None if admission is None else lambda n: admission.probe() >= n + admission.parking_floor
    return Arena(
        size,
        prefault=cfg.ram_prefault,
        ahead_bytes=cfg.ram_mib * MIB // cfg.slots,
        room=room,
        setting=setting,
    )


class RamLevel:
    def __init__(
        self,
        cfg: StoreConfig,
        fp: ModelFingerprint,
        spill: Callable[[Snapshot], bool],
        *,
        reserve: bool = True,
        admission: Admission | None = None,
    ) -> None:
        """``reserve``: whether parks may stay in RAM (the park target is ``ram``); without it,
        or with ``ram_mib = 0``, no arena is reserved and the level is off. ``admission``: its
        parking floor holds back the arena's background populate. An impossible ``ram_mib``
        raises :class:`ConfigError` here (the caller builds this level first)."""
        self.fp = fp
        self.tb = fp.token_bytes
        self.spill_on_evict = cfg.spill_on == "evict"
        self.spill = spill
        self.arena = reserve_arena(cfg, admission=admission) if cfg.ram_mib and reserve else None
        self.cache = ConversationCache(
            fp.digest(),
            SizeModel(self.tb),
            budget_bytes=cfg.ram_mib * MIB,
            slots=cfg.slots,
            min_tokens=cfg.min_tokens,
            min_free_bytes=0,
            truncate=cfg.park_truncate,
        )
        self.cache.on_evict = self._evicted
        self.cache.on_shrink = self._shrunk
        self._allocs: dict[str, Allocation] = {}
        self._states: dict[str, dict[int, bytes]] = {}
        #: the device digests parked with each capture (Snapshot.page_hashes), for its writes
        self._hashes: dict[str, dict[tuple[int, int], npt.NDArray[np.uint8]]] = {}
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
        """Keep ``snap`` (or the prefix of it that fits); False when RAM refuses."""
        assert self.arena is not None
        conv_id = snap.conv.conv_id
        if conv_id in self._allocs:
            self._release(conv_id)
        out = self.cache.park(snap.conv)
        if out.parked_tokens is None:
            return False
        alloc = None
        try:
            nbytes = out.parked_tokens * self.tb
            alloc = self.arena.alloc(nbytes)
            if alloc is None:  # chunk rounding left the arena short: treat as a RAM refusal
                self.cache.take(conv_id)
                return False
            self.arena.write(alloc, snap.kv[:nbytes])
            self._allocs[conv_id] = alloc
        except BaseException:  # stopped (Ctrl-C, an error) before it held its memory: not kept
            if conv_id not in self._allocs and conv_id in self.cache.entries:
                self.cache.take(conv_id)
                if alloc is not None:
                    self.arena.release(alloc)
            raise
        self._states[conv_id] = {n: s for n, s in snap.states.items() if n <= out.parked_tokens}
        self._hashes[conv_id] = _covered(snap.page_hashes, out.parked_tokens)
        return True

    def restore(self, m: Match, dest: Destination) -> bytes | None:
        """Copy a RAM hit into ``dest``; the running state at its length, if one was saved.
        A hit on the whole of its conversation takes it out of RAM (mounted live), unless it
        is pinned (a pinned entry stays; a system prompt serves every request)."""
        self.read(m.conv_id, m.length, dest)
        state = self._states.get(m.conv_id, {}).get(m.length)
        entry = self.cache.entries[m.conv_id]
        if m.length == len(entry.conv.tokens) and not entry.pinned:
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
        deliver_capture(dest, kv, self.cache.entries[conv_id].conv.boundaries(), length, self.fp)

    def states(self, conv_id: str) -> dict[int, bytes]:
        """The running states parked with ``conv_id`` (checkpoint length -> bytes)."""
        return self._states.get(conv_id, {})

    def drop(self, conv_id: str) -> None:
        """Forget ``conv_id``'s entry (a newer park of the id went elsewhere: superseded)."""
        self.cache.take(conv_id)
        self._release(conv_id)

    def _release(self, conv_id: str) -> None:
        self._states.pop(conv_id, None)
        self._hashes.pop(conv_id, None)
        alloc = self._allocs.pop(conv_id)
        assert self.arena is not None
        self.arena.release(alloc)

    def capture(self, conv_id: str) -> Snapshot:
        """A copy of what RAM holds of ``conv_id`` (its conversation, K/V and states, and the
        device digests parked with it: not hashed again), to write down: what an eviction
        spills, and what ``close()`` writes of a RAM-only conversation."""
        alloc = self._allocs[conv_id]
        kv = np.empty(alloc.nbytes, dtype=np.uint8)
        assert self.arena is not None
        self.arena.read_into(alloc, kv)
        conv = self.cache.entries[conv_id].conv
        return Snapshot(
            conv,
            kv,
            dict(self._states.get(conv_id, {})),
            page_hashes=dict(self._hashes.get(conv_id, {})),
        )

    def _evicted(self, conv: Conversation) -> None:
        if self.spill_on_evict:
            snap = self.capture(conv.conv_id)
            snap.conv = conv
            if self.spill(snap):
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
        self._hashes[conv.conv_id] = _covered(self._hashes.get(conv.conv_id, {}), len(conv.tokens))

    def stats(self) -> dict[str, int]:
        c = self.cache
        return {"entries": len(c.entries), "bytes": c.used, "budget": c.budget, **c.counters}


def _covered(
    hashes: dict[tuple[int, int], npt.NDArray[np.uint8]], tokens: int
) -> dict[tuple[int, int], npt.NDArray[np.uint8]]:
    """The device digests of segments within the first ``tokens`` tokens (what a capture
    truncated to them still holds the bytes of)."""
    return {k: h for k, h in hashes.items() if k[1] <= tokens}
