"""The remote level in the park / lookup / restore flow (tiers/remote.py, tiered.py, facade.py): a
remote failure never costs a restore what the local levels hold, the walk finds the deepest prefix,
and a remote_keep_local copy that does not land is not reported as a lost acknowledged park."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stratastore.tiers.remote import RemoteHit
from tests.conftest import run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import (
    BOUND,
    FP,
    conversation,
    open_store,
    park,
    store_config,
    unique_name,
)

import_or_skip("redis")

TB = FP.token_bytes


def test_a_remote_failure_never_restores_less_than_the_local_levels_hold(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Node A parked tokens [0, 120) cut at 40/80 (pushed); node B holds the same tokens
    [0, 100) on its own disk, cut at 50. B's lookup prefers the longer remote chain; the server
    dies before the read. B must still restore the 100 tokens its disk holds (a remote failure
    never fails a local restore); before its fix it restored 0."""
    name = unique_name()
    a_conv, kv = conversation("a", 1000, [40, 80, 120], seed=7)
    b_conv, _ = conversation("b", 1000, [50, 100], seed=7)
    a = open_store(store_config(tmp_path, "a", redis_server.url, name))
    try:
        park(a, a_conv, kv)
    finally:
        run_with_timeout(a.close, BOUND)
    local = open_store(store_config(tmp_path, "b", None, name))  # B's own park, no remote
    try:
        park(local, b_conv, kv[: 100 * TB])
    finally:
        run_with_timeout(local.close, BOUND)

    b = open_store(store_config(tmp_path, "b", redis_server.url, name, remote_timeout_ms=1000))
    try:
        level = b._tiers.remote
        assert level is not None
        real = level.lookup

        def lookup(prompt: object, media: object) -> RemoteHit | None:
            hit = real(prompt, media)  # type: ignore[arg-type]
            redis_server.kill()  # the remote level fails between the lookup and the read
            return hit

        level.lookup = lookup  # type: ignore[method-assign]
        out = np.zeros(120 * TB, np.uint8)
        got = run_with_timeout(lambda: b.restore(np.arange(1000, 1120), out), BOUND)
        n = got.tokens * TB
        assert np.array_equal(out[:n], kv[:n]) and not out[n:].any()
        assert got.tokens >= 100, f"the local disk holds 100 tokens; restored {got}"
    finally:
        run_with_timeout(b.close, BOUND)


def test_the_walk_finds_the_deepest_prefix_the_remote_level_holds(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """RemoteLevel.lookup promises "the deepest whole-segment prefix of prompt the remote level
    holds". With chains [0,50),[50,100) and [0,40),[40,80),[80,120) of the same tokens both
    stored, a prompt of 120 tokens must find 120; the greedy longest-child-first walk stops
    at 100 and never backtracks."""
    name = unique_name()
    url = redis_session_server.url
    a_conv, kv = conversation("a", 1000, [40, 80, 120], seed=7)
    b_conv, _ = conversation("b", 1000, [50, 100], seed=7)
    for sub, conv, data in (("a", a_conv, kv), ("b", b_conv, kv[: 100 * TB])):
        s = open_store(store_config(tmp_path, sub, url, name))
        try:
            park(s, conv, data)
        finally:
            run_with_timeout(s.close, BOUND)
    c = open_store(store_config(tmp_path, "c", url, name))
    try:
        found = run_with_timeout(lambda: c.lookup(np.arange(1000, 1120)), BOUND)
        assert found == ("remote", 120), found
    finally:
        run_with_timeout(c.close, BOUND)


def test_a_kept_local_copy_that_does_not_land_is_not_a_lost_park(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """Node B (a 1 MiB disk level) restores a 1.5 MiB conversation from the remote level; its
    remote_keep_local copy does not fit. That copy is an optimisation B made by itself: it may
    be warned about, but flush()/close() must not raise SpillError "acknowledged parks did not
    land" for a conversation ('remote:...') the caller never parked."""
    name = unique_name()
    url = redis_session_server.url
    n = 24576
    conv, kv = conversation("big", 100, list(range(4096, n + 1, 4096)), seed=9)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        park(a, conv, kv)
    finally:
        run_with_timeout(a.close, BOUND)
    warns: list[str] = []
    b = open_store(store_config(tmp_path, "b", url, name, cold_mib=1), warns)
    try:
        out = np.zeros_like(kv)
        got = run_with_timeout(lambda: b.restore(np.arange(100, 100 + n), out), BOUND)
        assert (got.source, got.tokens) == ("remote", n) and np.array_equal(out, kv)
        run_with_timeout(b.flush, BOUND)  # before its fix: SpillError
        # counted once, and only as a copy not kept (before: a discard and a refused spill,
        # and remote_kept_local beside remote_kept_local_errors for the one copy)
        s = b.stats()
        remote = s["levels"]["remote"]
        seen = {
            "discards": s["discards"],
            "spills_refused": s["spills_refused"],
            "remote_kept_local": remote["remote_kept_local"],
            "remote_kept_local_errors": remote["remote_kept_local_errors"],
        }
        assert seen == {
            "discards": 0,
            "spills_refused": 0,
            "remote_kept_local": 0,
            "remote_kept_local_errors": 1,
        }, seen
    finally:
        run_with_timeout(b.close, BOUND)


def test_a_dead_remote_level_costs_a_local_restore_one_timeout_not_one_per_segment(
    tmp_path: Path,
) -> None:
    """A local conversation of 20 segments, 19 of whose files are gone (damage, or another
    process's GC); the remote level is a server that never answers (remote_timeout_ms=500) and
    its breaker is open from the failed open. The local restore must not wait on the remote
    level per missing segment: tiered.holder() asks it `key in store` for every piece,
    bypassing the breaker (~21 s here; 200 s with the default 5 s timeout)."""
    from tests.remote.test_faults import Silent

    conv, kv = conversation("c", 100, list(range(16, 321, 16)), seed=1)
    s = open_store(store_config(tmp_path, "a", None, "x"))
    try:
        park(s, conv, kv)
    finally:
        run_with_timeout(s.close, BOUND)
    for _, _, key in list(conv.segments(FP.digest()))[1:]:
        for ext in ("seg", "side"):
            (tmp_path / "a" / f"strata-conv-{key.hex()}.{ext}").unlink()
    silent = Silent()
    try:
        url = f"redis://127.0.0.1:{silent.port}/0"
        store = open_store(store_config(tmp_path, "a", url, unique_name(), remote_timeout_ms=500))
        try:
            out = np.zeros_like(kv)
            got = run_with_timeout(lambda: store.restore(np.arange(100, 420), out), 8)
            assert got.source == "disk"
        finally:
            store._tiers.remote._down_until = float("inf")  # type: ignore[union-attr]
            run_with_timeout(store.close, BOUND)
    finally:
        silent.close()
