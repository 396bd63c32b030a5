"""Benchmark: a local hit's restore and lookup with the remote level healthy, paused (SIGSTOP),
gone (the server killed), and with no remote level at all, in one run; prints each median and
the ratio paused/healthy (about 1: a local hit never waits on the remote level). Measures,
never asserts a time; under ``--benchmark-disable`` each runs once and prints nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from tests.conftest import run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import BOUND, FP, conversation, open_store, park, unique_name
from tests.remote.test_local_first import paused

import_or_skip("redis")

ENDS = [256, 512, 768, 1024]  #: a 1,024-token conversation in four segments
MEDIANS: dict[tuple[str, str], float] = {}


@pytest.fixture
def held(
    redis_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Store, Any, Any]]:
    """A store holding one conversation on its local disk level, its remote level as the
    test's ``state`` says."""
    state = request.node.callspec.params["state"]
    if state == "none":
        store = Store.open(
            FP, {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "a"), "cold_mib": 256}
        )
    else:
        store = open_store(tmp_path, "a", redis_server.url, unique_name(), remote_timeout_ms=2000)
    conv, kv = conversation("c", 1000, ENDS)
    park(store, conv, kv)
    if state == "gone":
        redis_server.kill()
    try:
        with paused(redis_server) if state == "paused" else contextlib.nullcontext():
            yield store, conv, kv
    finally:
        run_with_timeout(store.close, BOUND)


@pytest.mark.parametrize("op", ["restore", "lookup"])
@pytest.mark.parametrize("state", ["healthy", "paused", "gone", "none"])
def test_bench_local_hit_beside_the_remote_level(
    benchmark: Any, held: tuple[Store, Any, Any], op: str, state: str
) -> None:
    store, conv, kv = held
    prompt = np.asarray(conv.tokens)
    out = np.zeros_like(kv)
    benchmark.group = f"local hit: {op}"
    if op == "restore":
        got = benchmark(store.restore, prompt, out)
        assert got.source == "disk" and got.tokens == ENDS[-1]
        assert np.array_equal(out, kv)
    else:
        assert benchmark(store.lookup, prompt) == ("disk", ENDS[-1])
    if benchmark.stats is None:
        return
    MEDIANS[(op, state)] = med = benchmark.stats.stats.median
    print(f"\nlocal hit {op}, remote level {state}: {med * 1e6:.0f} us median")
    states = ("healthy", "paused", "gone", "none")
    if all((op, s) in MEDIANS for s in states):  # the last of the four: the ratios
        base = MEDIANS[(op, "healthy")]
        print(
            f"local hit {op}: "
            + ", ".join(f"{s}/healthy {MEDIANS[(op, s)] / base:.2f}x" for s in states[1:])
        )
