"""``strata replay``: seeds 004 and 001 run through the :class:`~stratastore.Store` as an engine
drives it, turn by turn, with the simulator's figures and the seeds' tables beside them (issue 14).

``strata sim`` (:mod:`stratastore.harness.sim`) runs the policy code directly. This module runs the same
workloads through the public Store API only (``Store.open``, ``park``, ``restore``, ``lookup``,
``flush``, ``close``), the way an engine does. Every request of a conversation:

1. **restore** the prompt into a fresh K/V buffer (``max_tokens = len(prompt) - 1``: the model
   always needs the last token's logits, docs/engine.md);
2. **check** the restored prefix against the K/V that the engine computes for it, byte for byte;
3. **prefill** the rest: compute the K/V of the tokens the Store did not restore;
4. **park** the conversation with its checkpoints (when it leaves its slot).

The "model" is a tiny fingerprint (2 layers x 1 KV head x 7 dims, fp16: 56 bytes a token,
16-token pages) whose K/V for the token ``id`` at position ``p`` is a row of a seeded random
table chosen by ``(id, p)``. Any prefix's K/V is therefore known without storing it, so a
restore can be checked bit for bit, and the whole replay runs in a few seconds.

**Seed 004** (``--prompt-cache-spread``): one conversation, a 9,525-token system prompt (its end
the pinned root checkpoint) then 200 turns of 1,000 tokens; each turn restores the previous
turn's conversation, prefills the new 1,000 tokens and parks the conversation with one new
checkpoint at its end (the engine passes only its newest checkpoint; the Store applies
retention across the parks of the conversation, ``checkpoints = 6``). One Store per policy,
``retention = "spread"`` and ``"lru"``. Measured: the checkpoints the last park kept, as tokens
before the end of the conversation; then the client rewrites the history 6K and 42K tokens
before the end (the sim's edit: the first rewritten token differs, the prompt keeps its
length) and the tokens re-read for each edited prompt (its length minus what
``Store.restore`` returned). The Store has a RAM level (16 MiB: the whole 11.7 MB
conversation) and a cold disk level in the work directory (every park is also written down,
``spill_on = "park"``): the edits are restored once from RAM after ``flush`` (so that no disk
write is in flight: a restore before the writer caught up may resume from an older park's
manifest, whose chain still has checkpoints retention has dropped since), then again after
``close`` and a new ``Store.open`` on the same directory (a restart: only the disk level
holds the chain). The seed's table: spread keeps 0, 1K, 3K, 8K, 43K and 200K (the root) and
re-reads 8K and 43K; least recent use keeps 0, 1K, 2K, 3K, 4K and the root and re-reads 200K
for both. The simulator's figures: :func:`stratastore.harness.sim.run_agent_edit`.

**Seed 001** (``STRATA_PARK_TRUNCATE``): the seed's 4-request scenario with its token counts
(a 62,000-token chain A, then requests B of 76,000 and C of 20,000 tokens, then A returns with
its 62,000-token prompt; a checkpoint every 4,096 tokens; 2 slots; ``min_tokens`` 4,096),
scaled down in bytes: 56 bytes a token against the simulator's 32 KiB (the seed does not give
its K/V size), and a 6 MiB RAM level against the seed's 3,500 MiB cache, i.e. 112,347 tokens of
budget against 112,000: A (62,000) and B (76,000) do not fit together, B and A's checkpoint at
32,768 do (108,768), B and the next one at 36,864 do not (112,864). The pressure is the byte
budget, as in the seed ("two interleaved requests push the byte budget over") and the
simulator; the free-RAM probe is injected (1 TiB free) so that the machine's own free RAM never
decides a park. The Store has a RAM level only (``park = "ram"``, no disk level): the seed's
conversation cache lives in RAM, and a disk level would hold A whole and serve the return from
disk, which is not the seed's scenario. ``checkpoints = 32`` keeps every checkpoint of these
chains (the seed's ``prompt-cache-every 4096`` chain is whole; with the default 6 and
``lru``, retention would keep 4,096 and the newest few of A, and the truncation could only land
at 4,096). A request restores its prompt before the conversation leaving the slot is parked
(the simulator likewise looks A up while C still holds the slot; parked first, C would be a
third entry and the 2-slot limit would evict A whole, truncation or not). Measured with
``park_truncate`` on and off: after the 3rd request (B parked) the RAM level's entries, bytes
(shown at 32 KiB a token, the simulator's size) and evictions, and how many tokens of A
``Store.lookup`` finds; then the tokens the return of A restores. The seed's table: parked=2,
evictions=0, A truncated to its 32,768 landing, "restored 32768 tokens (live)" with the patch;
evictions=1 (A dropped whole) and a full re-prefill without. The simulator's figures:
:func:`stratastore.harness.sim.run_park_truncate`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.chain import Checkpoint, Conversation, Policy, as_tokens
from stratastore.errors import ConfigError
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.harness.sim import AgentEdit, ParkTruncate, run_agent_edit, run_park_truncate
from stratastore.io import files
from stratastore.tiers.records import Restored

__all__ = [
    "AgentRun",
    "ParkRun",
    "Replay",
    "Row",
    "format_replay",
    "replay_fingerprint",
    "run_agent",
    "run_park",
    "run_replay",
]

Bytes = npt.NDArray[np.uint8]
Value = int | float | list[int]

PLENTY = 1 << 40  #: what the injected free-RAM probe reads: no floor ever binds
TABLE_ROWS = 4096  #: rows of the K/V table the tiny model draws from

# -- seed 004 -----------------------------------------------------------------------------------
SYSTEM, TURNS, TURN, CHECKPOINTS = 9525, 200, 1000, 6
END = SYSTEM + TURNS * TURN
EDITS = (6000, 42000)  #: the seed's edits, tokens before the end
AGENT_RAM_MIB, AGENT_COLD_MIB = 16, 64  #: the conversation is 209,525 x 56 B = 11.7 MB
#: the seed's table: policy -> (kept, tokens before the end), {edit back: tokens re-read}
SEED_004: dict[str, tuple[list[int], dict[int, int]]] = {
    "spread": ([0, 1000, 3000, 8000, 43000, 200000], {6000: 8000, 42000: 43000}),
    "lru": ([0, 1000, 2000, 3000, 4000, 200000], {6000: 200000, 42000: 200000}),
}

# -- seed 001 -----------------------------------------------------------------------------------
BUDGET_MIB, SLOTS, MIN_TOKENS, EVERY = 3500, 2, 4096, 4096  #: the seed's test config
FIRST, OTHERS = 62_000, (76_000, 20_000)  #: the seed's scenario (and the simulator's)
SIM_TOKEN_KIB = 32  #: the simulator's K/V a token (the seed gives none)
PARK_RAM_MIB = 6  #: 112,347 tokens of 56 bytes, against the seed's 112,000 of 32 KiB
PARK_CHECKPOINTS = 32  #: every checkpoint of a 76,000-token chain (19) is kept
#: the seed's table: truncation on/off -> {figure: value}; text: the seed's own words
SEED_001: dict[str, dict[str, int]] = {
    "on": {"entries": 2, "evictions": 0, "first_held": 32768, "restored": 32768},
    "off": {"evictions": 1, "first_held": 0, "restored": 0},
}
SEED_001_TEXT: dict[str, dict[str, str]] = {
    "on": {
        "entries": "parked=2",
        "bytes": "bytes=3.43G",
        "evictions": "evictions=0",
        "first_held": "truncated to its 32768 landing",
        "restored": "restored 32768 tokens (live)",
    },
    "off": {
        "evictions": "evictions=1",
        "first_held": "dropped whole",
        "restored": "full re-prefill",
    },
}


def replay_fingerprint() -> ModelFingerprint:
    """The tiny model of the replay: 2 layers x 1 KV head x 7 dims, fp16 (56 bytes a token)."""
    return ModelFingerprint.create("replay/tiny", n_layers=2, n_kv_heads=1, head_dim=7,
                                   page_tokens=16)  # fmt: skip


def _plenty() -> int:
    return PLENTY


class _Engine:
    """The engine's side of one Store: serves a prompt (restore, check, prefill) and counts what
    it checked and computed. K/V of token ``id`` at position ``p``: a row of a seeded table."""

    def __init__(self, store: Store, fp: ModelFingerprint, seed: int = 14) -> None:
        self.store, self.tb = store, fp.token_bytes
        rng = np.random.default_rng(seed)
        self.table = rng.integers(0, 256, (TABLE_ROWS, self.tb), dtype=np.uint8)
        self.checked = self.mismatches = self.prefilled = self.prompt_tokens = 0

    def kv(self, tokens: npt.NDArray[np.uint32], start: int) -> Bytes:
        """The K/V the model computes for ``tokens`` placed at positions ``start...``."""
        pos = np.arange(start, start + len(tokens), dtype=np.uint64)
        rows = (tokens.astype(np.uint64) * np.uint64(2654435761) + pos) % np.uint64(TABLE_ROWS)
        out: Bytes = self.table[rows].reshape(-1)
        return out

    def serve(self, prompt: npt.NDArray[np.uint32]) -> tuple[Restored, Bytes]:
        """Restore ``prompt``'s deepest stored prefix, check it bit for bit, prefill the rest;
        the Restored and the prompt's whole K/V (what the engine parks later)."""
        n = len(prompt)
        buf: Bytes = np.empty(n * self.tb, dtype=np.uint8)
        r = self.store.restore(prompt, buf, max_tokens=n - 1)
        done = r.tokens * self.tb
        self.checked += 1
        if not np.array_equal(buf[:done], self.kv(prompt[: r.tokens], 0)):
            self.mismatches += 1
        buf[done:] = self.kv(prompt[r.tokens :], r.tokens)  # prefill the rest
        self.prefilled += n - r.tokens
        self.prompt_tokens += n
        return r, buf


