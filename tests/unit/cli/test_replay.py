"""``strata replay``: the 200-turn edit table and the park-truncate episode run through the Store
turn by turn, as an engine drives it, give the reference tables; the simulator's figures are
printed beside them.

The 200-turn edit table: spread keeps 0, 1K, 3K, 8K, 43K and 200K before the end and re-reads 8K
(edit 6K back) and 43K (42K back); least recent use keeps 0..4K and the root and re-reads 200K for
both; alike whether the engine passes its newest checkpoint with a cut at each turn or its root
and newest checkpoint and no cuts. The park-truncate episode: with ``park_truncate`` the first
chain survives truncated to its 32,768 landing and its return restores 32,768 tokens; without, it
is evicted whole and the return restores nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from strata_harness.replay import EDIT_TABLE, PARK_TRUNCATE, Replay, run_replay
from stratastore import ConfigError


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> tuple[Replay, Path]:
    work = tmp_path_factory.mktemp("replay")
    return run_replay(str(work)), work


def test_edit_table_through_the_store(replay: tuple[Replay, Path]) -> None:
    rep, work = replay
    spread, lru = rep.agent["spread"], rep.agent["lru"]
    assert spread.kept == [0, 1000, 3000, 8000, 43000, 200000]
    assert spread.reread == spread.reread_restart == {6000: 8000, 42000: 43000}
    assert lru.kept == [0, 1000, 2000, 3000, 4000, 200000]
    assert lru.reread == lru.reread_restart == {6000: 200000, 42000: 200000}
    assert set(rep.agent) == {"spread", "lru", "spread/root-and-newest", "lru/root-and-newest"}
    for run in rep.agent.values():  # either calling pattern: the same table
        assert (run.kept, run.reread) == EDIT_TABLE[run.policy]
        assert run.reread_restart == run.reread
        assert run.resumed_turns == 199  # every turn after the first resumed at the previous end
        assert run.checked == 200 + 2 + 2 and run.mismatches == 0  # bit for bit
        assert run.sources == {
            "6000": "ram",
            "42000": "ram",
            "6000 restart": "disk",
            "42000 restart": "disk",
        }
        suffix = "" if run.pattern == "newest-only" else f"-{run.pattern}"
        assert (work / f"edit-table-{run.policy}{suffix}").is_dir()  # what the restart read


def test_truncate_table_through_the_store(replay: tuple[Replay, Path]) -> None:
    rep, _ = replay
    on, off = rep.park["on"], rep.park["off"]
    assert (on.entries, on.evictions, on.first_held, on.restored) == (2, 0, 32768, 32768)
    assert on.ram_bytes == (32768 + 76000) * 56 and on.source == "ram"
    assert (off.evictions, off.first_held, off.restored) == (1, 0, 0)  # a full re-prefill
    for mode, run in rep.park.items():
        assert {k: getattr(run, k) for k in PARK_TRUNCATE[mode]} == PARK_TRUNCATE[mode]
        assert run.checked == 4 and run.mismatches == 0


def test_the_system_prompt_cache_serves_the_low_ram_window(replay: tuple[Replay, Path]) -> None:
    """Every park discarded (free RAM under the parking floor, no disk level): without the cache
    every request reads its whole prompt again; with it every request after the first restores
    the system prompt from the cache, each hit admitted under the transient floor."""
    rep, _ = replay
    off, on = rep.prompt["off"], rep.prompt["on"]
    assert off.discards == on.discards == off.requests == 24
    assert (off.hits, off.restored, off.prefilled) == (0, 0, off.prompt_tokens)
    assert (on.fills, on.hits, on.transient_hits) == (1, 23, 23)
    assert on.restored == 23 * 4096 and on.prefilled == on.prompt_tokens - 23 * 4096
    assert on.checked == off.checked == 24 and on.mismatches == off.mismatches == 0


def test_every_row_matches_the_table_and_the_simulator(replay: tuple[Replay, Path]) -> None:
    rep, _ = replay
    assert rep.ok
    rows = [r for _, rs in rep.tables for r in rs]
    assert len(rows) == 39
    assert all(r.verdict in ("same", "-") for r in rows)
    # the simulator says the same, figure by figure (it has no low-RAM window with the cache)
    assert all(r.sim == r.store for r in rows if r.sim is not None)
    assert [r for r in rows if r.sim is None] == rep.tables[2][1]
    # bytes, "off" entries and the low-RAM window's counts: the reference is silent there
    assert sum(r.verdict == "same" for r in rows) == 28


def test_strata_replay_prints_the_tables_and_exits_0(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "replay", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "the 200-turn edit table through the Store" in out
    assert "the park-truncate episode through the Store" in out
    assert "the low-RAM window through the Store" in out
    assert out.count("figure ") == 3 and "Store (this run)" in out and "simulator" in out
    assert "differs" not in out
    assert out.rstrip().endswith("Store figures match the reference tables")
    lines = {line.split("|")[0].strip(): line for line in out.splitlines() if "|" in line}
    kept = lines["spread: kept (tokens before the end)"].split("|")
    assert [c.strip() for c in kept[1:]] == ["0, 1K, 3K, 8K, 43K, 200K"] * 3 + ["same"]
    ret = [c.strip() for c in lines["on: return of A (62,000 tokens), restored (ram)"].split("|")]
    assert ret[1:] == ["32,768", "32,768", "restored 32768 tokens (live)", "same"]
    assert (tmp_path / "edit-table-spread").is_dir()


def test_a_dir_holding_an_earlier_replay_is_refused(tmp_path: Path) -> None:
    """An earlier run's disk levels would serve the first turns: the replay starts empty."""
    (tmp_path / "edit-table-spread").mkdir()
    (tmp_path / "edit-table-spread" / "x").write_bytes(b"")
    with pytest.raises(ConfigError, match="pass a new or empty --dir"):
        run_replay(str(tmp_path))
