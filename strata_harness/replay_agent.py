"""The agent-edit workload of ``strata replay`` (:mod:`.replay`; the simulator's
``agent-edit``, ``--prompt-cache-spread``) run through the Store as an engine drives it.

One conversation, a 9,525-token system prompt (its end the pinned root checkpoint) then 200
turns of 1,000 tokens; each turn restores the previous turn's conversation, prefills the new
1,000 tokens and parks the conversation with one new checkpoint at its end; the Store applies
retention across the parks of the conversation (``checkpoints = 6``). Two calling patterns
(:data:`PATTERNS`): the engine passes only its newest checkpoint (the pinned root with the
first) and cuts at every turn start; or it passes its pinned root and its newest checkpoint
and no cuts at all, leaving the store to cut the capture where it keeps a checkpoint. One Store
per policy and pattern, ``retention = "spread"`` and ``"lru"``. Measured:
the checkpoints the last park kept, as tokens before the end of the conversation; then the
client rewrites the history 6K and 42K tokens before the end (the sim's edit: the first
rewritten token differs, the prompt keeps its length) and the tokens re-read for each edited
prompt (its length minus what ``Store.restore`` returned). The Store has a RAM level (16 MiB:
the whole 11.7 MB conversation) and a cold disk level in the work directory (every park is also
written down, ``spill_on = "park"``): the edits are restored once from RAM after ``flush`` (so
that no disk write is in flight: a restore before the writer caught up may resume from an older
park's manifest, whose chain still has checkpoints retention has dropped since), then again
after ``close`` and a new ``Store.open`` on the same directory (a restart: only the disk level
holds the chain). The reference table (:data:`EDIT_TABLE`): spread keeps 0, 1K, 3K, 8K, 43K and
200K (the root) and re-reads 8K and 43K; least recent use keeps 0, 1K, 2K, 3K, 4K and the root
and re-reads 200K for both. The simulator's figures:
:func:`strata_harness.sim.run_agent_edit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

import numpy as np
import numpy.typing as npt

from strata_harness.replay_engine import Engine, plenty, replay_fingerprint
from stratastore.chain import Checkpoint, Conversation, Policy, as_tokens
from stratastore.errors import ConfigError
from stratastore.facade import Store
from stratastore.format import ModelFingerprint

__all__ = [
    "CHECKPOINTS",
    "EDIT_TABLE",
    "EDITS",
    "END",
    "PATTERNS",
    "SYSTEM",
    "TURN",
    "TURNS",
    "AgentRun",
    "level_dir",
    "run_agent",
    "run_key",
]

SYSTEM, TURNS, TURN, CHECKPOINTS = 9525, 200, 1000, 6
END = SYSTEM + TURNS * TURN
EDITS = (6000, 42000)  #: the reference's edits, tokens before the end
AGENT_RAM_MIB, AGENT_COLD_MIB = 16, 64  #: the conversation is 209,525 x 56 B = 11.7 MB
#: the reference table: policy -> (kept, tokens before the end), {edit back: tokens re-read}
EDIT_TABLE: dict[str, tuple[list[int], dict[int, int]]] = {
    "spread": ([0, 1000, 3000, 8000, 43000, 200000], {6000: 8000, 42000: 43000}),
    "lru": ([0, 1000, 2000, 3000, 4000, 200000], {6000: 200000, 42000: 200000}),
}
#: how the engine passes its checkpoints and cuts -> how the tables name it
PATTERNS = {
    "newest-only": "newest checkpoint, cut at each turn",
    "root-and-newest": "root and newest checkpoint, no cuts",
}


@dataclass
class AgentRun:
    """The agent-edit workload through the Store, one retention policy and calling pattern."""

    policy: Policy
    pattern: str  #: one of :data:`PATTERNS`
    kept: list[int]  #: the checkpoints the last park kept, tokens before the end
    reread: dict[int, int]  #: edit back -> tokens re-read (restored from RAM)
    reread_restart: dict[int, int]  #: the same after a restart (restored from disk)
    sources: dict[str, str]  #: "6000" / "6000 restart" -> the restore's source
    resumed_turns: int  #: turns after the first that resumed at the previous turn's end
    checked: int  #: restores whose bytes were compared with the model's K/V
    mismatches: int  #: of those, restores whose bytes differed
    prefilled: int  #: tokens the engine computed over every request
    prompt_tokens: int  #: tokens of every request's prompt


def level_dir(work_dir: str, policy: Policy, pattern: str = "newest-only") -> str:
    """The disk level of the Store of ``policy`` and ``pattern`` in ``work_dir`` (the replay
    starts it empty)."""
    suffix = "" if pattern == "newest-only" else f"-{pattern}"
    return str(PurePath(work_dir, f"edit-table-{policy}{suffix}"))


def _parked(prompt: npt.NDArray[np.uint32], t: int, pattern: str) -> Conversation:
    """Turn ``t``'s conversation as the engine parks it, by ``pattern``."""
    end = len(prompt)
    root, newest = Checkpoint(SYSTEM, pinned=True), Checkpoint(end, last_used=t)
    if pattern == "root-and-newest":
        return Conversation("agent", prompt.copy(), [root, newest])
    cks = [root, newest] if t == 1 else [newest]
    return Conversation("agent", prompt.copy(), cks, cuts=[0, *range(SYSTEM, end, TURN)])