# -- results ------------------------------------------------------------------------------------
@dataclass
class AgentRun:
    """Seed 004 through the Store, one retention policy."""

    policy: Policy
    kept: list[int]  #: the checkpoints the last park kept, tokens before the end
    reread: dict[int, int]  #: edit back -> tokens re-read (restored from RAM)
    reread_restart: dict[int, int]  #: the same after a restart (restored from disk)
    sources: dict[str, str]  #: "6000" / "6000 restart" -> the restore's source
    resumed_turns: int  #: turns after the first that resumed at the previous turn's end
    checked: int  #: restores whose bytes were compared with the model's K/V
    mismatches: int  #: of those, restores whose bytes differed
    prefilled: int  #: tokens the engine computed over every request
    prompt_tokens: int  #: tokens of every request's prompt


@dataclass
class ParkRun:
    """Seed 001 through the Store, truncation on or off."""

    truncate: bool
    entries: int  #: RAM entries after the 3rd request (B parked)
    ram_bytes: int  #: RAM bytes then (56 bytes a token)
    evictions: int  #: RAM evictions then
    truncations: int  #: parked entries shrunk to one of their checkpoints then
    first_held: int  #: tokens of A that Store.lookup finds then (0: none)
    restored: int  #: tokens the return of A restored
    source: str  #: where they came from
    checked: int
    mismatches: int


