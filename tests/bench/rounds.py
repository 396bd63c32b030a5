"""Interleaved rounds for the benchmarks that set the store beside a baseline on the same bytes:
every operation once a round, in order, so both see the same machine at the same moment."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def interleaved_rounds(
    benchmark: Any, ops: dict[str, Callable[[], object]], rounds: int = 5
) -> dict[str, list[float]]:
    """Run ``ops`` in ``rounds`` rounds after one warmup round, under pytest-benchmark's
    ``pedantic`` (which times the whole round); return each operation's seconds in the timed
    rounds (the warmup's dropped). With ``--benchmark-disable`` pytest-benchmark runs one round
    and the lists hold that round."""
    times: dict[str, list[float]] = {name: [] for name in ops}

    def one_round() -> None:
        for name, op in ops.items():
            t = time.perf_counter()
            op()
            times[name].append(time.perf_counter() - t)

    benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=1)
    return {name: secs[-rounds:] for name, secs in times.items()}
