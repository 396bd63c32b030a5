"""``strata replay``: two workloads run through the :class:`~stratastore.Store` as an engine
drives it, turn by turn, with the simulator's figures and the reference tables beside them.

``strata sim`` (:mod:`strata_harness.sim`) runs the policy code directly. The replay runs
the same workloads through the public Store API only (``Store.open``, ``park``, ``restore``,
``lookup``, ``flush``, ``close``), the way an engine does: every request restores its prompt,
checks the restored prefix byte for byte against the K/V the engine computes, prefills the
rest, and parks the conversation with its checkpoints when it leaves its slot
(:mod:`.replay_engine`: the tiny model and the engine's side). The workloads:

- **agent edit** (:mod:`.replay_agent`): a system prompt then 200 turns, checkpoint retention
  ``spread`` against ``lru``, then the history rewritten 6K and 42K tokens before its end; with
  the engine passing its newest checkpoint and a cut at each turn, and again passing its root
  and newest checkpoint and no cuts;
- **park truncate** (:mod:`.replay_park`): two interleaved requests push a RAM level's byte
  budget over while a long chain is parked, with ``park_truncate`` on and off;
- **the low-RAM window** (:mod:`.replay_prompt`): conversations sharing a system prompt while
  free RAM stays under the parking floor, with no disk level (every park discarded), without and
  with the system-prompt cache.

Each figure (a :class:`Row`) sets the Store's value beside the simulator's and the reference
table's; :attr:`Replay.ok` says every figure the reference gives matches and every restore was
bit-exact.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_harness.replay_agent import (
    CHECKPOINTS,
    EDIT_TABLE,
    EDITS,
    PATTERNS,
    SYSTEM,
    TURN,
    TURNS,
    AgentRun,
    level_dir,
    run_agent,
    run_key,
)
from strata_harness.replay_engine import replay_fingerprint
from strata_harness.replay_park import (
    BUDGET_MIB,
    EVERY,
    FIRST,
    MIN_TOKENS,
    OTHERS,
    PARK_RAM_MIB,
    PARK_TRUNCATE,
    PARK_TRUNCATE_TEXT,
    SIM_TOKEN_KIB,
    SLOTS,
    ParkRun,
    run_park,
)
from strata_harness.replay_prompt import (
    CONVERSATIONS,
    ROUNDS,
    WINDOW_MIB,
    PromptRun,
    cache_dir,
    run_prompt,
)
from strata_harness.replay_prompt import SYSTEM as PROMPT_SYSTEM
from strata_harness.sim import AgentEdit, ParkTruncate, run_agent_edit, run_park_truncate
from stratastore.chain import Policy
from stratastore.errors import ConfigError
from stratastore.io import files

__all__ = [
    "EDIT_TABLE",
    "PARK_TRUNCATE",
    "AgentRun",
    "ParkRun",
    "PromptRun",
    "Replay",
    "Row",
    "format_replay",
    "replay_fingerprint",
    "run_agent",
    "run_park",
    "run_replay",
]

Value = int | float | list[int]


@dataclass(frozen=True)
class Row:
    """One figure: the Store's (this run), the simulator's, the reference's (``None``: the
    reference table does not give it) and the reference's own words for it."""

    figure: str
    store: Value
    sim: Value | None
    reference: Value | None
    reference_text: str = ""
    unit: str = ""  #: "MiB": shown with one decimal, as MiB

    @property
    def verdict(self) -> str:
        """``same``/``differs``: the Store against the reference; ``-`` where it is silent."""
        if self.reference is None:
            return "-" if self.sim is None or self.sim == self.store else "differs from sim"
        return "same" if self.store == self.reference else "differs"


