"""The system-prompt cache: a folder and a budget of its own (off when either is empty or 0),
filled from the pinned prefixes of parks once per distinct prefix, its hits read and validated
as disk hits and admitted under the transient floor when the parking floor does not hold, never
touched by the conversation levels' GC, and shown on the INFO line, in ``stats()``, the monitor
and Prometheus (an absent cache is absent everywhere)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stratastore import ConfigError, Store
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.cli import main
from tests.conftest import tiny_fp

FP = tiny_fp()  # 64 bytes a token
MIB = 1 << 20
SYSTEM = 96  # the system prompt's tokens: the pinned root
SYS_TOKENS = np.arange(50_000, 50_000 + SYSTEM)
SYS_KV = np.random.default_rng(7).integers(0, 256, SYSTEM * FP.token_bytes, dtype=np.uint8)


def chat(cid: str, n: int, seed: int, system: npt.NDArray[Any] = SYS_TOKENS) -> Conversation:
    """A conversation opening with ``system`` (its pinned root), then ``n`` tokens of its own."""
    own = np.random.default_rng(seed).integers(0, 40_000, n)
    tokens = as_tokens(np.concatenate([system, own]))
    end = len(tokens)
    return Conversation(
        cid, tokens, [Checkpoint(len(system), pinned=True), Checkpoint(end)], cuts=[0]
    )


def capture(conv: Conversation, seed: int, system_kv: npt.NDArray[np.uint8] = SYS_KV) -> Any:
    """The K/V of ``conv``: the system prompt's (the same in every conversation), then its own."""
    own = len(conv.tokens) * FP.token_bytes - system_kv.size
    rest = np.random.default_rng(seed).integers(0, 256, own, dtype=np.uint8)
    return np.concatenate([system_kv, rest])


