"""A value of another type inside the namespace is "a format error: a miss or a ladder stop for a
restore, a finding for fsck, never a crash" (README), and redis_backend._call turns WRONGTYPE into
FormatError. But every record read (STRLEN+GETRANGE) and every walk step (HGETALL of kids) runs in a
pipeline, whose error reads "Command # 1 (...) of pipeline caused error: WRONGTYPE ...": it does not
start with WRONGTYPE, so it is a RemoteError, "the server is down": the breaker opens (every prompt
skips the level) and fsck --repair crashes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stratastore.levels.redis.settings import namespace
from tests.conftest import kv_bytes, run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import (
    BOUND,
    FP,
    backend,
    conversation,
    open_store,
    park,
    segment_of,
    store_config,
    unique_name,
)

redis = import_or_skip("redis")


TB = FP.token_bytes


def _raw(server: RedisServer) -> Any:
    return redis.Redis(**server.client_kwargs(), socket_timeout=10)


def test_a_kids_listing_of_another_type_does_not_take_the_remote_level_down(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """Node A parks X and Y (pushed). X's second level of `kids` is a plain string. Node C
    restores X's prompt (at most a miss past the damage), then Y's: Y must come from the
    remote level. Before: the WRONGTYPE was a RemoteError, the breaker opened, Y was skipped
    (and remote_errors counted a server failure that never happened)."""
    name = unique_name()
    url = redis_session_server.url
    x, x_kv = conversation("x", 1000, [32, 64], seed=3)
    y, y_kv = conversation("y", 5000, [64], seed=4)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        park(a, x, x_kv)
        park(a, y, y_kv)
    finally:
        run_with_timeout(a.close, BOUND)
    r = _raw(redis_session_server)
    try:
        kids = f"{namespace(name, FP)}kids/{{{segment_of(x, 0).hex()}}}"
        r.delete(kids)
        r.set(kids, b"not a hash")
    finally:
        r.close()
    c = open_store(store_config(tmp_path, "c", url, name, remote_keep_local=False))
    try:
        out = np.zeros(64 * TB, np.uint8)
        run_with_timeout(lambda: c.restore(np.arange(1000, 1064), out), BOUND)
        out[:] = 0
        got = run_with_timeout(lambda: c.restore(np.arange(5000, 5064), out), BOUND)
        remote = c.stats()["levels"]["remote"]
        assert (got.source, got.tokens) == ("remote", 64), (
            got,
            remote["remote_errors"],
            remote["remote_skipped"],
        )
        assert np.array_equal(out, y_kv)
        assert remote["remote_errors"] == 0, remote
    finally:
        run_with_timeout(c.close, BOUND)


def test_fsck_repair_of_a_record_name_of_another_type_finishes(
    redis_session_server: RedisServer,
) -> None:
    """A hash at a segment's commit-record name: fsck files it under bad_records, and --repair
    must remove it (the backend has _DROP_NOT_STRING for exactly this, behind `except
    FormatError`) and rebuild the listing. Before: delete() raised RemoteError (the pipelined
    WRONGTYPE) and fsck --repair stopped there, the listing and `used` not rebuilt."""
    name = unique_name()
    b = backend(redis_session_server.url, name)
    r = _raw(redis_session_server)
    try:
        put = b.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0)
        r.delete(b._rec_key(put.key))
        r.hset(b._rec_key(put.key), "x", "y")
        rep = run_with_timeout(lambda: b.fsck(repair=True), BOUND)
        assert put.key in rep.bad_records and rep.repaired
        assert not r.exists(b._rec_key(put.key))
        assert run_with_timeout(b.fsck, BOUND).clean
    finally:
        for n in r.scan_iter(match=f"{b.ns}*"):
            r.delete(n)
        r.close()
        b.close()
