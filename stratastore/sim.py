"""``strata sim``: replay a workload against the real policy code, costed in tokens re-read.

Scenarios:

* ``agent-edit`` (seed 004): a system prompt then turns of equal length, one checkpoint added at
  each turn's end and the chain held to ``checkpoints`` by the retention policy; then the client
  rewrites the history ``edit_back`` tokens before the end. The resume point comes from
  :class:`~stratastore.chain.PrefixIndex`; ``layout="attention"`` adds page-granular resume.
* ``park-truncate`` (seed 001): a RAM cache of ``budget_mib`` and ``slots``; a long chain, then
  two other requests take the slot in turn (each parks the previous conversation), then the first
  conversation returns. Run with and without ``truncate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .chain import (
    Checkpoint,
    Conversation,
    Policy,
    PrefixIndex,
    as_tokens,
    enforce_count,
)
from .chain.parking import MIB, ConversationCache, SizeModel
from .errors import ConfigError

__all__ = ["AgentEdit", "ParkTruncate", "run_agent_edit", "run_park_truncate"]

MODEL = b"\x5a" * 32  # the simulated model's digest
Layout = Literal["hybrid", "attention"]


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
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
        chain.append(Checkpoint(end, last_used=t))
        cuts.append(end)
        enforce_count(chain, cfg.checkpoints, cfg.policy)
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


def _chain(conv_id: str, tokens: np.ndarray, every: int) -> Conversation:
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
