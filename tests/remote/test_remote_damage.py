"""Damage in the remote level is found, counted and repaired, against a real ``redis-server``:

* ``strata fsck --remote --deep`` hashes every page of every remote segment (bounded reads) and
  names a damaged one by its finding id and segment; ``--repair --yes`` removes it under the
  commit protocol and the namespace then checks clean (the plain check samples first and last
  pages only, as the local fsck does);
* a restore that meets a damaged remote segment ladders once: the segment is checked again,
  counted (``remote_damaged``), said once with what asked, and removed, so no later restore
  (on any node) ladders on it again;
* ``fsck --remote`` judges every commit record against the model its namespace's own name
  carries: another model's records there are findings repair removes, whichever is met first;
* a server that refuses connections is said as refused, naming no namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from stratastore.levels.redis.backend import RedisBackend
from tests.conftest import kv_bytes, tiny_fp
from tests.redis_servers import RedisServer, free_port
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import (
    FP,
    THREE,
    conversation,
    open_store,
    park,
    remote_stats,
    restore,
    unique_name,
)
from tests.remote.test_fsck_remote_cli import backend, no_traceback, strata

redis = import_or_skip("redis")


def _flip(r: Any, b: RedisBackend, key: bytes, offset: int) -> None:
    """One byte of segment ``key``'s stored payload flipped in Redis, at ``offset``."""
    [part] = [n for n in r.scan_iter(match=f"{b.ns}p/{{{key.hex()}}}/*/0")]
    byte = r.getrange(part, offset, offset)
    r.setrange(part, offset, bytes([byte[0] ^ 0x40]))


