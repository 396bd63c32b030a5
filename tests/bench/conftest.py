"""Print the side-by-side figures of the store benchmark at the end of the run."""

from __future__ import annotations

import statistics
from typing import Any

PAIRS = [
    ("put (durable)", "raw write+fsync"),
    ("get_into (validated, hot)", "raw read (hot)"),
    ("view (validated, hot)", "raw read (hot)"),
]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.bench.test_bench_store import ROUNDS, SAMPLES, SEGMENTS, TOTAL

    if not SAMPLES or len(next(iter(SAMPLES.values()))) < 2:
        return  # not run, or one untimed round (--benchmark-disable)
    med = {k: statistics.median(v[1:]) for k, v in SAMPLES.items()}  # drop the warmup round
    gbs = {k: TOTAL / v / 1e9 for k, v in med.items()}
    tr = terminalreporter
    tr.write_sep(
        "-",
        f"stratastore vs raw, {TOTAL / 2**30:.2f} GiB in {SEGMENTS} segments, "
        f"medians of {ROUNDS} interleaved rounds",
    )
    for name, base in PAIRS:
        tr.write_line(
            f"{name:<28}{gbs[name]:6.2f} GB/s   {base:<17}{gbs[base]:6.2f} GB/s   "
            f"ratio {gbs[name] / gbs[base]:.2f}x"
        )
