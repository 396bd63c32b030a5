"""``strata sim``: replay a workload against the real policy code, costed in tokens re-read.

Scenarios:

* ``agent-edit`` (the 200-turn edit table): a system prompt then turns of equal length, one
  checkpoint added at each turn's end and the chain held to ``checkpoints`` by the retention
  policy; then the client rewrites the history ``edit_back`` tokens before the end. The resume
  point comes from :class:`~stratastore.chain.PrefixIndex`; ``layout="attention"`` adds
  page-granular resume.
* ``park-truncate`` (the park-truncate episode): a RAM cache of ``budget_mib`` and ``slots``; a
  long chain, then two other requests take the slot in turn (each parks the previous
  conversation), then the first conversation returns. Run with and without ``truncate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stratastore.chain import (
    Checkpoint,
    Conversation,
    Policy,
    PrefixIndex,
    add_checkpoint,
    as_tokens,
)
from stratastore.chain.parking import MIB, ConversationCache, SizeModel
from stratastore.errors import ConfigError

__all__ = ["AgentEdit", "ParkTruncate", "run_agent_edit", "run_park_truncate"]

MODEL = b"\x5a" * 32  # the simulated model's digest
Layout = Literal["hybrid", "attention"]


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
    return rng.integers(0, 150_000, n, dtype=np.uint32)


@dataclass(frozen=True)
class AgentEdit:
    system_tokens: int = 9525
    turns: int = 200
    turn_tokens: int = 1000
    checkpoints: int = 6
    edit_back: int = 6000
    policy: Policy = "spread"
    layout: Layout = "hybrid"
    page_tokens: int = 16
    seed: int = 0

    def validate(self) -> None:
        if (
            min(
                self.system_tokens, self.turns, self.turn_tokens, self.checkpoints, self.page_tokens
            )
            < 1
            or self.edit_back < 0
        ):
            raise ConfigError("sim agent-edit: every size must be at least 1 (edit-back >= 0)")
        if self.edit_back > self.system_tokens + self.turns * self.turn_tokens:
            raise ConfigError("sim agent-edit: --edit-back is longer than the conversation")


def run_agent_edit(cfg: AgentEdit) -> dict[str, Any]:
    """Build the conversation, apply retention turn by turn, edit, look the prompt up."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    held = _tokens(rng, cfg.system_tokens + cfg.turns * cfg.turn_tokens)
    chain = [Checkpoint(cfg.system_tokens, pinned=True, last_used=0)]
    cuts = [0, cfg.system_tokens]
    for t in range(1, cfg.turns + 1):
        end = cfg.system_tokens + t * cfg.turn_tokens
        add_checkpoint(chain, Checkpoint(end, last_used=t), cfg.checkpoints, cfg.policy)
        cuts.append(end)
    end = len(held)
    conv = Conversation("held", as_tokens(held), chain, cuts=cuts[:-1] if cuts[-1] == end else cuts)
    index = PrefixIndex()
    index.add(MODEL, conv)
    edit_at = end - cfg.edit_back
    prompt = np.concatenate([held[:edit_at], _tokens(rng, cfg.edit_back)])
    if cfg.edit_back:
        prompt[edit_at] = held[edit_at] ^ 1  # the first rewritten token always differs
    page = cfg.page_tokens if cfg.layout == "attention" else None
    match = index.lookup(MODEL, prompt, page_tokens=page)
    resumed = match.length if match else 0
    return {
        "scenario": "agent-edit",
        "policy": cfg.policy,
        "layout": cfg.layout,
        "held_tokens": end,
        "prompt_tokens": len(prompt),
        "edit_at": edit_at,
        "kept": sorted(end - c.length for c in chain),
        "resumed_at": resumed,
        "resumed_via": match.via if match else None,
        "reread_tokens": len(prompt) - resumed,
    }


