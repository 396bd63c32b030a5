"""The low-RAM window of ``strata replay`` (:mod:`.replay`) with the system-prompt cache: the
engine's low-RAM episode (free RAM below snapshot + the parking floor but above snapshot + the
transient floor, every park rejected by the RAM gate) on a store with no disk level, where each
rejected park is a discard, run through the Store as an engine drives it.

Six conversations share one 4,096-token system prompt (the pinned root checkpoint); four
rounds, each conversation asking once a round with 512 more tokens of its own, the history
growing as it goes. Every request restores its prompt (bit for bit against the tiny model's
K/V, :mod:`.replay_engine`), prefills the rest and parks the conversation with its root and its
newest checkpoint. The free-RAM probe reads inside the window throughout. Two Stores: the RAM
level alone (``ram_mib = 16``, floors 64 and 8 MiB, 40 MiB free), and the same with a
system-prompt cache (``prompt_cache_dir``, ``prompt_cache_mib = 16``). Without it every park is
discarded and every request reads its whole prompt again; with it the first park fills the
cache and every later request restores the system prompt from it, admitted under the transient
floor (the ``system-prompt-cache hit under the transient RAM floor`` line), so only the
conversation's own tokens are read again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata_harness.replay_engine import Engine, replay_fingerprint
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.facade import Store
from stratastore.format import ModelFingerprint

__all__ = [
    "CONVERSATIONS",
    "OWN",
    "ROUNDS",
    "SYSTEM",
    "WINDOW_MIB",
    "PromptRun",
    "cache_dir",
    "run_prompt",
]

SYSTEM, CONVERSATIONS, ROUNDS, OWN = 4096, 6, 4, 512
#: the window: free RAM (MiB) under snapshot + the parking floor, over snapshot + the transient
WINDOW_MIB, PARKING_MIB, TRANSIENT_MIB, RAM_MIB, CACHE_MIB = 40, 64, 8, 16, 16
TRANSIENT_HIT = "system-prompt-cache hit under the transient RAM floor"


@dataclass
class PromptRun:
    """The window through one Store, with the system-prompt cache or without."""

    cache: bool
    requests: int
    discards: int  #: parks the RAM gate rejected with nowhere else to go
    fills: int  #: system prompts written to the cache (0 without it)
    hits: int  #: restores served from the cache
    transient_hits: int  #: of them, admitted under the transient floor (the log line)
    restored: int  #: tokens restored
    prefilled: int  #: tokens the engine computed
    prompt_tokens: int  #: tokens of every request's prompt
    checked: int
    mismatches: int


def cache_dir(work_dir: str) -> str:
    """The system-prompt cache's folder in ``work_dir`` (the replay starts it empty)."""
    return f"{work_dir}/system-prompts"


def run_prompt(cache: bool, work_dir: str, fp: ModelFingerprint | None = None) -> PromptRun:
    """The window through a Store (see the module's docstring); ``work_dir`` holds the cache's
    folder."""
    fp = fp or replay_fingerprint()
    rng = np.random.default_rng(0)
    system = rng.integers(0, 150_000, SYSTEM, dtype=np.uint32)
    own = [rng.integers(0, 150_000, ROUNDS * OWN, dtype=np.uint32) for _ in range(CONVERSATIONS)]
    cfg: dict[str, object] = {
        "ram_mib": RAM_MIB,
        "slots": 4,
        "min_free_mib": PARKING_MIB,
        "park_min_free_mib": TRANSIENT_MIB,
    }
    if cache:
        cfg |= {"prompt_cache_dir": cache_dir(work_dir), "prompt_cache_mib": CACHE_MIB}
    said: list[str] = []
    with Store.open(fp, cfg, probe=lambda: WINDOW_MIB << 20, warn=said.append) as store:
        engine = Engine(store, fp)
        for r in range(ROUNDS):
            for c in range(CONVERSATIONS):
                prompt = as_tokens(np.concatenate([system, own[c][: (r + 1) * OWN]]))
                _, kv = engine.serve(prompt)
                conv = Conversation(
                    f"chat-{c}",
                    prompt.copy(),
                    [Checkpoint(SYSTEM, pinned=True), Checkpoint(len(prompt))],
                )
                store.park(conv, engine.capture(kv, conv))
        s = store.stats()
    return PromptRun(
        cache,
        ROUNDS * CONVERSATIONS,
        s["discards"],
        s.get("prompt_cache_fills", 0),
        s.get("hits_prompt_cache", 0),
        sum(TRANSIENT_HIT in line for line in said),
        s["tokens_restored"],
        engine.prefilled,
        engine.prompt_tokens,
        engine.checked,
        engine.mismatches,
    )
