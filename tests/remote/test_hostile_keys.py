"""Hostile or damaged keys *inside* a store's namespace give typed errors or are left alone; never
an untyped crash out of a park, ``stats()`` or a restore, never a huge allocation, and fsck --repair
never deletes a name it does not recognise."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore.errors import StrataError
from stratastore.format.remote_record import CommitRecord, decode_commit_record
from stratastore.levels.redis.settings import namespace
from tests.conftest import kv_bytes, run_with_timeout, tiny_fp
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import (
    BOUND,
    FP,
    backend,
    conversation,
    open_store,
    park,
    store_config,
    unique_name,
)

redis = import_or_skip("redis")

REPO = Path(__file__).resolve().parents[2]


def _raw(server: RedisServer) -> Any:
    return redis.Redis(**server.client_kwargs(), socket_timeout=10)


def test_a_hostile_ages_member_never_fails_an_acknowledged_park(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """An ``ages`` member without the ``<ns>:K`` shape (and a ``used`` over the budget, so the
    push runs the budget) must not turn an acknowledged park into a SpillError: the push's
    failure is counted and said, the park stands and flush() is quiet."""
    name = unique_name()
    ns = namespace(name, FP)
    r = _raw(redis_session_server)
    try:
        r.set(ns + "used", 10**12)  # over any budget: the push runs enforce_budget
        r.zadd(ns + "ages", {b"0": 0})  # sorts first; no ':K' part
        warns: list[str] = []
        store = open_store(
            store_config(tmp_path, "a", redis_session_server.url, name, remote_mib=1), warns
        )
        try:
            conv, kv = conversation("c", 100, [16, 32], seed=1)
            park(store, conv, kv)  # before its fix: SpillError, "acknowledged parks did not land"
            out = np.zeros_like(kv)
            got = run_with_timeout(lambda: store.restore(np.arange(100, 132), out), BOUND)
            assert (got.source, got.tokens) == ("disk", 32)
            assert np.array_equal(out, kv)
        finally:
            run_with_timeout(store.close, BOUND)
    finally:
        r.close()


def test_a_damaged_used_counter_never_crashes_stats(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """``used`` holding something that is not a number (damage, or a hand-made key): stats()
    must still answer (a typed error is caught there, the level's bytes are unknown)."""
    name = unique_name()
    ns = namespace(name, FP)
    r = _raw(redis_session_server)
    try:
        store = open_store(store_config(tmp_path, "a", redis_session_server.url, name))
        try:
            r.set(ns + "used", b"not a number")
            doc = run_with_timeout(store.stats, BOUND)  # before its fix: ValueError
            assert "remote" in doc["levels"]
        finally:
            run_with_timeout(store.close, BOUND)
    finally:
        r.close()


def test_fsck_repair_leaves_names_of_other_shapes_alone(redis_session_server: RedisServer) -> None:
    """fsck's own contract: "a name in the namespace that is not shaped as this backend's keys
    is left as it is (never judged, never deleted)". Names under ``p/`` and ``s/`` that are
    not ``p/{<64 hex>}/<32 hex>/<n>`` or ``s/{<64 hex>}`` must survive --repair."""
    name = unique_name()
    b = backend(redis_session_server.url, name, part_bytes=4096)
    r = _raw(redis_session_server)
    try:
        put = b.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0)
        k = put.key.hex()
        nonce = b._need(put.key).nonce
        foreign = [
            f"p/{{{k}}}",  # no nonce, no index
            f"p/{{{k}}}/{nonce}/not-a-number",
            f"p/{{{k}}}/{'0' * 32}/0/extra",
            "p/{}/x/0",  # an empty key
            f"p/{{{'cd' * 32}}}",
            "s/{ab}",  # a key of 1 byte, not 32
            "s/{}",
        ]
        for n in foreign:
            r.set(b.ns + n, b"someone else's value")
        run_with_timeout(lambda: b.fsck(repair=True), BOUND)
        gone = [n for n in foreign if not r.exists(b.ns + n)]
        assert not gone, f"fsck --repair deleted names it does not write: {gone}"
        assert b.get_bytes(put.key, max_bytes=1 << 20) == kv_bytes(FP, 16).tobytes()
    finally:
        for n in r.scan_iter(match=f"{b.ns}*"):
            r.delete(n)
        r.close()
        b.close()


_GIANT = textwrap.dedent(
    """
    import dataclasses, resource, sys
    sys.path.insert(0, sys.argv[2])
    from stratastore.errors import StrataError
    from stratastore.levels.redis.backend import RedisBackend
    from stratastore.levels.redis.settings import RemoteSettings
    from tests.conftest import tiny_fp
    b = RedisBackend.open(RemoteSettings(sys.argv[1], name=sys.argv[3]), tiny_fp())
    key = bytes.fromhex(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    out = []
    try:
        rep = b.fsck()
        out.append("fsck:" + ("flagged" if key in rep.bad_records + rep.missing_parts
                              else "not-flagged"))
    except StrataError as e:
        out.append("fsck:typed")
    except BaseException as e:
        out.append("fsck:" + type(e).__name__)
    for what, fn in (("get", lambda: b.get_bytes(key, max_bytes=1 << 27)),
                     ("delete", lambda: b.delete(key))):
        try:
            fn()
            out.append(what + ":ok")
        except StrataError:
            out.append(what + ":typed")
        except BaseException as e:
            out.append(what + ":" + type(e).__name__)
    print(" ".join(out))
    """
)


