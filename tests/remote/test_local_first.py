"""The local levels come first: a prompt the local levels hold whole never waits on the remote
level, however it is (healthy, slow, paused with SIGSTOP, gone), in ``restore``,
``restore_many`` and ``lookup``; a prompt they do not hold whole asks it, and every remote call
(a chain walk with all its round trips, a read) ends within one deadline
(``remote_timeout_ms``), a cluster's retries and slot-map refreshes included.

"Never waits" is shown without a clock: the remote backend counts every call it makes, and a
local hit makes none. The deadline is shown against the setting (a hang bound, not a speed)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from tests.conftest import run_with_timeout
from tests.redis_servers import RedisCluster, RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import (
    BOUND,
    FP,
    THREE,
    conversation,
    open_store,
    park,
    remote_stats,
    restore,
    unique_name,
)

import_or_skip("redis")

TIMEOUT_MS = 2000


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """``server`` stopped (SIGSTOP: connections are accepted by the kernel, never answered)."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def count_calls(store: Store) -> list[str]:
    """Every call the store's remote backend makes from now on, by operation."""
    level = store._tiers.remote
    assert level is not None
    backend = level.store
    real = backend._call
    made: list[str] = []

    def call(op: str, key: Any, fn: Any, **kw: Any) -> Any:
        made.append(op)
        return real(op, key, fn, **kw)

    backend._call = call  # type: ignore[method-assign]
    return made


def _local_hit_calls(store: Store, conv: Any, kv: Any) -> list[str]:
    made = count_calls(store)
    prompt = np.asarray(conv.tokens)
    assert restore(store, prompt, kv, {120}).source == "disk"
    out = np.zeros_like(kv)
    [r] = run_with_timeout(lambda: store.restore_many([(prompt, out)]), BOUND)
    assert r.source == "disk" and r.tokens == 120
    assert run_with_timeout(lambda: store.lookup(prompt), BOUND) == ("disk", 120)
    # the engine's usual call: one token left to compute; the local levels hold all it can use
    longer = np.concatenate([prompt, [7, 7, 7]])
    out = np.zeros(len(longer) * FP.token_bytes, np.uint8)
    got = run_with_timeout(lambda: store.restore(longer, out, max_tokens=120), BOUND)
    assert got.source == "disk" and got.tokens == 120
    return made


@pytest.mark.parametrize("state", ["healthy", "paused", "gone"])
def test_a_local_hit_never_calls_the_remote_level(
    redis_server: RedisServer, tmp_path: Path, state: str
) -> None:
    store = open_store(tmp_path, "a", redis_server.url, unique_name(), remote_timeout_ms=TIMEOUT_MS)
    try:
        conv, kv = conversation("c", 1000, THREE)
        park(store, conv, kv)  # on the local disk level, and pushed to the remote level
        before = remote_stats(store)["levels"]["remote"]
        if state == "gone":
            redis_server.kill()
        with paused(redis_server) if state == "paused" else contextlib.nullcontext():
            made = _local_hit_calls(store, conv, kv)
        assert made == [], f"a local hit asked the remote level: {made}"
        after = remote_stats(store)["levels"]["remote"] if state == "healthy" else None
        if after is not None:
            for k in ("remote_hits", "remote_misses", "remote_errors", "remote_skipped"):
                assert after[k] == before[k], (k, before, after)
    finally:
        run_with_timeout(store.close, BOUND)


def test_a_prompt_held_in_part_walks_the_remote_level_within_one_deadline(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The local levels hold 80 of 120 tokens: the remote level is asked, and with the server
    paused the walk ends within one deadline (it took two: the client's retry), then the local
    80 are restored."""
    a = open_store(tmp_path, "a", redis_server.url, unique_name(), remote_timeout_ms=TIMEOUT_MS)
    try:
        conv, kv = conversation("c", 1000, [40, 80])
        park(a, conv, kv[: 80 * FP.token_bytes])
        prompt = np.arange(1000, 1120)
        with paused(redis_server):
            started = time.monotonic()
            r = restore(
                a, prompt, np.concatenate([kv, np.zeros(40 * FP.token_bytes, np.uint8)]), {80}
            )
            took = time.monotonic() - started
        assert r.source == "disk"
        assert took < 1.6 * TIMEOUT_MS / 1000, f"{took:.2f} s for one deadline of {TIMEOUT_MS} ms"
        assert remote_stats(a)["levels"]["remote"]["remote_errors"] == 1
    finally:
        run_with_timeout(a.close, BOUND)


def test_a_remote_call_to_a_paused_cluster_master_takes_one_deadline(
    redis_bin: tuple[str, str], tmp_path: Path
) -> None:
    """One of three masters paused, ``remote_timeout_ms = 1000``: node B (nothing local)
    restores a prompt whose segment lives on that master; the restore ends within one
    deadline (it took three: the store's retry, then the cluster client's own retries and
    slot-map refreshes), as a miss, the failure counted."""
    timeout_ms = 1000
    with RedisCluster(tmp_path / "cluster", binaries=redis_bin) as cluster:
        name = unique_name()
        a = open_store(tmp_path, "a", cluster.url, name, remote_timeout_ms=timeout_ms)
        b = open_store(tmp_path, "b", cluster.url, name, remote_timeout_ms=timeout_ms)
        try:
            conv, kv = conversation("c", 3000, [64])
            park(a, conv, kv)
            key = conv.segment_keys(FP.digest())[0].key
            level = a._tiers.remote
            assert level is not None
            owner = cluster.slot_owner(cluster.keyslot(level.store._rec_key(key)))
            with paused(owner):
                started = time.monotonic()
                r = restore(b, np.asarray(conv.tokens), kv, {0, 64})
                took = time.monotonic() - started
            assert r.tokens == 0
            assert took < 1.6 * timeout_ms / 1000, (
                f"{took:.2f} s for one deadline of {timeout_ms} ms"
            )
            assert remote_stats(b)["levels"]["remote"]["remote_errors"] >= 1
        finally:
            run_with_timeout(a.close, BOUND)
            run_with_timeout(b.close, BOUND)
