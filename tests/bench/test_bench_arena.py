"""Benchmark: a capture copied into the pre-reserved, prefaulted arena against the same copy into
freshly allocated memory (first touch), 1 GiB, in one run. Measures only."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np

from stratastore.tiers.arena import Arena

MIB = int(os.environ.get("STRATA_BENCH_MIB", "1024"))
NBYTES = MIB << 20


def test_capture_into_arena_vs_first_touch(benchmark: Any) -> None:
    src = np.random.default_rng(0).integers(0, 256, NBYTES, dtype=np.uint8)
    arena = Arena(NBYTES)
    times: dict[str, list[float]] = {"arena": [], "fresh": []}

    def one_round() -> None:
        a = arena.alloc(NBYTES)
        assert a is not None
        t = time.perf_counter()
        arena.write(a, src)
        times["arena"].append(time.perf_counter() - t)
        arena.release(a)
        t = time.perf_counter()
        fresh = np.empty(NBYTES, dtype=np.uint8)
        fresh[:] = src
        times["fresh"].append(time.perf_counter() - t)
        del fresh

    benchmark.group = "capture"
    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    if benchmark.stats is not None:
        a, f = (NBYTES / statistics.median(times[k][1:]) / 1e9 for k in ("arena", "fresh"))
        print(
            f"\ncapture of {MIB} MiB: arena {a:.2f} GB/s, fresh memory {f:.2f} GB/s, "
            f"ratio {a / f:.1f}x (hugepages {'on' if arena.hugepages else 'off'})"
        )
    arena.close()
