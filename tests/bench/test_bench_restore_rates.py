"""Benchmark: a validated restore into the engine's pool, cold and hot, and a durable park, each
beside the machine's own rate on the same bytes (:mod:`strata_harness.restore_rates`: the raw
cold read, numpy's load + scatter, BLAKE3 on both cores, a read + BLAKE3 on both cores, a raw
write + fsync), rounds interleaved. Prints the table and its ratios with their spread; asserts
nothing of time.

``make bench`` (``STRATA_BENCH_SCALE=full``) runs 1 GiB, five rounds: the figures of
docs/performance.md come from ``tools/cold_restore.py --rounds 5``, the same code; ``make
test`` runs 32 MiB, one round, so every operation and check keeps running."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from strata_harness.restore_rates import OPS, RATIOS, measure, render
from tests.bench.test_bench_peers import _evicts

FULL = os.environ.get("STRATA_BENCH_SCALE") == "full"
TOKENS, ROUNDS = (8192, 5) if FULL else (256, 1)


def test_restore_and_park_beside_the_machines_rates(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "restore rates"
    if not _evicts(tmp_path):
        pytest.skip(f"{tmp_path} cannot evict from the page cache (tmpfs?): no cold reads")
    rates = benchmark.pedantic(
        measure,
        args=(str(tmp_path),),
        kwargs={"tokens": TOKENS, "rounds": ROUNDS},
        rounds=1,
        iterations=1,
    )
    assert set(rates.gbps) == set(OPS)
    assert all(len(v) == ROUNDS and min(v) > 0 for v in rates.gbps.values())
    assert rates.nbytes == TOKENS * 128 * 1024
    text = render(rates)
    assert all(f"{mine} / {other}" in text for mine, other, _ in RATIOS)
    assert not list(tmp_path.iterdir()), "the benchmark left files behind"
    print("\n" + text)
