"""``strata fsck --remote [--repair]`` (levels/redis_backend.py fsck, levels/redis_fsck.py). It must
never delete or unlist a valid segment, and hostile values under the store name are findings, never
a crash or a read of the whole value (README)."""

from __future__ import annotations

import contextlib
import errno
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from stratastore.errors import StrataError
from stratastore.levels.redis.backend import RemoteError
from stratastore.levels.redis.fsck import fsck_remote
from stratastore.levels.redis.settings import RemoteSettings
from tests.conftest import kv_bytes, run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import BOUND, FP, backend, unique_name

redis = import_or_skip("redis")


def _raw(server: RedisServer) -> Any:
    return redis.Redis(**server.client_kwargs(), socket_timeout=30)


def _wipe(r: Any, pattern: str) -> None:
    for n in r.scan_iter(match=pattern, count=1000):
        r.delete(n)


def test_fsck_repair_never_deletes_a_segment_whose_record_read_timed_out(
    redis_session_server: RedisServer,
) -> None:
    """One commit record's read times out during fsck (a busy server, a dropped connection):
    fsck files the segment under bad_records (``except StrataError`` catches RemoteError) and
    --repair then deletes it, a whole valid segment, with its parts."""
    name = unique_name()
    b = backend(redis_session_server.url, name)
    try:
        kv = kv_bytes(FP, 16)
        put = b.put_kv(FP.digest(), np.arange(16), kv, token_start=0)
        real = b._call
        faults: list[bytes] = []

        def call(op: str, key: Any, fn: Callable[[], Any], **kw: Any) -> Any:
            if op == "read" and key == put.key and not faults:
                faults.append(key)
                raise RemoteError("read", b.path, "timed out", errno.ETIMEDOUT)
            return real(op, key, fn, **kw)

        b._call = call  # type: ignore[method-assign]
        with contextlib.suppress(StrataError):  # an aborted fsck is fine; a deletion is not
            run_with_timeout(lambda: b.fsck(repair=True), BOUND)
        b._call = real  # type: ignore[method-assign]
        assert faults, "the fault was not injected"
        assert put.key in b, "fsck --repair deleted a valid segment after a timed-out read"
        assert b.get_bytes(put.key, max_bytes=1 << 20) == kv.tobytes()
    finally:
        r = _raw(redis_session_server)
        _wipe(r, f"{b.ns}*")
        r.close()
        b.close()


def test_fsck_repair_never_unlists_a_segment_committed_while_it_ran(
    redis_session_server: RedisServer,
) -> None:
    """A node commits a segment after fsck's scan of the names and before it reads the
    listing: fsck calls the listing entry stale (listed, no commit seen) and --repair drops
    it (recs, ages, kids) and rebuilds `used` without it. The committed segment is then
    invisible: no walk finds it (kids), no budget evicts it (ages), `used` undercounts."""
    url, name = redis_session_server.url, unique_name()
    writer, checker = backend(url, name), backend(url, name)
    try:
        kv = kv_bytes(FP, 16)
        real = checker._call
        seen: list[int] = []
        put: list[Any] = []

        def call(op: str, key: Any, fn: Callable[[], Any], **kw: Any) -> Any:
            if op == "fsck" and key == "":
                seen.append(1)
                if len(seen) == 2:  # after the scan, before the listing is read
                    put.append(writer.put_kv(FP.digest(), np.arange(16), kv, token_start=0))
            return real(op, key, fn, **kw)

        checker._call = call  # type: ignore[method-assign]
        run_with_timeout(lambda: checker.fsck(repair=True), BOUND)
        checker._call = real  # type: ignore[method-assign]
        assert put and put[0].created
        key = put[0].key
        assert key in writer  # committed, whole
        assert key in [k for k, _, _ in writer.children(FP.digest())], "kids entry dropped"
        assert key in writer.keys(), "recs entry dropped"
        assert writer.used() > 0, "used rebuilt without a committed segment"
    finally:
        r = _raw(redis_session_server)
        _wipe(r, f"strata/{name}/*")
        r.close()
        writer.close()
        checker.close()


def test_fsck_remote_reports_a_value_of_another_type_and_checks_the_rest(
    redis_session_server: RedisServer,
) -> None:
    """A hash where a commit record's name is, under another prefix of the store name:
    fsck_remote's model probe (redis_fsck._model) GETs it outside its try, WRONGTYPE becomes a
    FormatError and the whole fsck fails: the store's real namespace is never checked."""
    url, name = redis_session_server.url, unique_name()
    b = backend(url, name)
    r = _raw(redis_session_server)
    try:
        b.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0)
        r.hset(f"strata/{name}/{'f' * 32}/s/{{{'ab' * 32}}}", "x", "y")
        found = run_with_timeout(lambda: fsck_remote(RemoteSettings(url, name=name)), BOUND)
        ours = [f for f in found if f.prefix == b.ns]
        assert ours and ours[0].report is not None and ours[0].report.segments == 1, found
    finally:
        _wipe(r, f"strata/{name}/*")
        r.close()
        b.close()


def test_fsck_remote_never_reads_a_huge_value_whole(redis_server: RedisServer) -> None:
    """A 256 MiB string at an `s/` name of a prefix under the store name: fsck_remote's model
    probe reads it with a plain GET (redis_fsck._model), whole, where the backend's own reads
    are bounded by STRLEN + GETRANGE (the README: "never ... a read of the whole value")."""
    name = unique_name()
    r = _raw(redis_server)
    try:
        r.setrange(f"strata/{name}/{'e' * 32}/s/{{{'cd' * 32}}}", 256 << 20, b"x")
        tracemalloc.start()
        try:
            with contextlib.suppress(StrataError):
                run_with_timeout(
                    lambda: fsck_remote(RemoteSettings(redis_server.url, name=name)), BOUND
                )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 160 << 20, f"{peak >> 20} MiB allocated for a hostile value"
    finally:
        r.close()