def _edited(
    held: npt.NDArray[np.uint32], back: int, rng: np.random.Generator
) -> npt.NDArray[np.uint32]:
    """The held conversation rewritten ``back`` tokens before its end (same length)."""
    at = len(held) - back
    prompt = np.concatenate([held[:at], rng.integers(0, 150_000, back, dtype=np.uint32)])
    prompt[at] = held[at] ^ 1  # the first rewritten token always differs
    return prompt


def run_agent(
    policy: Policy,
    work_dir: str,
    fp: ModelFingerprint | None = None,
    pattern: str = "newest-only",
) -> AgentRun:
    """The workload through a Store (see the module's docstring); ``work_dir`` holds its disk
    level (:func:`level_dir`)."""
    if pattern not in PATTERNS:
        raise ConfigError(f"calling pattern {pattern!r} is not one of {', '.join(PATTERNS)}")
    fp = fp or replay_fingerprint()
    rng = np.random.default_rng(4)
    held = rng.integers(0, 150_000, END, dtype=np.uint32)
    cfg = {
        "ram_mib": AGENT_RAM_MIB,
        "slots": 2,
        "checkpoints": CHECKPOINTS,
        "retention": policy,
        "cold_dir": level_dir(work_dir, policy, pattern),
        "cold_mib": AGENT_COLD_MIB,
    }
    edits = {back: _edited(held, back, rng) for back in EDITS}
    sources: dict[str, str] = {}
    with Store.open(fp, cfg, probe=plenty) as store:
        engine = Engine(store, fp)
        resumed = 0
        conv: Conversation | None = None
        for t in range(1, TURNS + 1):
            end = SYSTEM + t * TURN
            prompt = as_tokens(held[:end])
            r, kv = engine.serve(prompt)
            if t > 1 and r.tokens == end - TURN:
                resumed += 1
            conv = _parked(prompt, t, pattern)
            # the Store applies retention: conv.checkpoints is what it kept
            store.park(conv, engine.capture(kv, conv))
        assert conv is not None
        kept = sorted(END - c.length for c in conv.checkpoints)
        # the disk writes land first: a restore while they are in flight may resume from an
        # older park's manifest on disk, whose chain still has checkpoints retention has since
        # dropped (bit-exact, but then the figure depends on the writer's timing)
        store.flush()
        reread = {}
        for back, prompt in edits.items():
            r, _ = engine.serve(prompt)
            reread[back], sources[str(back)] = END - r.tokens, r.source
    with Store.open(fp, cfg, probe=plenty) as store:  # a restart: only the disk level holds it
        again = Engine(store, fp)
        reread_restart = {}
        for back, prompt in edits.items():
            r, _ = again.serve(prompt)
            reread_restart[back], sources[f"{back} restart"] = END - r.tokens, r.source
    return AgentRun(
        policy,
        pattern,
        kept,
        reread,
        reread_restart,
        sources,
        resumed,
        engine.checked + again.checked,
        engine.mismatches + again.mismatches,
        engine.prefilled + again.prefilled,
        engine.prompt_tokens + again.prompt_tokens,
    )


def run_key(policy: Policy, pattern: str) -> str:
    """How :class:`~strata_harness.replay.Replay` files a run: the policy for the newest-only
    pattern, else the policy and the pattern (``spread/root-and-newest``)."""
    return policy if pattern == "newest-only" else f"{policy}/{pattern}"
