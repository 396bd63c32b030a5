"""Benchmark: the validated two-pass restore against a raw read and np.load of the same bytes
(``strata bench`` runs the full 1 GiB hot and cold comparison; this keeps it exercised in
``make test`` with a small hot-only image, and times it under ``make bench``)."""

from __future__ import annotations

import os
from typing import Any

from strata_harness.bench import run_bench

MIB = int(os.environ.get("STRATA_BENCH_RESTORE_MIB", "128"))


def test_restore_vs_raw_and_np_load(benchmark: Any, tmp_path: Any) -> None:
    benchmark.group = "restore"
    doc = benchmark.pedantic(
        run_bench,
        args=(str(tmp_path),),
        kwargs={"mib": MIB, "rounds": 2, "cold": False},
        rounds=1,
        iterations=1,
    )
    assert set(doc["gb_per_s"]) == {
        "restore (validated) hot",
        "raw read hot",
        "np.load hot",
        "4 restores one by one hot",
        "4 restores batched hot",
        "4 restores, 1 thread, continuous agenda hot",
        "4 restores, 2 threads, continuous agenda hot",
        "4 restores, 4 threads, continuous agenda hot",
        "4 restores, 4 threads, own pipelines hot",
    }
    assert set(doc["ratios"]) >= {
        "batched/one restore hot",
        "batched/one by one hot",
        "continuous 1/batched hot",
        "continuous 4/batched hot",
        "continuous 4/own pipelines hot",
    }
    assert all(v > 0 for v in doc["gb_per_s"].values())
    if benchmark.stats is not None:
        print("\n" + "  ".join(f"{k}: {v:.2f} GB/s" for k, v in doc["gb_per_s"].items()))