@dataclass(frozen=True)
class ParkTruncate:
    budget_mib: int = 3500
    slots: int = 2
    min_tokens: int = 4096
    every: int = 4096
    first: int = 62_000
    others: tuple[int, ...] = (76_000, 20_000)
    token_kib: int = 32
    state_mib: int = 0
    truncate: bool = True
    seed: int = 0

    def validate(self) -> None:
        if min(self.budget_mib, self.slots, self.every, self.first, self.token_kib) < 1:
            raise ConfigError("sim park-truncate: sizes must be at least 1")
        if not self.others or min(self.others) < 1:
            raise ConfigError("sim park-truncate: --others needs token counts >= 1")


def _chain(conv_id: str, tokens: np.ndarray[Any, Any], every: int) -> Conversation:
    lengths = [*range(every, len(tokens), every), len(tokens)]
    ckpts = [Checkpoint(n, last_used=i) for i, n in enumerate(lengths)]
    return Conversation(conv_id, as_tokens(tokens), ckpts, cuts=[0, *lengths[:-1]])


def run_park_truncate(cfg: ParkTruncate) -> dict[str, Any]:
    """Requests A (``first`` tokens), then each of ``others``, then A again."""
    cfg.validate()
    rng = np.random.default_rng(cfg.seed)
    sizes = SizeModel(cfg.token_kib * 1024, cfg.state_mib * MIB)
    cache = ConversationCache(
        MODEL,
        sizes,
        budget_bytes=cfg.budget_mib * MIB,
        slots=cfg.slots,
        min_tokens=cfg.min_tokens,
        truncate=cfg.truncate,
    )
    first = _tokens(rng, cfg.first)
    names = ["A"] + [chr(ord("B") + i) for i in range(len(cfg.others))]
    prompts = dict(zip(names, [first] + [_tokens(rng, n) for n in cfg.others], strict=True))
    steps = []
    live: str | None = None
    for name in names:
        if live is not None:  # the slot is reused: park the conversation that held it
            out = cache.park(_chain(live, prompts[live], cfg.every))
            steps.append(
                {
                    "request": name,
                    "parked": live,
                    "kept_tokens": out.parked_tokens,
                    "evicted": out.evicted,
                    "shrunk": out.shrunk,
                    "cache_entries": len(cache.entries),
                    "cache_mib": round(cache.used / MIB, 1),
                }
            )
        live = name
    match = cache.lookup(first)
    restored = match.length if match else 0
    return {
        "scenario": "park-truncate",
        "truncate": cfg.truncate,
        "budget_mib": cfg.budget_mib,
        "steps": steps,
        "return_prompt_tokens": len(first),
        "restored_tokens": restored,
        "reread_tokens": len(first) - restored,
        "counters": dict(cache.counters),
    }


@dataclass(frozen=True)
class LowRam:
    """The low-RAM episode, scaled down ``scale`` times in bytes: 4 slots, conversations whose
    snapshots measure 1.6-2.9 GB at full scale (25 KB a token), host free RAM hovering below
    snapshot + 2,560 MiB (the parking floor) but above snapshot + 512 MiB (the transient one),
    a 20 GiB cold level. Token counts are reported at full scale."""

    slots: int = 4
    conversations: int = 6
    requests: int = 40
    scale: int = 256
    seed: int = 0


def run_low_ram(cfg: LowRam, work_dir: str) -> dict[str, Any]:
    """Run the same workload and free-RAM trace under the old rule and the new one, with the
    disk levels in ``work_dir`` (made when it does not exist)."""
    from stratastore.io import files

    files.makedirs(work_dir)
    return {
        "scenario": "low-ram",
        "scale": cfg.scale,
        "old": _low_ram_once(cfg, f"{work_dir}/old", legacy=True),
        "new": _low_ram_once(cfg, f"{work_dir}/new", legacy=False),
    }