def test_fsck_remote_deep_finds_a_flipped_byte_and_repair_removes_it(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = unique_name()
    b = backend(redis_server.url, name, FP)
    r = redis.Redis(**redis_server.client_kwargs(), socket_timeout=10)
    try:
        keep = b.put_kv(FP.digest(), np.arange(64), kv_bytes(FP, 64), token_start=0).key
        bad = b.put_kv(FP.digest(), np.arange(500, 564), kv_bytes(FP, 64, 1), token_start=0).key
        page = b.record(bad).page_bytes
        _flip(r, b, bad, page + 7)  # the second of four pages: a sampling check misses it

        plain = strata(tmp_path, redis_server.url, name, "fsck", "--remote")
        no_traceback(plain)
        assert plain.returncode == 0, plain.stdout + plain.stderr  # sampled: first and last

        deep = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--deep")
        no_traceback(deep)
        assert deep.returncode == 1, deep.stdout + deep.stderr
        assert f"PAGE_HASH_MISMATCH: segment {bad.hex()} page 1" in deep.stdout, deep.stdout
        js = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--deep", "--json")
        [ns] = json.loads(js.stdout)["namespaces"]
        assert ns["damaged"] == 1 and not ns["clean"]
        assert ns["findings"] == [{"id": "PAGE_HASH_MISMATCH", "segment": bad.hex(), "page": 1}]
        assert bad in b and keep in b  # a check changes nothing

        fixed = strata(
            tmp_path, redis_server.url, name, "fsck", "--remote", "--deep", "--repair", "--yes"
        )
        no_traceback(fixed)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert bad not in b and keep in b
        assert b.get_bytes(keep, max_bytes=1 << 20) == kv_bytes(FP, 64).tobytes()
        again = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--deep")
        assert again.returncode == 0, again.stdout
        assert not list(r.scan_iter(match=f"{b.ns}*{{{bad.hex()}}}*")), "parts left behind"
    finally:
        r.close()
        b.close()


def test_a_restore_that_meets_remote_damage_removes_it_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = unique_name()
    a_warn: list[str] = []
    a = open_store(tmp_path, "a", redis_server.url, name, a_warn)
    conv, kv = conversation("c", 1000, THREE)
    try:
        park(a, conv, kv)
        level = a._tiers.remote
        assert level is not None
        keys = [k for _, _, k in conv.segments(FP.digest())]
        r = redis.Redis(**redis_server.client_kwargs(), socket_timeout=10)
        _flip(r, level.store, keys[1], 5)
        r.close()
    finally:
        a.close()
    for node in ("b", "c"):  # two more nodes: the first meets the damage, the second never
        warnings: list[str] = []
        n = open_store(tmp_path, node, redis_server.url, name, warnings, remote_keep_local=False)
        try:
            got = restore(n, conv.tokens, kv, {40, 120} if node == "b" else {40})
            assert got.source == "remote" and got.tokens == 40
            got = restore(n, conv.tokens, kv, {40})  # again: no ladder, nothing said
            s = remote_stats(n)["levels"]["remote"]
            said = [w for w in warnings if "damaged" in w]
            if node == "b":
                assert s["remote_damaged"] == 1 and s["remote_ladder_stops"] == 1, s
                assert len(said) == 1, warnings
                assert keys[1].hex()[:16] in said[0] and "removed" in said[0]
                assert "a prompt of 120 tokens" in said[0] and "remote:" not in said[0]
            else:
                assert s["remote_damaged"] == 0 and s["remote_ladder_stops"] == 0, s
                assert said == [], warnings
        finally:
            n.close()
    # the nodes that hold it locally put it back, whole, with their next park
    a = open_store(tmp_path, "a", redis_server.url, name)
    try:
        park(a, conv, kv)
        c = open_store(tmp_path, "c", redis_server.url, name, remote_keep_local=False)
        try:
            assert restore(c, conv.tokens, kv, {120}).tokens == 120
        finally:
            c.close()
    finally:
        a.close()


def test_a_namespace_is_judged_by_its_own_model(redis_server: RedisServer, tmp_path: Path) -> None:
    """Namespace A holds only a record copied from model B's namespace (first or not: it is
    the only one), and namespace B holds its own valid one beside another copied from A: each
    foreign record is a bad record, repair removes it, both namespaces then check clean, and
    the valid records stay."""
    fp_a, fp_b = tiny_fp("damage/model-a"), tiny_fp("damage/model-b")
    name = unique_name()
    a, b = backend(redis_server.url, name, fp_a), backend(redis_server.url, name, fp_b)
    r = redis.Redis(**redis_server.client_kwargs(), socket_timeout=10)
    try:
        a_key = a.put_kv(fp_a.digest(), np.arange(32), kv_bytes(fp_a, 32), token_start=0).key
        b_key = b.put_kv(fp_b.digest(), np.arange(32), kv_bytes(fp_b, 32), token_start=0).key
        # B's record (and its parts) copied under A's namespace, A's under B's
        for src, dst, key in ((b, a, b_key), (a, b, a_key)):
            for k in list(r.scan_iter(match=f"{src.ns}*{{{key.hex()}}}*")):
                r.restore(dst.ns + k.decode()[len(src.ns) :], 0, r.dump(k), replace=True)
        a._r.delete(a._rec_key(a_key))  # namespace A: only the foreign record is left
        got = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--json")
        no_traceback(got)
        assert got.returncode == 1, got.stdout + got.stderr
        rows = {row["namespace"]: row for row in json.loads(got.stdout)["namespaces"]}
        assert rows[a.ns]["bad_records"] == 1 and rows[b.ns]["bad_records"] == 1, rows
        assert rows[b.ns]["model"] == fp_b.describe() and rows[a.ns]["model"] is None
        fixed = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--repair", "--yes")
        no_traceback(fixed)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert b_key in b and b.get_bytes(b_key, max_bytes=1 << 20) == kv_bytes(fp_b, 32).tobytes()
        assert not list(r.scan_iter(match=f"{a.ns}*{{{b_key.hex()}}}*"))
        assert not list(r.scan_iter(match=f"{b.ns}*{{{a_key.hex()}}}*"))
    finally:
        r.close()
        a.close()
        b.close()


def test_fsck_remote_on_a_refused_connection_says_refused(tmp_path: Path) -> None:
    got = strata(tmp_path, f"redis://127.0.0.1:{free_port()}/0", unique_name(), "fsck", "--remote")
    no_traceback(got)
    assert got.returncode == 2, got.stdout + got.stderr
    assert "refused" in got.stderr.lower() and "errno 104" not in got.stderr, got.stderr
    assert "strata/" not in got.stderr, got.stderr  # no namespace: none was read
