"""The Redis backend passes the shipped backend suite (``stratastore.testing``) against a real
``redis-server`` and a real 3-master Redis Cluster; and what is its own: parts, commits, races
between writers, the chain index, fsck of its namespace."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from stratastore.format import Level, ModelFingerprint
from stratastore.format.remote_record import CommitRecord
from stratastore.levels import SegmentBackend
from stratastore.levels.local import SegmentNotFound
from stratastore.levels.redis.backend import RedisBackend
from stratastore.levels.redis.settings import RemoteSettings
from stratastore.testing import BackendTests
from tests.conftest import kv_bytes, tiny_fp

pytest.importorskip("redis")

PART = 4096  #: small parts, so the suite's segments span several


def _name(path: Path) -> str:
    """A namespace of its own for each directory the suite hands out."""
    return "t" + blake3.blake3(str(path).encode()).hexdigest()[:24]


class _RedisSuite(BackendTests):
    url = ""

    def make_backend(
        self, path: Path, fingerprint: ModelFingerprint, level: Level
    ) -> SegmentBackend:
        settings = RemoteSettings(self.url, name=_name(path), part_bytes=PART)
        return RedisBackend.open(settings, fingerprint, level)

    def corrupt(self, backend: SegmentBackend, key: bytes, offset: int) -> None:
        assert isinstance(backend, RedisBackend)
        c = backend._need(key)
        part, at = divmod(offset, c.part_bytes)
        name = backend._part(key, c.nonce, part)
        raw = backend._r  # the client itself: a raw SET no method of the backend sees
        value = bytearray(raw.get(name))
        value[at] ^= 1
        raw.set(name, bytes(value))


class TestRedisStandaloneBackend(_RedisSuite):
    @pytest.fixture(autouse=True)
    def _server(self, redis_session_server: Any) -> None:
        self.url = redis_session_server.url


class TestRedisClusterBackend(_RedisSuite):
    @pytest.fixture(autouse=True)
    def _server(self, redis_cluster: Any) -> None:
        self.url = redis_cluster.url


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_session_server" if request.param == "standalone" else "redis_cluster"
    server = request.getfixturevalue(fixture)
    return str(server.url)


def _backend(url: str, tmp_path: Path, name: str = "", part: int = PART) -> RedisBackend:
    return RedisBackend.open(
        RemoteSettings(url, name=name or _name(tmp_path), part_bytes=part), tiny_fp()
    )


def test_ranges_across_parts(url: str, tmp_path: Path) -> None:
    """A segment of several parts reads back whole and in ranges that cross part boundaries;
    its parts share one hash tag (one cluster slot)."""
    b = _backend(url, tmp_path)
    fp = b.fingerprint
    data = kv_bytes(fp, 300, seed=5)  # 19,200 bytes: 5 parts of 4,096
    key = b.put_kv(fp.digest(), np.arange(300), data, token_start=0).key
    c = b._need(key)
    assert c.parts == 5 and c.part_bytes == PART
    # the commit record as stored (F-REM-2): its head, then the sidecar's bytes
    assert b._r.get(b._rec_key(key)) == CommitRecord(c.nonce, 5, PART, c.sidecar).encode()
    for lo, n in ((0, 19200), (4000, 200), (4095, 4098), (8191, 1), (16000, 3200)):
        out = np.zeros(n, np.uint8)
        assert b.read_into(key, lo, out) == n
        assert np.array_equal(out, data[lo : lo + n])
    out = np.zeros_like(data)
    b.get_into(key, out)
    assert np.array_equal(out, data)
    tags = {b._part(key, c.nonce, i).split("{")[1].split("}")[0] for i in range(c.parts)}
    assert tags == {key.hex()} and b._rec_key(key).split("{")[1].startswith(key.hex())
    b.close()


def test_two_writers_of_one_key_store_it_once(url: str, tmp_path: Path) -> None:
    """Eight threads on two clients put the same segment at once: one copy is committed, one
    ``used`` count, no part left over, and the bytes read back."""
    a, b = _backend(url, tmp_path, "race"), _backend(url, tmp_path, "race")
    fp = a.fingerprint
    data = kv_bytes(fp, 200, seed=9)
    created: list[bool] = []
    barrier = threading.Barrier(8)

    def put(be: RedisBackend) -> None:
        barrier.wait()
        created.append(be.put_kv(fp.digest(), np.arange(200), data, token_start=0).created)

    threads = [threading.Thread(target=put, args=(a if i % 2 else b,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert created.count(True) == 1, created
    key = a.keys()[0]
    assert a.keys() == [key] and a.used() == a.record(key).total_bytes
    report = a.fsck()
    assert report.clean and report.segments == 1, report
    out = np.zeros_like(data)
    b.get_into(key, out)
    assert np.array_equal(out, data)
    a.close()
    b.close()


def test_the_chain_index_names_children(url: str, tmp_path: Path) -> None:
    b = _backend(url, tmp_path)
    fp = b.fingerprint
    root = fp.digest()
    k1 = b.put_kv(root, np.arange(8), kv_bytes(fp, 8), token_start=0).key
    k2 = b.put_kv(k1, np.arange(8, 20), kv_bytes(fp, 12, 1), token_start=8).key
    k3 = b.put_kv(k1, np.arange(30, 34), kv_bytes(fp, 4, 2), token_start=8).key
    assert b.children(root) == [(k1, 0, 8)]
    assert sorted(b.children(k1)) == sorted([(k2, 8, 20), (k3, 8, 12)])
    b.delete(k2)
    assert b.children(k1) == [(k3, 8, 12)]
    b.close()


def test_a_deleted_and_reput_segment_is_never_a_mix(url: str, tmp_path: Path) -> None:
    """A reader opened before a delete and a new put of the same key reads a typed miss, never
    parts of the new write under the old commit (reads name their write's nonce)."""
    b = _backend(url, tmp_path)
    fp = b.fingerprint
    data = kv_bytes(fp, 200, seed=1)
    key = b.put_kv(fp.digest(), np.arange(200), data, token_start=0).key
    seg = b.open_reader(key)
    b.delete(key)
    b.put_kv(fp.digest(), np.arange(200), data, token_start=0)
    with pytest.raises(SegmentNotFound):
        seg.read_into(np.zeros(100, np.uint8), 0)
    b.close()


def test_fsck_repairs_only_its_namespace(url: str, tmp_path: Path) -> None:
    """fsck finds a part of no commit, a segment missing a part and a drifted ``used``, and
    repairs them; the keys of another store on the same server are untouched."""
    b = _backend(url, tmp_path, "fsck-mine")
    other = _backend(url, tmp_path, "fsck-other")
    fp = b.fingerprint
    keep = b.put_kv(fp.digest(), np.arange(100), kv_bytes(fp, 100), token_start=0).key
    lose = b.put_kv(fp.digest(), np.arange(200, 300), kv_bytes(fp, 100, 1), token_start=0).key
    theirs = other.put_kv(fp.digest(), np.arange(100), kv_bytes(fp, 100), token_start=0).key
    theirs_before = other.records(), other.used()
    c = b._need(lose)
    b._r.delete(b._part(lose, c.nonce, 1))  # evicted by Redis
    b._r.set(b._part(keep, "0" * 32, 0), b"left over")  # an orphan (no TTL: not pending)
    b._r.incrby(b._used, 12345)
    report = b.fsck()
    assert not report.clean
    assert report.missing_parts == [lose] and len(report.orphan_parts) == 1
    assert report.used_recorded == report.used_actual + 12345 + b.record(lose).total_bytes
    fixed = b.fsck(repair=True)
    assert fixed.repaired and b.fsck().clean
    assert b.keys() == [keep] and b.used() == b.record(keep).total_bytes
    assert (other.records(), other.used()) == theirs_before and theirs in other
    b.close()
    other.close()