@dataclass(frozen=True)
class Row:
    """One figure: the Store's (this run), the simulator's, the seed's (``None``: the seed's
    table does not give it) and the seed's own words for it."""

    figure: str
    store: Value
    sim: Value | None
    seed: Value | None
    seed_text: str = ""
    unit: str = ""  #: "MiB": shown with one decimal, as MiB

    @property
    def verdict(self) -> str:
        """``same``/``differs``: the Store against the seed; ``-`` where the seed is silent."""
        if self.seed is None:
            return "-" if self.sim is None or self.sim == self.store else "differs from sim"
        return "same" if self.store == self.seed else "differs"


@dataclass
class Replay:
    """What :func:`run_replay` measured; ``ok``: every Store figure the seeds give matches and
    every restore was bit-exact."""

    agent: dict[str, AgentRun]  #: "spread" / "lru"
    park: dict[str, ParkRun]  #: "on" / "off" (park_truncate)
    tables: list[tuple[str, list[Row]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        runs: list[AgentRun | ParkRun] = [*self.agent.values(), *self.park.values()]
        return all(r.verdict != "differs" for _, rows in self.tables for r in rows) and not any(
            r.mismatches for r in runs
        )

    def to_json(self) -> dict[str, Any]:
        def row(r: Row) -> dict[str, Any]:
            return {"figure": r.figure, "store": r.store, "sim": r.sim, "seed": r.seed,
                    "verdict": r.verdict}  # fmt: skip

        return {
            "ok": self.ok,
            "seed_004": {k: vars(v) for k, v in self.agent.items()},
            "seed_001": {k: vars(v) for k, v in self.park.items()},
            "tables": {title: [row(r) for r in rows] for title, rows in self.tables},
        }


# -- seed 004 -----------------------------------------------------------------------------------
def _edited(held: npt.NDArray[np.uint32], back: int, rng: np.random.Generator
            ) -> npt.NDArray[np.uint32]:  # fmt: skip
    """The held conversation rewritten ``back`` tokens before its end (same length)."""
    at = len(held) - back
    prompt = np.concatenate([held[:at], rng.integers(0, 150_000, back, dtype=np.uint32)])
    prompt[at] = held[at] ^ 1  # the first rewritten token always differs
    return prompt


def run_agent(policy: Policy, work_dir: str, fp: ModelFingerprint | None = None) -> AgentRun:
    """Seed 004 through a Store (see the module's docstring); ``work_dir``: its disk level."""
    fp = fp or replay_fingerprint()
    rng = np.random.default_rng(4)
    held = rng.integers(0, 150_000, END, dtype=np.uint32)
    cfg = {
        "ram_mib": AGENT_RAM_MIB,
        "slots": 2,
        "checkpoints": CHECKPOINTS,
        "retention": policy,
        "cold_dir": os.path.join(work_dir, f"seed-004-{policy}"),
        "cold_mib": AGENT_COLD_MIB,
    }
    edits = {back: _edited(held, back, rng) for back in EDITS}
    sources: dict[str, str] = {}
    with Store.open(fp, cfg, probe=_plenty) as store:
        engine = _Engine(store, fp)
        resumed = 0
        conv: Conversation | None = None
        for t in range(1, TURNS + 1):
            end = SYSTEM + t * TURN
            prompt = as_tokens(held[:end])
            r, kv = engine.serve(prompt)
            if t > 1 and r.tokens == end - TURN:
                resumed += 1
            newest = Checkpoint(end, last_used=t)
            cks = [Checkpoint(SYSTEM, pinned=True), newest] if t == 1 else [newest]
            conv = Conversation("agent", prompt.copy(), cks, cuts=[0, *range(SYSTEM, end, TURN)])
            store.park(conv, kv)  # the Store applies retention: conv.checkpoints is what it kept
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
    with Store.open(fp, cfg, probe=_plenty) as store:  # a restart: only the disk level holds it
        again = _Engine(store, fp)
        reread_restart = {}
        for back, prompt in edits.items():
            r, _ = again.serve(prompt)
            reread_restart[back], sources[f"{back} restart"] = END - r.tokens, r.source
    return AgentRun(policy, kept, reread, reread_restart, sources, resumed,
                    engine.checked + again.checked, engine.mismatches + again.mismatches,
                    engine.prefilled + again.prefilled,
                    engine.prompt_tokens + again.prompt_tokens)  # fmt: skip


def _agent_rows(run: AgentRun) -> list[Row]:
    p = run.policy
    seed_kept, seed_reread = SEED_004[p]
    sims = {back: run_agent_edit(AgentEdit(SYSTEM, TURNS, TURN, CHECKPOINTS, back, p))
            for back in EDITS}  # fmt: skip
    rows = [Row(f"{p}: kept (tokens before the end)", run.kept, sims[EDITS[0]]["kept"],
                seed_kept, _ks(seed_kept))]  # fmt: skip
    for back in EDITS:
        sim, seed = sims[back]["reread_tokens"], seed_reread[back]
        text = f"reads {_k(seed)}"
        rows.append(Row(f"{p}: edit {_k(back)} back, re-read ({run.sources[str(back)]})",
                        run.reread[back], sim, seed, text))  # fmt: skip
        rows.append(Row(f"{p}: same after a restart ({run.sources[f'{back} restart']})",
                        run.reread_restart[back], sim, seed, text))  # fmt: skip
    return rows


# -- seed 001 -----------------------------------------------------------------------------------
def _chain(conv_id: str, tokens: npt.NDArray[np.uint32]) -> Conversation:
    """A request's chain as the engine parks it: a checkpoint every ``EVERY`` tokens and at the
    end, a segment cut at each (the simulator's chain)."""
    lengths = [*range(EVERY, len(tokens), EVERY), len(tokens)]
    return Conversation(conv_id, tokens.copy(), [Checkpoint(n, last_used=i)
                                                 for i, n in enumerate(lengths)],
                        cuts=[0, *lengths[:-1]])  # fmt: skip


def run_park(truncate: bool, fp: ModelFingerprint | None = None) -> ParkRun:
    """Seed 001 through a Store with a RAM level only (see the module's docstring)."""
    fp = fp or replay_fingerprint()
    rng = np.random.default_rng(1)
    prompts = {name: rng.integers(0, 150_000, n, dtype=np.uint32)
               for name, n in zip("ABC", (FIRST, *OTHERS), strict=True)}  # fmt: skip
    cfg = {"ram_mib": PARK_RAM_MIB, "slots": SLOTS, "min_tokens": MIN_TOKENS, "park": "ram",
           "park_truncate": truncate, "checkpoints": PARK_CHECKPOINTS}  # fmt: skip
    with Store.open(fp, cfg, probe=_plenty) as store:
        engine = _Engine(store, fp)
        live: tuple[str, Bytes] | None = None
        after_third: dict[str, int] = {}
        r: Restored | None = None
        for i, name in enumerate(["A", "B", "C", "A"]):
            r, kv = engine.serve(prompts[name])  # the arriving prompt first
            if live is not None:  # then the conversation leaving the slot is parked
                store.park(_chain(live[0], prompts[live[0]]), live[1])
            live = (name, kv)
            if i == 2:  # after the 3rd request
                ram = store.stats()["levels"]["ram"]
                hit = store.lookup(prompts["A"])
                after_third = {"entries": ram["entries"], "ram_bytes": ram["bytes"],
                               "evictions": ram["evictions"], "truncations": ram["truncations"],
                               "first_held": hit[1] if hit else 0}  # fmt: skip
        assert r is not None
    return ParkRun(truncate, restored=r.tokens, source=r.source, checked=engine.checked,
                   mismatches=engine.mismatches, **after_third)  # fmt: skip


def _park_rows(run: ParkRun, tb: int) -> list[Row]:
    mode = "on" if run.truncate else "off"
    sim = run_park_truncate(ParkTruncate(BUDGET_MIB, SLOTS, MIN_TOKENS, EVERY, FIRST, OTHERS,
                                         SIM_TOKEN_KIB, 0, run.truncate))  # fmt: skip
    step = sim["steps"][-1]  # the 3rd request's park (of B)
    sim_held = FIRST
    for s in sim["steps"]:
        sim_held = 0 if "A" in s["evicted"] else dict(s["shrunk"]).get("A", sim_held)
    seed, text = SEED_001[mode], SEED_001_TEXT[mode]
    mib = run.ram_bytes / tb * SIM_TOKEN_KIB / 1024  # tokens held x the simulator's KiB a token
    rows = [
        Row(f"{mode}: entries after the 3rd request", run.entries, step["cache_entries"],
            seed.get("entries"), text.get("entries", "")),
        Row(f"{mode}: bytes then (MiB at {SIM_TOKEN_KIB} KiB/token)", round(mib, 1),
            step["cache_mib"], None, text.get("bytes", ""), "MiB"),
        Row(f"{mode}: evictions then", run.evictions, sim["counters"]["evictions"],
            seed.get("evictions"), text.get("evictions", "")),
        Row(f"{mode}: tokens of A held then", run.first_held, sim_held,
            seed.get("first_held"), text.get("first_held", "")),
        Row(f"{mode}: return of A ({FIRST:,} tokens), restored ({run.source})", run.restored,
            sim["restored_tokens"], seed.get("restored"), text.get("restored", "")),
    ]  # fmt: skip
    return rows


# -- the run ------------------------------------------------------------------------------------
def run_replay(work_dir: str | None = None) -> Replay:
    """Run both seeds through the Store; ``work_dir`` holds seed 004's disk levels (default: a
    temporary directory, removed afterwards); levels left there by an earlier run are a
    :class:`ConfigError` (the replay starts from empty levels)."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="strata-replay-") as d:
            return run_replay(d)
    files.makedirs(work_dir)  # the --dir named: its levels are made in it
    policies: tuple[Policy, ...] = ("spread", "lru")
    for p in policies:
        d = os.path.join(work_dir, f"seed-004-{p}")
        if os.path.isdir(d) and os.listdir(d):
            raise ConfigError(
                f"replay: {d} already holds a store (an earlier replay?); the replay starts "
                "from empty levels: pass a new or empty --dir"
            )
    fp = replay_fingerprint()
    agent: dict[str, AgentRun] = {p: run_agent(p, work_dir, fp) for p in policies}
    park = {m: run_park(m == "on", fp) for m in ("on", "off")}
    rep = Replay(agent, park)
    rep.tables = [
        (_agent_title(agent), [row for run in agent.values() for row in _agent_rows(run)]),
        (_park_title(park, fp.token_bytes),
         [row for run in park.values() for row in _park_rows(run, fp.token_bytes)]),
    ]  # fmt: skip
    return rep


def _agent_title(agent: dict[str, AgentRun]) -> str:
    runs = list(agent.values())
    checked, bad = sum(r.checked for r in runs), sum(r.mismatches for r in runs)
    return "\n  ".join([
        f"seed 004 through the Store: a {SYSTEM:,}-token system prompt, {TURNS} turns of "
        f"{TURN:,} tokens, checkpoints={CHECKPOINTS}",
        "one Store per policy (RAM, and a disk level for the restart); each turn restores, "
        "checks, prefills, parks",
        "turns resumed at the previous turn's end: "
        + ", ".join(f"{r.policy} {r.resumed_turns}/{TURNS - 1}" for r in runs),
        "tokens prefilled / prompt tokens: "
        + ", ".join(f"{r.policy} {r.prefilled:,} / {r.prompt_tokens:,}" for r in runs),
        f"restores bit-exact: {checked - bad}/{checked}",
    ])  # fmt: skip


def _park_title(park: dict[str, ParkRun], tb: int) -> str:
    checked = sum(r.checked for r in park.values())
    bad = sum(r.mismatches for r in park.values())
    return "\n  ".join([
        f"seed 001 through the Store: A {FIRST:,} tokens, B {OTHERS[0]:,}, C {OTHERS[1]:,}, "
        "then A again; park_truncate on / off",
        f"RAM level only: {PARK_RAM_MIB} MiB at {tb} B/token ({PARK_RAM_MIB * 2**20 // tb:,} "
        f"tokens; the simulator: {BUDGET_MIB:,} MiB at {SIM_TOKEN_KIB} KiB/token, "
        f"{BUDGET_MIB * 1024 // SIM_TOKEN_KIB:,})",
        f"{SLOTS} slots, min_tokens {MIN_TOKENS:,}, a checkpoint every {EVERY:,} tokens; "
        f"restores bit-exact: {checked - bad}/{checked}",
        "bytes: the seed does not give its K/V size a token, so they are not compared",
    ])  # fmt: skip


# -- output -------------------------------------------------------------------------------------
def _k(n: int) -> str:
    """``8000`` -> ``8K`` (the seed's notation); other counts with separators."""
    return f"{n // 1000}K" if n and n % 1000 == 0 else f"{n:,}"


def _ks(values: Sequence[int]) -> str:
    return ", ".join(_k(v) for v in values)


def _show(value: Value | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return _ks(value)
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    return f"{value:,}"


def format_replay(rep: Replay) -> str:
    """The tables: figure | Store (this run) | simulator | seed | verdict, one per scenario."""
    lines: list[str] = []
    headers = ["figure", "Store (this run)", "simulator", "seed", "verdict"]
    for title, rows in rep.tables:
        cells = [[r.figure, _show(r.store, r.unit), _show(r.sim, r.unit),
                  r.seed_text or _show(r.seed), r.verdict] for r in rows]  # fmt: skip
        widths = [max(len(x) for x in col) for col in zip(headers, *cells, strict=True)]
        lines += [title, ""]
        for i, line in enumerate([headers, *cells]):
            padded = [x.ljust(w) if j == 0 else x.rjust(w)
                      for j, (x, w) in enumerate(zip(line, widths, strict=True))]  # fmt: skip
            lines.append("  " + " | ".join(padded))
            if i == 0:
                lines.append("  " + "-+-".join("-" * w for w in widths))
        lines.append("")
    lines.append("Store figures match the seeds' tables" if rep.ok
                 else "Store figures DIFFER from the seeds' tables (or a restore was not "
                 "bit-exact)")  # fmt: skip
    return "\n".join(lines)