def _low_ram_once(cfg: LowRam, path: str, *, legacy: bool) -> dict[str, Any]:
    from stratastore.config import StoreConfig
    from stratastore.format import ModelFingerprint
    from stratastore.tiers.records import Snapshot
    from stratastore.tiers.tiered import Tiers

    if min(cfg.slots, cfg.conversations, cfg.requests) < 1 or cfg.scale < 16:
        raise ConfigError("sim low-ram: slots, conversations, requests >= 1 and scale >= 16")
    s, mib = cfg.scale, 1 << 20
    fp = ModelFingerprint.create(
        "sim/low-ram", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=16
    )  # 128 bytes a token
    full_token_bytes = 25_000  # ~2.5 GB per 100K-token conversation (the low-RAM episode)
    per_full_token = full_token_bytes / s / fp.token_bytes  # scaled tokens per full-scale token
    rng = np.random.default_rng(cfg.seed)
    store_cfg = StoreConfig(
        ram_mib=max(1, 8192 // s),
        slots=cfg.slots,
        min_free_mib=max(1, 2560 // s),
        park_min_free_mib=max(1, 512 // s),
        cold_dir=path,
        cold_mib=max(1, 20_480 // s),
        spill_on="evict",
    )
    # free RAM hovers where the low-RAM episode's rejections happened: above snapshot + 512 MiB
    # (2.9 GB is 2,766 MiB) but below snapshot + 2,560 MiB (1.6 GB is 1,526 MiB): a
    # mean-reverting walk around 3,700 MiB kept in 3,300..4,080 MiB
    walk = np.empty(8 * cfg.requests)
    x = 3700.0
    for i in range(len(walk)):
        x = 3700 + 0.7 * (x - 3700) + rng.normal(0, 150)
        walk[i] = min(max(x, 3300), 4080)
    step = [0]

    def probe() -> int:
        step[0] += 1
        return int(walk[step[0] % len(walk)] * mib / s)

    tiers = Tiers(store_cfg, fp, probe=probe, legacy_admission=legacy, warn=lambda m: None)
    sizes_gb = rng.uniform(1.6, 2.9, cfg.conversations)
    convs: dict[int, np.ndarray[Any, Any]] = {}
    turns: dict[int, list[int]] = {}  #: each conversation's message openers (segment cuts)
    live: list[int] = []
    reread = 0
    try:
        for _ in range(cfg.requests):
            c = int(rng.integers(cfg.conversations))
            if c not in convs:  # a conversation arrives with its whole context
                n = int(sizes_gb[c] * 1e9 / full_token_bytes * per_full_token)
                convs[c] = rng.integers(0, 150_000, n).astype(np.uint32)
                turns[c] = [0]
                history = 0
            else:
                history = len(convs[c])
            if c in live:
                live.remove(c)
            else:
                if len(live) >= cfg.slots:  # the slot is reused: park what held it
                    old = live.pop(0)
                    tiers.park(_snapshot(Snapshot, fp, old, convs[old], turns[old]))
                if history:
                    out = np.empty(history * fp.token_bytes, dtype=np.uint8)
                    reread += history - tiers.restore(convs[c], out).tokens
            turn = int(rng.integers(1_000, 3_000) * per_full_token)
            turns[c].append(len(convs[c]))
            convs[c] = np.concatenate([convs[c], rng.integers(0, 150_000, turn).astype(np.uint32)])
            live.append(c)
        st = tiers.stats()
    finally:
        tiers.close()
    return {
        "rule": "old: one floor, discard" if legacy else "new: transient floor, spill",
        "parks_ram": st["parks_ram"],
        "parks_disk": st["parks_disk"],
        "discards": st["discards"],
        "disk_hits": st["hits_disk"],
        "disk_hits_refused": st["disk_hits_refused"],
        "ram_hits": st["hits_ram"],
        "tokens_reread": round(reread / per_full_token),
    }


def _snapshot(
    cls: Any, fp: Any, conv_id: int, tokens: np.ndarray[Any, Any], openers: list[int]
) -> Any:
    """A checkpoint and a segment cut at every message opener, so a conversation parked again
    after another turn shares all its earlier segments (by key) with its previous park."""
    n = len(tokens)
    lengths = [x for x in openers if 0 < x < n] + [n]
    conv = Conversation(
        f"c{conv_id}", as_tokens(tokens), [Checkpoint(x) for x in lengths], cuts=[0, *lengths[:-1]]
    )
    block = np.frombuffer(bytes(range(256)) * (fp.token_bytes // 256 + 1), np.uint8)
    kv = np.resize(block, n * fp.token_bytes) ^ np.uint8(conv_id)
    return cls(conv, kv)
