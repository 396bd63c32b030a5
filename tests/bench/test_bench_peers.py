"""Benchmark: ``strata bench --peers`` by its full protocol (the engine layout, fresh results
compared bit for bit, cold reads after a verified eviction, a fresh process per operation) on 16
MiB, one round after the warmup, so that ``make test`` keeps every comparison running. It checks the
document, never a time: the README's table is the 1 GiB run."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata_harness.peer_protocol import PeersBenchError, compare, evict, resident, shape, warm
from strata_harness.peer_report import POOL_TARGETS, TARGETS
from strata_harness.peers import render_peers, run_peers
from stratastore.cli import main

LAYER, FLAT = "stratastore (LayerKV)", "stratastore (flat page layout)"
PAGED = "stratastore (PagedKV, validated)"
NUMPY = "numpy np.save / np.load (+ fsync)"
RATES = ("read_hot", "read_cold", "prefix_hot", "prefix_cold")


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _evicts(where: Path) -> bool:
    """Whether this filesystem lets a file's pages leave the page cache (tmpfs does not)."""
    probe = where / "probe"
    probe.write_bytes(bytes(1 << 16))
    try:
        return evict([str(probe)]) == 0.0
    finally:
        probe.unlink()


def test_peers_small(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "peers"
    if not _evicts(tmp_path):
        pytest.skip(f"{tmp_path} cannot evict from the page cache (tmpfs?): no cold reads")
    doc = benchmark.pedantic(
        run_peers, args=(str(tmp_path),), kwargs={"mib": 16, "rounds": 1}, rounds=1, iterations=1
    )
    assert doc["tokens"] == 128 and doc["prefix_tokens"] == 64 and doc["cold"]
    rows = {r["engine"]: r for r in doc["rows"]}
    assert {LAYER, FLAT, NUMPY} <= set(rows)
    assert ("safetensors (+ fsync)" in rows) == _have("safetensors")
    assert ("torch.save / torch.load (+ fsync)" in rows) == _have("torch")
    assert any(n.startswith("LMCache") for n in rows) == (_have("lmcache") and _have("torch"))
    for name, r in rows.items():
        ram = name.endswith("RAM backend")
        assert all((r[k] or 0) > 0 for k in RATES if not (ram and k.endswith("cold"))), name
        assert name == FLAT or ram or r["durable_write"] > 0, name
        assert r["rss_read"] > 0 and r["rss_write"] > 0, name
    assert rows[LAYER]["durable_write_without_pack_pages"] > rows[LAYER]["durable_write"]
    assert len(doc["limits"]) == 8 and all(v > 0 for v in doc["limits"].values())
    # the engine-pool protocol: the same engines, reading into and parking from one pool
    pool = {r["engine"]: r for r in doc["pool"]["rows"]}
    assert set(pool) == {PAGED, *(n for n in rows if n not in (LAYER, FLAT))}
    for name, r in pool.items():
        ram = name.endswith("RAM backend")
        assert all((r[k] or 0) > 0 for k in RATES if not (ram and k.endswith("cold"))), name
        assert ram or r["durable_write"] > 0, name
        assert r["rss_growth_read"] is not None and r["rss_growth_read"] >= 0, name
    # a validated restore into the pool adds its bounded staging at most, never a copy
    assert pool[PAGED]["rss_growth_read"] < pool[NUMPY]["rss_growth_read"]
    pool_names = {r["name"] for r in doc["pool"]["ratios"]}
    assert {t[0] for t in POOL_TARGETS if "LMCache" not in t[0]} <= pool_names
    # every read of both rounds (the warmup's too) was compared: raw 5 (fresh and touched, hot
    # and cold, memcpy), numpy, safetensors and torch 4 each, stratastore 8, LMCache 4 + 2;
    # in the pool, 4 each and LMCache 4 + 2
    lmcache = sum(n.startswith("LMCache") for n in rows)
    files = len(rows) - 2 - lmcache
    per_round = 5 + 8 + 4 * files + (6 if lmcache else 0) + 4 + 4 * files + (6 if lmcache else 0)
    bit = doc["bit_for_bit"]
    assert bit["all_equal"] and bit["results_compared"] == 2 * per_round
    assert bit["bytes_compared"] > 2 * per_round * doc["bytes"] // 2
    pc = doc["page_cache"]
    assert pc["evictions"] >= 2 * 8 and pc["max_resident_after_eviction"] <= 0.01
    assert pc["min_resident_before_hot"] >= 0.99
    names = {r["name"] for r in doc["ratios"]}
    measured = {t[0] for t in TARGETS if "LMCache" not in t[0]}
    assert measured <= names, measured - names
    assert all(isinstance(r["met"], bool) and r["missed_by_pct"] >= 0 for r in doc["ratios"])
    assert min(doc["load_1m"].values()) >= 0
    text = render_peers(doc)
    parts = ("| engine ", LAYER, FLAT, PAGED, "The engine's pool", "A fresh result", "Limits: raw")
    for part in (*parts, "Targets", "1-minute load"):
        assert part in text, part


def test_compare_refuses_a_flipped_bit(tmp_path: Path) -> None:
    """The check the benchmark counts on: one flipped bit in a result is an error."""
    kv = np.random.default_rng(1).integers(0, 256, 32 * 4 * 8 * 128 * 2, np.uint8)
    kv.tofile(tmp_path / "source.bin")
    job = {"op": "test", "source": str(tmp_path / "source.bin"), "tokens": 2}
    good = kv.view(np.float16).reshape(shape(2)).copy()
    assert compare(good, job, 2) == kv.nbytes
    assert compare(good[:, :, :1].copy(), job, 1) == kv.nbytes // 2
    bad = good.copy()
    bad.view(np.uint8)[-1] ^= 1
    with pytest.raises(PeersBenchError, match="differ"):
        compare(bad, job, 2)


def test_eviction_is_verified(tmp_path: Path) -> None:
    """mincore sees the pages a read brought in and the eviction removed."""
    if not _evicts(tmp_path):
        pytest.skip(f"{tmp_path} cannot evict from the page cache (tmpfs?)")
    path = tmp_path / "data"
    path.write_bytes(np.ones(1 << 20, np.uint8).tobytes())
    assert warm([str(path)]) == 1.0
    assert evict([str(path)]) == 0.0
    assert resident([str(path)]) == (0, (1 << 20) // os.sysconf("SC_PAGE_SIZE"))


def test_cli_refuses_a_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--peers", "--mib", "16", "--dir", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert code == 2 and "strata: error: --dir" in err and "Traceback" not in err
