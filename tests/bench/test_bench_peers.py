"""Benchmark: ``strata bench --peers`` on a small image, hot only, one round, so the code path
stays tested in ``make test`` (the README's table is the full 1 GiB, hot and cold run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratastore.peers import run_peers


def test_peers_small(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "peers"
    doc = benchmark.pedantic(run_peers, args=(str(tmp_path),),
                             kwargs={"mib": 32, "rounds": 1, "cold": False},
                             rounds=1, iterations=1)  # fmt: skip
    assert {"stratastore (validated)", "raw", "numpy"} <= set(doc["peers"])
    for name, ops in doc["peers"].items():
        assert set(ops) == {"durable write", "read hot"}, name
        assert all(v["gb_per_s"] > 0 for v in ops.values())
    assert "park / raw write+fsync" in doc["ratios"] and "restore / raw read hot" in doc["ratios"]