@dataclass
class Replay:
    """What :func:`run_replay` measured; ``ok``: every Store figure the reference tables give
    matches and every restore was bit-exact."""

    #: "spread" / "lru" (the newest-only pattern), "spread/root-and-newest" / "lru/root-and-newest"
    agent: dict[str, AgentRun]
    park: dict[str, ParkRun]  #: "on" / "off" (park_truncate)
    prompt: dict[str, PromptRun] = field(default_factory=dict)  #: "off" / "on" (the cache)
    tables: list[tuple[str, list[Row]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        runs: list[AgentRun | ParkRun | PromptRun] = [
            *self.agent.values(),
            *self.park.values(),
            *self.prompt.values(),
        ]
        return all(r.verdict != "differs" for _, rows in self.tables for r in rows) and not any(
            r.mismatches for r in runs
        )

    def to_json(self) -> dict[str, Any]:
        def row(r: Row) -> dict[str, Any]:
            return {
                "figure": r.figure,
                "store": r.store,
                "sim": r.sim,
                "reference": r.reference,
                "verdict": r.verdict,
            }

        return {
            "ok": self.ok,
            "edit_table": {k: vars(v) for k, v in self.agent.items()},
            "park_truncate": {k: vars(v) for k, v in self.park.items()},
            "system_prompt_cache": {k: vars(v) for k, v in self.prompt.items()},
            "tables": {title: [row(r) for r in rows] for title, rows in self.tables},
        }


def _agent_rows(run: AgentRun) -> list[Row]:
    p = run.policy
    who = p if run.pattern == "newest-only" else f"{p}, {PATTERNS[run.pattern]}"
    ref_kept, ref_reread = EDIT_TABLE[p]
    sims = {
        back: run_agent_edit(AgentEdit(SYSTEM, TURNS, TURN, CHECKPOINTS, back, p)) for back in EDITS
    }
    rows = [
        Row(
            f"{who}: kept (tokens before the end)",
            run.kept,
            sims[EDITS[0]]["kept"],
            ref_kept,
            _ks(ref_kept),
        )
    ]
    for back in EDITS:
        sim, ref = sims[back]["reread_tokens"], ref_reread[back]
        text = f"reads {_k(ref)}"
        rows.append(
            Row(
                f"{who}: edit {_k(back)} back, re-read ({run.sources[str(back)]})",
                run.reread[back],
                sim,
                ref,
                text,
            )
        )
        rows.append(
            Row(
                f"{who}: same after a restart ({run.sources[f'{back} restart']})",
                run.reread_restart[back],
                sim,
                ref,
                text,
            )
        )
    return rows


def _park_rows(run: ParkRun, tb: int) -> list[Row]:
    mode = "on" if run.truncate else "off"
    sim = run_park_truncate(
        ParkTruncate(
            BUDGET_MIB, SLOTS, MIN_TOKENS, EVERY, FIRST, OTHERS, SIM_TOKEN_KIB, 0, run.truncate
        )
    )
    step = sim["steps"][-1]  # the 3rd request's park (of B)
    sim_held = FIRST
    for s in sim["steps"]:
        sim_held = 0 if "A" in s["evicted"] else dict(s["shrunk"]).get("A", sim_held)
    ref, text = PARK_TRUNCATE[mode], PARK_TRUNCATE_TEXT[mode]
    mib = run.ram_bytes / tb * SIM_TOKEN_KIB / 1024  # tokens held x the simulator's KiB a token
    rows = [
        Row(
            f"{mode}: entries after the 3rd request",
            run.entries,
            step["cache_entries"],
            ref.get("entries"),
            text.get("entries", ""),
        ),
        Row(
            f"{mode}: bytes then (MiB at {SIM_TOKEN_KIB} KiB/token)",
            round(mib, 1),
            step["cache_mib"],
            None,
            text.get("bytes", ""),
            "MiB",
        ),
        Row(
            f"{mode}: evictions then",
            run.evictions,
            sim["counters"]["evictions"],
            ref.get("evictions"),
            text.get("evictions", ""),
        ),
        Row(
            f"{mode}: tokens of A held then",
            run.first_held,
            sim_held,
            ref.get("first_held"),
            text.get("first_held", ""),
        ),
        Row(
            f"{mode}: return of A ({FIRST:,} tokens), restored ({run.source})",
            run.restored,
            sim["restored_tokens"],
            ref.get("restored"),
            text.get("restored", ""),
        ),
    ]
    return rows


def _prompt_rows(run: PromptRun) -> list[Row]:
    """The low-RAM window's figures. The reference (the low-RAM episode's rule) says how a hit
    is admitted, not how many there are: its figure is the Store's hits, each admitted under
    the transient floor."""
    mode = "with the system-prompt cache" if run.cache else "RAM level alone"
    rows = [
        Row(f"{mode}: parks discarded (no disk level)", run.discards, None, None),
        Row(f"{mode}: tokens restored", run.restored, None, None),
        Row(f"{mode}: tokens read again (prefilled)", run.prefilled, None, None),
    ]
    if run.cache:
        rows[1:1] = [
            Row(f"{mode}: system prompts written to it", run.fills, None, None),
            Row(f"{mode}: restores served from it", run.hits, None, None),
            Row(
                f"{mode}: of them, admitted under the transient floor",
                run.transient_hits,
                None,
                run.hits,
                "each one (the parking floor fails)",
            ),
        ]
    return rows


def run_replay(work_dir: str | None = None) -> Replay:
    """Run both workloads through the Store; ``work_dir`` holds the agent-edit workload's disk
    levels (default: a temporary directory, removed afterwards); levels left there by an earlier
    run are a :class:`ConfigError` (the replay starts from empty levels)."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="strata-replay-") as d:
            return run_replay(d)
    files.makedirs(work_dir)  # the --dir named: its levels are made in it
    policies: tuple[Policy, ...] = ("spread", "lru")
    runs = [(p, q) for q in PATTERNS for p in policies]
    for d in [*(level_dir(work_dir, p, q) for p, q in runs), cache_dir(work_dir)]:
        if files.is_dir(d) and files.listdir(d):
            raise ConfigError(
                f"replay: {d} already holds a store (an earlier replay?); the replay starts "
                "from empty levels: pass a new or empty --dir"
            )
    fp = replay_fingerprint()
    agent: dict[str, AgentRun] = {run_key(p, q): run_agent(p, work_dir, fp, q) for p, q in runs}
    park = {m: run_park(m == "on", fp) for m in ("on", "off")}
    prompt = {m: run_prompt(m == "on", work_dir, fp) for m in ("off", "on")}
    rep = Replay(agent, park, prompt)
    rep.tables = [
        (_agent_title(agent), [row for run in agent.values() for row in _agent_rows(run)]),
        (
            _park_title(park, fp.token_bytes),
            [row for run in park.values() for row in _park_rows(run, fp.token_bytes)],
        ),
        (_prompt_title(prompt), [row for run in prompt.values() for row in _prompt_rows(run)]),
    ]
    return rep


def _agent_title(agent: dict[str, AgentRun]) -> str:
    runs = list(agent.values())
    checked, bad = sum(r.checked for r in runs), sum(r.mismatches for r in runs)
    return "\n  ".join(
        [
            f"the 200-turn edit table through the Store: a {SYSTEM:,}-token system prompt, "
            f"{TURNS} turns of {TURN:,} tokens, checkpoints={CHECKPOINTS}",
            "one Store per policy and calling pattern (RAM, and a disk level for the restart); "
            "each turn restores, checks, prefills, parks",
            "the engine passes its "
            + "; or its ".join(PATTERNS.values())
            + " (the store cuts the capture where it keeps a checkpoint)",
            "turns resumed at the previous turn's end: "
            + ", ".join(f"{_who(r)} {r.resumed_turns}/{TURNS - 1}" for r in runs),
            "tokens prefilled / prompt tokens: "
            + ", ".join(f"{_who(r)} {r.prefilled:,} / {r.prompt_tokens:,}" for r in runs),
            f"restores bit-exact: {checked - bad}/{checked}",
        ]
    )


def _who(run: AgentRun) -> str:
    return run_key(run.policy, run.pattern)


def _park_title(park: dict[str, ParkRun], tb: int) -> str:
    checked = sum(r.checked for r in park.values())
    bad = sum(r.mismatches for r in park.values())
    return "\n  ".join(
        [
            f"the park-truncate episode through the Store: A {FIRST:,} tokens, B {OTHERS[0]:,}, "
            f"C {OTHERS[1]:,}, then A again; park_truncate on / off",
            f"RAM level only: {PARK_RAM_MIB} MiB at {tb} B/token ({PARK_RAM_MIB * 2**20 // tb:,} "
            f"tokens; the simulator: {BUDGET_MIB:,} MiB at {SIM_TOKEN_KIB} KiB/token, "
            f"{BUDGET_MIB * 1024 // SIM_TOKEN_KIB:,})",
            f"{SLOTS} slots, min_tokens {MIN_TOKENS:,}, a checkpoint every {EVERY:,} tokens; "
            f"restores bit-exact: {checked - bad}/{checked}",
            "bytes: the reference does not give its K/V size a token, so they are not compared",
        ]
    )


def _prompt_title(prompt: dict[str, PromptRun]) -> str:
    runs = list(prompt.values())
    checked, bad = sum(r.checked for r in runs), sum(r.mismatches for r in runs)
    first = runs[0]
    return "\n  ".join(
        [
            f"the low-RAM window through the Store: {CONVERSATIONS} conversations sharing a "
            f"{PROMPT_SYSTEM:,}-token system prompt, {ROUNDS} rounds, "
            f"{first.requests} requests",
            f"free RAM {WINDOW_MIB} MiB throughout: under snapshot + the parking floor, over "
            "snapshot + the transient floor; no disk level, so every park is discarded",
            "prompt tokens: "
            + ", ".join(f"{r.prompt_tokens:,}" for r in runs[:1])
            + f"; restores bit-exact: {checked - bad}/{checked}",
        ]
    )


# -- output -------------------------------------------------------------------------------------
def _k(n: int) -> str:
    """``8000`` -> ``8K`` (the reference's notation); other counts with separators."""
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
    """The tables: figure | Store (this run) | simulator | reference | verdict, one per scenario."""
    lines: list[str] = []
    headers = ["figure", "Store (this run)", "simulator", "reference", "verdict"]
    for title, rows in rep.tables:
        cells = [
            [
                r.figure,
                _show(r.store, r.unit),
                _show(r.sim, r.unit),
                r.reference_text or _show(r.reference),
                r.verdict,
            ]
            for r in rows
        ]
        widths = [max(len(x) for x in col) for col in zip(headers, *cells, strict=True)]
        lines += [title, ""]
        for i, line in enumerate([headers, *cells]):
            padded = [
                x.ljust(w) if j == 0 else x.rjust(w)
                for j, (x, w) in enumerate(zip(line, widths, strict=True))
            ]
            lines.append("  " + " | ".join(padded))
            if i == 0:
                lines.append("  " + "-+-".join("-" * w for w in widths))
        lines.append("")
    lines.append(
        "Store figures match the reference tables"
        if rep.ok
        else "Store figures DIFFER from the reference tables (or a restore was not bit-exact)"
    )
    return "\n".join(lines)
