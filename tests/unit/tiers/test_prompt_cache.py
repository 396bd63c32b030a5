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


@pytest.mark.parametrize(
    "spelled",
    [
        lambda p: f"file://{p / 'cold'}",  # the same folder as a file:// URL
        lambda p: str(p / "cold" / "inner"),  # inside a level
        lambda p: str(p),  # a level inside it
    ],
)
def test_a_folder_of_its_own_however_spelled(tmp_path: Path, spelled: Any) -> None:
    cfg = cache_cfg(tmp_path, cold_dir=str(tmp_path / "cold"), cold_mib=8)
    cfg["prompt_cache_dir"] = spelled(tmp_path)
    with pytest.raises(ConfigError, match="a directory of its own"):
        Store.open(FP, cfg)


@pytest.mark.parametrize("create_dirs", [False, True])
def test_a_url_is_refused_by_its_scheme_alone(tmp_path: Path, create_dirs: bool) -> None:
    cfg = cache_cfg(tmp_path, create_dirs=create_dirs)
    cfg["prompt_cache_dir"] = "redis://alice:s3cret@cache.example:6379/0"
    with pytest.raises(ConfigError) as e:
        Store.open(FP, cfg)
    assert "redis://..." in str(e.value)
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)


def test_the_names_of_the_stores_own_levels_are_refused_for_a_level(tmp_path: Path) -> None:
    for name in ("ram", "prompt_cache", "remote"):
        levels = [{"name": name, "dir": str(tmp_path / name), "mib": 8}]
        with pytest.raises(ConfigError, match="give it another name"):
            Store.open(FP, {"ram_mib": 1, "levels": levels})


def test_a_hybrid_model_fills_only_where_a_state_was_saved(tmp_path: Path) -> None:
    """A hybrid (recurrent) model resumes only where its running state was saved: a pinned
    prefix parked without its state is not an entry; with it, the entry gives it back."""
    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0)) as store:
        conv = chat("a", 40, 1)
        store.park(conv, capture(conv, 1), {len(conv.tokens): b"newest state"})
        assert store.stats()["prompt_cache_fills"] == 0
        conv = chat("b", 40, 2)
        store.park(conv, capture(conv, 2), {SYSTEM: b"system state", len(conv.tokens): b"x"})
        new = chat("c", 30, 3)
        r = store.restore(new.tokens, np.zeros(len(new.tokens) * FP.token_bytes, np.uint8))
        assert (r.source, r.tokens, r.state) == ("prompt_cache", SYSTEM, b"system state")


def test_a_truncated_park_still_fills_its_pinned_prefix(tmp_path: Path) -> None:
    """park_truncate keeps a prefix below the system prompt in RAM: the capture held all of
    the system prompt, so the cache takes it whole."""
    big = np.arange(200_000, 200_000 + 18_000)  # 1.1 MiB of pinned prefix: over the RAM level
    cfg = cache_cfg(tmp_path, park_truncate=True, prompt_cache_mib=8)
    with Store.open(FP, cfg) as store:
        own = np.arange(1, 6000)
        tokens = as_tokens(np.concatenate([big, own]))
        kv = np.random.default_rng(3).integers(0, 256, len(tokens) * FP.token_bytes, np.uint8)
        cks = [Checkpoint(4000), Checkpoint(len(big), pinned=True), Checkpoint(len(tokens))]
        rep = store.park(Conversation("a", tokens, cks), kv.copy())
        assert rep.where == "ram" and rep.tokens < len(big)  # the prefix that fits
        assert store.stats()["prompt_cache_fills"] == 1
        new = np.concatenate([big, [7, 7, 7]])
        out = np.zeros(len(new) * FP.token_bytes, np.uint8)
        r = store.restore(new, out)
        assert (r.source, r.tokens) == ("prompt_cache", len(big))
        assert np.array_equal(out[: len(big) * FP.token_bytes], kv[: len(big) * FP.token_bytes])


def test_a_damaged_entry_is_a_miss_and_the_next_park_writes_it_again(tmp_path: Path) -> None:
    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0)) as store:
        conv = chat("a", 40, 1)
        store.park(conv, capture(conv, 1))
        for seg in (tmp_path / "system-prompts").glob("strata-conv-*.seg"):
            raw = bytearray(seg.read_bytes())
            raw[-10] ^= 0xFF  # a flipped byte in its only page
            seg.write_bytes(bytes(raw))
        new = chat("b", 30, 2)
        out = np.full(len(new.tokens) * FP.token_bytes, 9, np.uint8)
        r = store.restore(new.tokens, out)
        assert (r.source, r.tokens) == ("none", 0)
        s = store.stats()
        assert s["hits_prompt_cache"] == 0 and s["restore_misses"] == 1
        again = chat("c", 40, 3)
        store.park(again, capture(again, 3))  # the same system prompt: written again, whole
        assert store.stats()["prompt_cache_fills"] == 2
        out = np.zeros(len(new.tokens) * FP.token_bytes, np.uint8)
        r = store.restore(new.tokens, out)
        assert (r.source, r.tokens) == ("prompt_cache", SYSTEM)
        assert np.array_equal(out[: SYSTEM * FP.token_bytes], SYS_KV)


def test_a_prefix_over_its_budget_is_said_once(tmp_path: Path) -> None:
    said: list[str] = []
    big = np.arange(300_000, 300_000 + 20_000)  # 1.2 MiB: over a 1 MiB budget
    with Store.open(FP, cache_cfg(tmp_path, prompt_cache_mib=1), warn=said.append) as store:
        for i in range(3):
            conv = chat(f"c{i}", 10, i, system=big)
            store.park(conv, capture(conv, i, np.zeros(len(big) * FP.token_bytes, np.uint8)))
        s = store.stats()
        assert (s["prompt_cache_fills"], s["prompt_cache_fill_errors"]) == (0, 1)
    lines = [line for line in said if "larger than its whole budget" in line]
    assert len(lines) == 1 and "prompt_cache_mib" in lines[0]


def test_prometheus_writes_its_evictions(tmp_path: Path) -> None:
    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0, prompt_cache_mib=1)) as store:
        for i in range(40):
            sys_tokens = np.arange(100_000 + 1000 * i, 100_000 + 1000 * i + 512)
            conv = chat(f"s{i}", 8, i, system=sys_tokens)
            store.park(conv, capture(conv, i, np.full(512 * FP.token_bytes, i, np.uint8)))
        evicted = store.stats()["levels"]["prompt_cache"]["evictions"]
        families = {f.name: f for f in text_string_to_metric_families(store.prometheus())}
    samples = {s.labels["level"]: s.value for s in families["strata_evictions"].samples}
    assert evicted > 0 and samples["prompt_cache"] == evicted


def test_parks_on_several_threads_write_a_prefix_once(tmp_path: Path) -> None:
    import threading

    with Store.open(FP, cache_cfg(tmp_path, ram_mib=0)) as store:
        start = threading.Barrier(4)

        def park(i: int) -> None:
            conv = chat(f"t{i}", 40, i)
            start.wait()
            store.park(conv, capture(conv, i))

        threads = [threading.Thread(target=park, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        s = store.stats()
        assert (s["prompt_cache_fills"], s["levels"]["prompt_cache"]["entries"]) == (1, 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt_cache_mib": "4"},
        {"prompt_cache_mib": -1},
        {"prompt_cache_mib": True},
        {"prompt_cache_dir": 3},
    ],
)
def test_settings_of_the_wrong_type_are_refused_by_name(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        Store.open(FP, {**cache_cfg(tmp_path), **bad})
    assert not (tmp_path / "system-prompts").exists()  # nothing made