def cache_cfg(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {
        "ram_mib": 1,
        "slots": 2,
        "prompt_cache_dir": str(tmp_path / "system-prompts"),
        "prompt_cache_mib": 4,
        **kw,
    }


def low_ram(free_mib: int) -> Callable[[], int]:
    return lambda: free_mib * MIB


def test_off_by_default_and_absent_everywhere(tmp_path: Path) -> None:
    with Store.open(FP, {"ram_mib": 1, "slots": 2}) as store:
        conv = chat("a", 40, 1)
        store.park(conv, capture(conv, 1))
        stats = store.stats()
        assert "prompt_cache" not in stats["levels"]
        assert not [k for k in stats if "prompt_cache" in k]
        assert "prompt_cache" not in store.info_line()
        assert "prompt_cache" not in store.prometheus()


@pytest.mark.parametrize("half", [{"prompt_cache_mib": 0}, {"prompt_cache_dir": ""}])
def test_half_a_cache_is_said_and_off(tmp_path: Path, half: dict[str, Any]) -> None:
    said: list[str] = []
    with Store.open(FP, cache_cfg(tmp_path, **half), warn=said.append) as store:
        assert "prompt_cache" not in store.stats()["levels"]
    assert any("system-prompt cache is OFF" in line for line in said)


def test_a_disk_levels_directory_is_refused(tmp_path: Path) -> None:
    cfg = cache_cfg(tmp_path, cold_dir=str(tmp_path / "system-prompts"), cold_mib=8)
    with pytest.raises(ConfigError, match="directory of its own"):
        Store.open(FP, cfg)


def test_filled_once_per_pinned_prefix(tmp_path: Path) -> None:
    with Store.open(FP, cache_cfg(tmp_path)) as store:
        for i, cid in enumerate("abc"):
            conv = chat(cid, 40 + i, i)
            store.park(conv, capture(conv, i))
        other = chat("d", 30, 9, system=np.arange(70_000, 70_000 + 64))
        store.park(other, capture(other, 9, np.zeros(64 * FP.token_bytes, np.uint8)))
        unpinned = Conversation("e", as_tokens(np.arange(80_000, 80_050)), [Checkpoint(50)])
        store.park(unpinned, np.zeros(50 * FP.token_bytes, np.uint8))
        s = store.stats()
        assert s["prompt_cache_fills"] == 2  # one per distinct system prompt, none unpinned
        cache = s["levels"]["prompt_cache"]
        assert cache["entries"] == 2 and cache["budget"] == 4 * MIB
        assert cache["bytes"] >= (SYSTEM + 64) * FP.token_bytes
        assert cache["dir"] == str(tmp_path / "system-prompts")


def test_a_hit_in_a_low_ram_window_restores_the_system_prompt(tmp_path: Path) -> None:
    """Free RAM below the parking floor: every park is discarded (no disk level), yet a new
    conversation with the same system prompt restores it from the cache, admitted under the
    transient floor, validated, and said so."""
    said: list[str] = []
    cfg = cache_cfg(tmp_path, min_free_mib=2560, park_min_free_mib=512)
    with Store.open(FP, cfg, probe=low_ram(1024), warn=said.append) as store:
        first = chat("a", 40, 1)
        assert store.park(first, capture(first, 1)).where == "discard"
        new = chat("b", 60, 2)
        out = np.zeros(len(new.tokens) * FP.token_bytes, np.uint8)
        r = store.restore(new.tokens, out)
        assert (r.source, r.tokens) == ("prompt_cache", SYSTEM)
        assert np.array_equal(out[: SYSTEM * FP.token_bytes], SYS_KV)
        assert store.lookup(new.tokens)[0] == "prompt_cache"  # type: ignore[index]
        s = store.stats()
        assert (s["hits_prompt_cache"], s["discards"]) == (1, 1)
        assert s["tokens_restored"] == SYSTEM
        assert "hits ram=0 prompt_cache=1" in store.info_line()
    hit = [line for line in said if "system-prompt-cache hit" in line]
    assert hit and "under the transient RAM floor" in hit[0], said


def test_a_hit_neither_floor_admits_is_refused_and_counted(tmp_path: Path) -> None:
    free = [4096]
    cfg = cache_cfg(tmp_path, min_free_mib=2560, park_min_free_mib=512)
    with Store.open(FP, cfg, probe=lambda: free[0] * MIB) as store:
        first = chat("a", 40, 1)
        store.park(first, capture(first, 1))
        store.restore(first.tokens, np.zeros(len(first.tokens) * FP.token_bytes, np.uint8))
        free[0] = 100  # under the transient floor too
        new = chat("b", 60, 2)
        r = store.restore(new.tokens, np.zeros(len(new.tokens) * FP.token_bytes, np.uint8))
        assert (r.source, r.tokens) == ("none", 0)
        assert store.stats()["prompt_cache_hits_refused"] == 1


def test_conversation_gc_never_removes_it(tmp_path: Path) -> None:
    cfg = cache_cfg(
        tmp_path,
        ram_mib=0,
        park="disk",
        cold_dir=str(tmp_path / "cold"),
        cold_mib=1,
        min_free_mib=0,
        park_min_free_mib=0,
    )
    with Store.open(FP, cfg) as store:
        for i in range(12):  # 12 x 130 KiB through the cold level's 1 MiB: its GC removes
            conv = chat(f"c{i}", 2000, i)
            store.park(conv, capture(conv, i))
        store.flush()
        s = store.stats()
        assert s["gc_removed"] + s["gc_cut"] > 0
        assert s["levels"]["prompt_cache"]["entries"] == 1  # the system prompt stayed
        assert s["levels"]["prompt_cache"]["evictions"] == 0


def test_its_own_budget_removes_its_oldest_entry_whole(tmp_path: Path) -> None:
    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0, prompt_cache_mib=1)) as store:
        for i in range(40):  # 40 distinct system prompts of 512 tokens (32 KiB) in 1 MiB
            sys_tokens = np.arange(100_000 + 1000 * i, 100_000 + 1000 * i + 512)
            conv = chat(f"s{i}", 8, i, system=sys_tokens)
            store.park(conv, capture(conv, i, np.full(512 * FP.token_bytes, i, np.uint8)))
        s = store.stats()
        cache = s["levels"]["prompt_cache"]
        assert s["prompt_cache_fills"] == 40 and cache["evictions"] > 0
        assert cache["bytes"] <= cache["budget"]
        newest = chat("n", 8, 0, system=np.arange(100_000 + 39_000, 100_000 + 39_000 + 512))
        out = np.zeros(len(newest.tokens) * FP.token_bytes, np.uint8)
        r = store.restore(newest.tokens, out)
        assert (r.source, r.tokens) == ("prompt_cache", 512)
        assert (out[: 512 * FP.token_bytes] == 39).all()
        oldest = chat("o", 8, 0, system=np.arange(100_000, 100_000 + 512))
        assert store.lookup(oldest.tokens) is None  # removed whole, nothing of it left


def test_the_cache_outlives_the_process(tmp_path: Path) -> None:
    with Store.open(FP, cache_cfg(tmp_path)) as store:
        conv = chat("a", 40, 1)
        store.park(conv, capture(conv, 1))
    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0)) as store:
        new = chat("b", 10, 3)
        out = np.zeros(len(new.tokens) * FP.token_bytes, np.uint8)
        assert store.restore(new.tokens, out).source == "prompt_cache"
        assert np.array_equal(out[: SYSTEM * FP.token_bytes], SYS_KV)


def test_info_line_prometheus_and_monitor_show_its_folder_and_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "system-prompts"
    with Store.open(FP, cache_cfg(tmp_path)) as store:
        conv = chat("a", 40, 1)
        store.park(conv, capture(conv, 1))
        line = store.info_line()
        assert f"prompt_cache=1e/0MiB/4MiB@{folder}" in line
        text = store.prometheus()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    info = families["strata_prompt_cache_info"].samples[0]
    assert info.labels == {"dir": str(folder)} and info.value == 1
    budgets = {s.labels["level"]: s.value for s in families["strata_level_budget_bytes"].samples}
    assert budgets["prompt_cache"] == 4 * MIB
    hits = {s.labels["source"] for s in families["strata_hits"].samples}
    assert "prompt_cache" in hits and "disk" not in hits
    assert main(["monitor", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    level = doc["levels"]["prompt_cache"]
    assert (level["dir"], level["budget"], level["entries"]) == (str(folder), 4 * MIB, 1)
    assert main(["monitor", str(folder), "--prometheus"]) == 0
    assert 'strata_level_budget_bytes{level="prompt_cache"} 4194304' in capsys.readouterr().out