def test_a_commit_record_with_a_giant_part_count_is_bounded(
    redis_session_server: RedisServer,
) -> None:
    """A 337-byte commit record (a STATE sidecar of one 64 MiB page, written in parts of 1
    byte: 2^25 parts): fsck, a read and a delete must give a report or a typed error in bounded
    memory. Before the fix it decoded, and each built a list of every part's name (MemoryError
    under a 2 GiB address-space limit; without one, tens of GiB)."""
    name = unique_name()
    b = backend(redis_session_server.url, name)
    r = _raw(redis_session_server)
    try:
        put = b.put_state(b"\x11" * 32, b"a running state", token_pos=16)
        rec = b._rec_key(put.key)
        c = decode_commit_record(r.get(rec))
        big = 1 << 25
        sc = dataclasses.replace(c.sidecar, page_bytes=big, last_page_bytes=big, stored_bytes=big)
        raw = CommitRecord(c.nonce, big, 1, sc).encode()
        # (F-REM-2 allowed parts of 1 byte before the fix; now a format error)
        assert len(raw) < 1024
        r.set(rec, raw)
        got = subprocess.run(
            [
                sys.executable,
                "-c",
                _GIANT,
                redis_session_server.url,
                str(REPO),
                name,
                put.key.hex(),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert got.returncode == 0, got.stderr[-3000:]
        words = dict(w.split(":") for w in got.stdout.split())
        assert words.get("fsck") == "flagged", got.stdout
        assert words.get("get") == "typed", got.stdout
        assert words.get("delete") in ("ok", "typed"), got.stdout
    finally:
        for n in r.scan_iter(match=f"{b.ns}*"):
            r.delete(n)
        r.close()
        b.close()


def test_a_huge_value_at_a_commit_record_is_not_read_whole(redis_server: RedisServer) -> None:
    """A 256 MiB value where a commit record should be (no record is longer than ~40 MiB,
    ``_MAX_HEAD + MAX_SIDECAR_BYTES``): reading the segment and fsck refuse it as a format
    error without loading it (before the fix: ~3x the value in client memory, then FormatError)."""
    b = backend(redis_server.url, unique_name())
    r = _raw(redis_server)
    try:
        put = b.put_kv(FP.digest(), np.arange(16), kv_bytes(FP, 16), token_start=0)
        r.setrange(b._rec_key(put.key), 256 << 20, b"x")
        for what, fn in (
            ("read", lambda: b.get_bytes(put.key, max_bytes=1 << 20)),
            ("fsck", lambda: b.fsck()),
        ):
            tracemalloc.start()
            try:
                with contextlib.suppress(StrataError):
                    run_with_timeout(fn, BOUND)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            # below the hostile value's own size: it was never read whole (a bounded read of
            # the longest valid record costs ~3 x 40 MiB in redis-py's parser)
            assert peak < 160 << 20, f"{what}: {peak >> 20} MiB allocated for a hostile value"
    finally:
        r.close()
        b.close()


def test_a_commit_record_naming_another_model_is_a_ladder_stop(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """Segment 2's commit record replaced by one naming another model (same key, valid
    trailer): a restore from the remote level stops its ladder there and delivers segment 1;
    before the fix IncompatibleFingerprint escaped the restore (nothing is delivered)."""
    name = unique_name()
    url = redis_session_server.url
    conv, kv = conversation("c", 100, [16, 32, 48], seed=3)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        park(a, conv, kv)
    finally:
        run_with_timeout(a.close, BOUND)
    b0 = backend(url, name)
    r = _raw(redis_session_server)
    try:
        keys = [k for _, _, k in conv.segments(FP.digest())]
        rec = b0._rec_key(keys[1])
        c = decode_commit_record(r.get(rec))
        other = dataclasses.replace(c.sidecar, fingerprint=tiny_fp("hostile/another-model"))
        r.set(rec, CommitRecord(c.nonce, c.parts, c.part_bytes, other).encode())
    finally:
        r.close()
        b0.close()
    warns: list[str] = []
    b = open_store(store_config(tmp_path, "b", url, name), warns)
    try:
        out = np.zeros_like(kv)
        got = run_with_timeout(lambda: b.restore(np.arange(100, 148), out), BOUND)
        assert got.tokens == 16, got
        assert np.array_equal(out[: 16 * 64], kv[: 16 * 64]) and not out[16 * 64 :].any()
    finally:
        run_with_timeout(b.close, BOUND)


@pytest.fixture(autouse=True)
def _no_env_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRATA_REMOTE_USERNAME", raising=False)
    monkeypatch.delenv("STRATA_REMOTE_PASSWORD", raising=False)
