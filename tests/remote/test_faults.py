"""Faults of the shared remote level, against real ``redis-server`` processes and a real 3-master
Redis Cluster: a server killed mid-write, a connection dropped mid-read, a value corrupted in Redis,
a key evicted between lookup and restore (deleted, or by ``maxmemory`` with ``allkeys-lru``), a
cluster slot moving, a server that never answers.

Each is a miss or a ladder stop: the restore delivers a valid prefix (its bytes are compared to
the true ones, and every byte past it is still zero: nothing damaged is delivered), a typed
:class:`~stratastore.errors.StrataError` where an error surfaces, a counter of
``Store.stats()["levels"]["remote"]`` moves, nothing hangs (every call runs in a thread with a
generous join timeout: a hang fails the test, no timing is asserted otherwise), and the local
levels keep serving.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens
from stratastore.format import ChecksumMismatch, FormatError
from stratastore.levels.local import SegmentNotFound
from stratastore.levels.redis.backend import RedisBackend, RemoteError
from stratastore.levels.redis.settings import RemoteSettings
from stratastore.tiers.remote import RemoteHit
from tests.conftest import run_with_timeout, tiny_fp
from tests.redis_servers import RedisCluster, RedisServer
from tests.remote.conftest import import_or_skip

import_or_skip("redis")

FP = tiny_fp()
BOUND = 30.0  #: seconds any one call may take before the test calls it a hang
AOF = ("--appendonly", "yes", "--appendfsync", "always")  #: a kill loses no acknowledged write


def unique_name() -> str:
    return "ft-" + uuid.uuid4().hex[:16]


def conversation(
    cid: str, base: int, ends: list[int], *, fp: ModelFingerprint = FP, seed: int | None = None
) -> tuple[Conversation, npt.NDArray[np.uint8]]:
    """Tokens ``base, base + 1, ...`` cut and checkpointed at each of ``ends``, random K/V."""
    n = ends[-1]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(0), *(Checkpoint(e) for e in ends)],
        cuts=[0, *ends[:-1]],
    )
    rng = np.random.default_rng(base if seed is None else seed)
    return conv, rng.integers(0, 256, n * fp.token_bytes, dtype=np.uint8)


def open_store(
    tmp_path: Path,
    node: str,
    url: str,
    name: str,
    warnings: list[str] | None = None,
    *,
    fp: ModelFingerprint = FP,
    **settings: Any,
) -> Store:
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / node),
        "cold_mib": 256,
        "remote_url": url,
        "remote_name": name,
        "remote_mib": 256,
        **settings,
    }
    if cfg.get("remote_eviction") == "redis":
        cfg["remote_mib"] = 0
    sink = warnings if warnings is not None else []
    store: Store = run_with_timeout(lambda: Store.open(fp, cfg, warn=sink.append), BOUND)
    return store


def park(store: Store, conv: Conversation, kv: npt.NDArray[np.uint8]) -> None:
    """Park (acknowledged on the local disk level) and wait for the write and the push."""

    def go() -> None:
        report = store.park(conv, kv.copy())
        assert report.where == "disk" and report.tokens == len(conv.tokens), report
        store.flush()

    run_with_timeout(go, BOUND)


def restore(
    store: Store, prompt: npt.NDArray[np.integer], kv: npt.NDArray[np.uint8], valid: set[int]
) -> Any:
    """Restore ``prompt``: the tokens delivered are one of ``valid`` (resume points), their
    bytes are ``kv``'s, and every byte past them is still zero (nothing damaged delivered)."""
    tb = store._tiers.tb
    out = np.zeros(len(prompt) * tb, np.uint8)
    r = run_with_timeout(lambda: store.restore(prompt, out), BOUND)
    assert r.tokens in valid, (r, valid)
    n = r.tokens * tb
    assert np.array_equal(out[:n], kv[:n]), "wrong bytes delivered"
    assert not out[n:].any(), "bytes past the restored prefix were written"
    run_with_timeout(store.flush, BOUND)  # what remote_keep_local queued lands
    return r


def remote_stats(store: Store) -> dict[str, Any]:
    doc: dict[str, Any] = run_with_timeout(store.stats, BOUND)
    return doc


def inspector(url: str, name: str) -> RedisBackend:
    return RedisBackend.open(RemoteSettings(url, name=name), FP)


def local_roundtrip(store: Store, cid: str, base: int) -> None:
    """The local levels keep serving: a new conversation parks and restores from disk."""
    conv, kv = conversation(cid, base, [16, 32])
    park(store, conv, kv)
    r = restore(store, np.arange(base, base + 32), kv, {32})
    assert r.source == "disk"


def after_lookup(store: Store, fn: Callable[[RemoteHit | None], None]) -> None:
    """Run ``fn(hit)`` right after each walk of the remote level (before the restore reads)."""
    level = store._tiers.remote
    assert level is not None
    real = level.lookup

    def lookup(prompt: Any, media: Any) -> RemoteHit | None:
        hit = real(prompt, media)
        fn(hit)
        return hit

    level.lookup = lookup  # type: ignore[method-assign]


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_session_server" if request.param == "standalone" else "redis_cluster"
    return str(request.getfixturevalue(fixture).url)


THREE = [40, 80, 120]  #: three segments, a checkpoint at each end


# -- (a) a Redis node killed mid-write -------------------------------------------------------------


def test_killed_between_the_parts_and_the_commit(
    redis_bin: tuple[str, str], tmp_path: Path
) -> None:
    """The server dies after segment 2's parts are written, before its commit: the park is
    acknowledged locally, the push's error is counted, the local levels keep serving (and the
    breaker skips the level); after a restart (AOF: nothing acknowledged is lost) only segment 1
    is committed, segment 2's parts are pending (a TTL: they expire), fsck is clean, and
    another node restores segment 1 only."""
    name = unique_name()
    warnings: list[str] = []
    with RedisServer(tmp_path / "redis", binaries=redis_bin, extra_args=AOF) as server:
        conv, kv = conversation("c", 1000, THREE)
        keys = [k for _, _, k in conv.segments(FP.digest())]
        a = open_store(tmp_path, "a", server.url, name, warnings, remote_timeout_ms=2000)
        try:
            backend = a._tiers.remote.store  # type: ignore[union-attr]
            real, commits = backend._call, []

            def call(op: str, key: Any, fn: Callable[[], Any], **kw: Any) -> Any:
                if op == "commit":
                    commits.append(key)
                    if len(commits) == 2:
                        server.kill()
                return real(op, key, fn, **kw)

            backend._call = call  # type: ignore[method-assign]
            park(a, conv, kv)  # acknowledged: the disk level holds it
            assert commits == keys[:2]
            r = restore(a, conv.tokens, kv, {120})
            assert r.source == "disk"
            s = remote_stats(a)["levels"]["remote"]
            assert s["remote_puts"] == 1 and s["remote_put_errors"] == 1
            assert s["remote_errors"] == 1 and s["backend_errors"] >= 1
            assert any("failed" in w and "remote level" in w for w in warnings), warnings
            calls = s["remote_skipped"] + s["remote_errors"]
            local_roundtrip(a, "local", 5000)  # with the server down: skipped (or failed)
            s = remote_stats(a)["levels"]["remote"]
            # its park (its restore is a local hit: it never asks the remote level)
            assert s["remote_skipped"] + s["remote_errors"] >= calls + 1
        finally:
            run_with_timeout(a.close, BOUND)

        server.start()
        look = inspector(server.url, name)
        try:
            assert look.keys() == [keys[0]]
            report = look.fsck()
            assert report.clean and report.segments == 1, report
            pending = list(look._r.scan_iter(match=f"{look.ns}p/{{{keys[1].hex()}}}/*"))
            assert pending, "segment 2's parts were written before the kill"
            assert all(look._r.pttl(p) > 0 for p in pending)  # they expire by themselves
            with pytest.raises(SegmentNotFound):
                look.get_bytes(keys[1], max_bytes=1 << 20)
        finally:
            look.close()
        with open_store(tmp_path, "b", server.url, name) as b:
            r = restore(b, conv.tokens, kv, {40})
            assert r.source == "remote"


def test_killed_while_a_big_park_is_pushed(redis_bin: tuple[str, str], tmp_path: Path) -> None:
    """The server is killed from another thread while an 8 MiB push is on the wire (parts of
    1 MiB): the park is acknowledged locally and restores whole; after a restart every segment
    the level lists reads back whole and valid, and fsck is clean (a write cut short leaves
    pending parts only)."""
    fp = ModelFingerprint.create("test/big", n_layers=4, n_kv_heads=4, head_dim=64, page_tokens=16)
    assert fp.token_bytes == 4096
    name = unique_name()
    with RedisServer(tmp_path / "redis", binaries=redis_bin, extra_args=AOF) as server:
        conv, kv = conversation("big", 7000, [512, 1024, 1536, 2048], fp=fp)
        a = open_store(
            tmp_path, "a", server.url, name, fp=fp, remote_part_mib=1, remote_timeout_ms=5000
        )
        try:
            backend = a._tiers.remote.store  # type: ignore[union-attr]
            real, puts = backend._pipeline, []
            sending = threading.Event()

            def pipeline(op: str, key: Any, cmds: Any) -> Any:
                if op == "put":
                    puts.append(key)
                    if len(puts) == 2:  # segment 1 is committed; segment 2's parts go now
                        sending.set()
                return real(op, key, cmds)

            backend._pipeline = pipeline  # type: ignore[method-assign]
            killer = threading.Thread(target=lambda: sending.wait(BOUND) and server.kill())
            killer.start()
            park(a, conv, kv)
            killer.join(BOUND)
            assert not server.running
            s = remote_stats(a)["levels"]["remote"]
            assert s["remote_put_errors"] == 1 and s["remote_errors"] == 1, s
            assert 1 <= s["remote_puts"] < 4
            r = restore(a, conv.tokens, kv, {2048})
            assert r.source == "disk"
        finally:
            run_with_timeout(a.close, BOUND)
        server.start()
        look = RedisBackend.open(RemoteSettings(server.url, name=name), fp)
        try:
            report = look.fsck()
            assert report.clean, report
            order = [k for _, _, k in conv.segments(fp.digest())]
            listed = look.keys()
            assert order[0] in listed and len(listed) < 4  # a prefix of the chain, committed
            assert set(listed) == set(order[: len(listed)])
            segs = {k: (s, e) for s, e, k in conv.segments(fp.digest())}
            for key in listed:
                s, e = segs[key]
                out = np.zeros((e - s) * fp.token_bytes, np.uint8)
                look.get_into(key, out)  # validated, page by page
                assert np.array_equal(out, kv[s * fp.token_bytes : e * fp.token_bytes])
        finally:
            look.close()


# -- (b) a connection dropped mid-read -------------------------------------------------------------


class DropProxy:
    """A TCP relay to a real server that can cut every connection mid-stream: once armed with
    ``n``, after ``n`` more bytes of replies, every connection is reset and any new one is
    reset as it is accepted (the client's retry fails too). Its sockets block (a cut shuts them
    down, which wakes the threads); only the listener polls, to see :meth:`close`."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.budget: int | None = None
        self.cut = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def arm(self, n: int) -> None:
        with self.lock:
            self.budget = n

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self.lock:
                if self.cut.is_set():
                    self._reset(conn)
                    continue
                up = socket.create_connection(self.target, timeout=5)
                up.settimeout(None)
                self.socks += [conn, up]
            for src, dst, count in ((conn, up, False), (up, conn, True)):
                t = threading.Thread(target=self._pump, args=(src, dst, count), daemon=True)
                self.threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            if not data or self.cut.is_set():
                break
            if count:
                with self.lock:
                    if self.budget is not None and len(data) >= self.budget:
                        with contextlib.suppress(OSError):
                            dst.sendall(data[: self.budget])
                        self._cut_all()
                        return
                    if self.budget is not None:
                        self.budget -= len(data)
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):  # one side closed: so does the other
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _reset(s: socket.socket) -> None:
        """Reset ``s`` (RST, not FIN), waking a thread blocked on it."""
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()

    def _cut_all(self) -> None:  # under self.lock
        self.cut.set()
        for s in self.socks:
            self._reset(s)
        self.socks.clear()

    def close(self) -> None:
        self.done.set()
        with self.lock:
            self._cut_all()
        for t in self.threads:
            t.join(5)
        self.listener.close()


def test_a_connection_dropped_mid_read(redis_session_server: RedisServer, tmp_path: Path) -> None:
    """B reads through a relay that resets its connections part-way through the segments'
    bytes (and every reconnection after): the restore stops at a segment boundary with the
    valid prefix, counted; a direct read is a RemoteError; the local levels keep serving, and
    the next walk's failure opens the breaker."""
    name = unique_name()
    conv, kv = conversation("c", 2000, [2000, 4000])  # two segments of 128,000 bytes each
    with open_store(tmp_path, "a", redis_session_server.url, name) as a:
        park(a, conv, kv)
    proxy = DropProxy(redis_session_server.port)
    warnings: list[str] = []
    b = open_store(tmp_path, "b", proxy.url, name, warnings, remote_timeout_ms=2000)
    try:
        after_lookup(b, lambda hit: proxy.arm(180_000) if hit is not None else None)
        r = restore(b, conv.tokens, kv, {0, 2000})
        assert r.source == "remote" and proxy.cut.is_set()
        s = remote_stats(b)
        rs = s["levels"]["remote"]
        assert rs["remote_ladder_stops"] == 1 and rs["backend_errors"] >= 1
        assert s["damaged_segments"] == [] and s["ladder_restores"] == 0
        assert any("(remote level): restored" in w for w in warnings), warnings
        backend = b._tiers.remote.store  # type: ignore[union-attr]
        with pytest.raises(RemoteError) as e:
            run_with_timeout(
                lambda: backend.get_bytes(conv.segments(FP.digest())[0][2], max_bytes=1 << 20),
                BOUND,
            )
        assert "ConnectionError" in str(e.value)  # what failed, said
        calls = rs["remote_skipped"] + rs["remote_errors"]
        local_roundtrip(b, "local", 9000)
        rs = remote_stats(b)["levels"]["remote"]
        assert rs["remote_skipped"] + rs["remote_errors"] >= calls + 1  # its park
    finally:
        run_with_timeout(b.close, BOUND)
        proxy.close()


@pytest.mark.parametrize("how", ["client-kill", "server-kill"])
def test_connections_gone_after_the_lookup(
    redis_server: RedisServer, tmp_path: Path, how: str
) -> None:
    """Right after B's walk, ``CLIENT KILL TYPE normal`` drops every connection (the client
    reconnects once: every byte delivered), or the server is killed (the reads fail: a ladder
    stop at token 0, counted; the local levels keep serving)."""
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    with open_store(tmp_path, "a", redis_server.url, name) as a:
        park(a, conv, kv)
    b = open_store(tmp_path, "b", redis_server.url, name, remote_timeout_ms=2000)
    try:
        walks: list[int] = []

        def drop(hit: RemoteHit | None) -> None:
            walks.append(hit.match.length if hit is not None else 0)
            if len(walks) > 1:
                return
            assert walks == [120]
            if how == "client-kill":
                killed = redis_server.execute("CLIENT", "KILL", "TYPE", "normal")
                assert isinstance(killed, int) and killed >= 1  # B's pooled connection
            else:
                redis_server.kill()

        after_lookup(b, drop)
        r = restore(b, conv.tokens, kv, {120} if how == "client-kill" else {0})
        assert r.source == "remote"
        rs = remote_stats(b)["levels"]["remote"]
        if how == "client-kill":
            assert rs["remote_ladder_stops"] == 0 and rs["backend_errors"] == 0
        else:
            assert rs["remote_ladder_stops"] == 1 and rs["backend_errors"] >= 1
            local_roundtrip(b, "local", 9000)
    finally:
        run_with_timeout(b.close, BOUND)


# -- (c) a value corrupted in Redis ----------------------------------------------------------------


@pytest.mark.parametrize("where", ["part", "record"])
def test_a_value_corrupted_in_redis(url: str, tmp_path: Path, where: str) -> None:
    """A byte of segment 2 flipped in Redis (in a part: page 2 of it; or in its commit record):
    B's restore stops at segment 1's end with its bytes, counted as a remote ladder stop, not as
    local damage; a direct read is a typed error."""
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    key = conv.segments(FP.digest())[1][2]
    with open_store(tmp_path, "a", url, name) as a:
        park(a, conv, kv)
    look = inspector(url, name)
    try:
        c = look._need(key)
        target = look._part(key, c.nonce, 0) if where == "part" else look._rec_key(key)
        value = bytearray(look._r.get(target))
        at = 2 * FP.page_bytes + 5 if where == "part" else len(value) - 40
        value[at] ^= 0x10
        look._r.set(target, bytes(value))
        with pytest.raises((ChecksumMismatch, FormatError)):
            look.get_into(key, np.zeros(40 * FP.token_bytes, np.uint8))
    finally:
        look.close()
    warnings: list[str] = []
    with open_store(tmp_path, "b", url, name, warnings) as b:
        r = restore(b, conv.tokens, kv, {40})
        assert r.source == "remote"
        s = remote_stats(b)
        assert s["levels"]["remote"]["remote_ladder_stops"] == 1
        assert s["damaged_segments"] == [] and s["ladder_restores"] == 0
        assert any("restored 40 of 120" in w for w in warnings), warnings
        assert s["levels"]["remote"]["remote_kept_local"] == 1  # the valid prefix only
        r = restore(b, conv.tokens[:40], kv, {40})
        assert r.source == "disk"


# -- (d) a key evicted between lookup and restore --------------------------------------------------


@pytest.mark.parametrize("what", ["part", "record"])
def test_a_key_evicted_between_lookup_and_restore(url: str, tmp_path: Path, what: str) -> None:
    """Right after B's walk found all three segments, segment 2's part (or its commit record)
    is deleted: the restore stops at segment 1's end, counted; a direct read is a miss."""
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    key = conv.segments(FP.digest())[1][2]
    with open_store(tmp_path, "a", url, name) as a:
        park(a, conv, kv)
    look = inspector(url, name)
    found: list[int] = []

    def evict(hit: RemoteHit | None) -> None:
        assert hit is not None
        found.append(hit.match.length)
        c = look._need(key)
        look._r.delete(look._part(key, c.nonce, 0) if what == "part" else look._rec_key(key))

    try:
        with open_store(tmp_path, "b", url, name, remote_keep_local=False) as b:
            after_lookup(b, evict)
            r = restore(b, conv.tokens, kv, {40})
            assert r.source == "remote" and found == [120]
            rs = remote_stats(b)["levels"]["remote"]
            assert rs["remote_ladder_stops"] == 1
            if what == "part":
                assert rs["backend_missing_parts"] >= 1
        with pytest.raises(SegmentNotFound):
            look.get_bytes(key, max_bytes=1 << 20)
    finally:
        look.close()


def test_keys_evicted_by_redis_under_maxmemory(redis_bin: tuple[str, str], tmp_path: Path) -> None:
    """A server with maxmemory and allkeys-lru (remote_eviction=redis) holds less than the
    conversations parked: Redis evicts parts, commit records and index entries at will. Every
    restore is a miss or a valid prefix, never wrong bytes; evictions show as short restores."""
    name = unique_name()
    with RedisServer(
        tmp_path / "redis", binaries=redis_bin, maxmemory="3mb", maxmemory_policy="allkeys-lru"
    ) as server:
        convs = [
            conversation(f"c{i}", 100_000 * (i + 1), [500, 1000, 1500, 2000]) for i in range(20)
        ]
        prompts = [np.asarray(c.tokens).copy() for c, _ in convs]
        kvs = [kv.copy() for _, kv in convs]
        with open_store(tmp_path, "a", server.url, name, remote_eviction="redis") as a:
            for c, kv in convs:
                park(a, c, kv)
            assert a.stats()["levels"]["remote"]["remote_put_errors"] == 0
        info = server.execute("INFO", "stats")
        assert isinstance(info, bytes) and b"evicted_keys:0\r" not in info
        with open_store(
            tmp_path, "b", server.url, name, remote_eviction="redis", remote_keep_local=False
        ) as b:
            got = [
                restore(b, p, kv, {0, 500, 1000, 1500, 2000})
                for p, kv in zip(prompts, kvs, strict=True)
            ]
            s = remote_stats(b)
        short = [r for r in got if r.tokens < 2000]
        assert short, "nothing was evicted from what was read"
        rs = s["levels"]["remote"]
        assert rs["remote_misses"] + rs["remote_ladder_stops"] >= 1
        assert s["damaged_segments"] == []


# -- (e) a cluster slot moving ---------------------------------------------------------------------


def test_a_cluster_slot_moving(redis_cluster: RedisCluster, tmp_path: Path) -> None:
    """Segment 2's slot moves right after B's walk (MOVED), and segment 3's slot is half moved
    (its commit record on the new owner, its parts still on the old: ASK) during a restore:
    every restore delivers every byte; then after the moves too."""
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    keys = [k for _, _, k in conv.segments(FP.digest())]
    with open_store(tmp_path, "a", redis_cluster.url, name) as a:
        park(a, conv, kv)
    look = inspector(redis_cluster.url, name)
    try:
        rec2, rec3 = look._rec_key(keys[1]), look._rec_key(keys[2])
        with open_store(tmp_path, "b", redis_cluster.url, name, remote_keep_local=False) as b:
            moved: list[int] = []

            def move(hit: RemoteHit | None) -> None:
                if not moved:
                    before = redis_cluster.slot_owner(redis_cluster.keyslot(rec2))
                    redis_cluster.move_slot_of(rec2)
                    after = redis_cluster.slot_owner(redis_cluster.keyslot(rec2))
                    assert after is not before
                    moved.append(1)

            after_lookup(b, move)
            r = restore(b, conv.tokens, kv, {120})
            assert r.source == "remote" and moved

            slot = redis_cluster.keyslot(rec3)
            source = redis_cluster.slot_owner(slot)
            target = redis_cluster.nodes[(redis_cluster.nodes.index(source) + 1) % 3]
            target.execute("CLUSTER", "SETSLOT", slot, "IMPORTING", redis_cluster.node_id(source))
            source.execute("CLUSTER", "SETSLOT", slot, "MIGRATING", redis_cluster.node_id(target))
            source.execute("MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", rec3)
            # half moved: the commit record on the new owner, the part still on the old one
            part3 = look._part(keys[2], look._need(keys[2]).nonce, 0).encode()
            assert target.execute("CLUSTER", "GETKEYSINSLOT", slot, 1000) == [rec3.encode()]
            left = source.execute("CLUSTER", "GETKEYSINSLOT", slot, 1000)
            assert isinstance(left, list) and part3 in left and rec3.encode() not in left
            r = restore(b, conv.tokens, kv, {120})
            assert r.source == "remote"
            redis_cluster.move_slot_of(rec3, target)
            r = restore(b, conv.tokens, kv, {120})
            assert r.source == "remote"
            rs = remote_stats(b)["levels"]["remote"]
            assert rs["remote_ladder_stops"] == 0 and rs["remote_errors"] == 0
        assert look.fsck().clean
    finally:
        look.close()


# -- (f) a server that never answers ---------------------------------------------------------------


class Silent:
    """A TCP listener that accepts connections and never answers a byte."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.done = threading.Event()
        self.accepted = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.listener.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    s = Silent()
    try:
        yield s
    finally:
        s.close()


def test_a_server_that_never_answers(silent: Silent, tmp_path: Path) -> None:
    """remote_timeout_ms=300 against a listener that never answers: open, park and restore
    return (bounded: the timeout on every call), the failures are counted as timeouts, the
    breaker then skips the level, and the local levels serve throughout."""
    warnings: list[str] = []
    url = f"redis://127.0.0.1:{silent.port}/0"
    store = open_store(tmp_path, "a", url, unique_name(), warnings, remote_timeout_ms=300)
    try:
        assert silent.accepted >= 1
        level = store._tiers.remote
        assert level is not None
        s = remote_stats(store)["levels"]["remote"]
        assert s["remote_errors"] == 1 and s["backend_timeouts"] >= 1
        assert s["remote_skipped"] == 0
        assert s["entries"] is None  # stats do not wait on it either
        assert any("timed out" in w for w in warnings), warnings
        # the breaker's pause (1 s here) made long, so that what follows does not race it
        level._down_until = time.monotonic() + 600
        conv, kv = conversation("c", 1000, THREE)
        park(store, conv, kv)  # the level is skipped: the park stands locally
        assert remote_stats(store)["levels"]["remote"]["remote_skipped"] == 1
        r = restore(store, conv.tokens, kv, {120})
        assert r.source == "disk"  # a local hit: the remote level is not asked (nor skipped)
        s = remote_stats(store)["levels"]["remote"]
        assert s["remote_skipped"] == 1 and s["remote_errors"] == 1

        level._down_until = 0.0  # the pause is over: the next calls try again, and time out
        conv2, kv2 = conversation("d", 3000, [16, 32])
        park(store, conv2, kv2)
        s = remote_stats(store)["levels"]["remote"]
        assert s["remote_put_errors"] == 1 and s["remote_errors"] == 2
        level._down_until = 0.0
        longer = np.arange(3000, 3040)  # held in part here: the remote level is asked
        r = restore(
            store, longer, np.concatenate([kv2, np.zeros(8 * FP.token_bytes, np.uint8)]), {32}
        )
        assert r.source == "disk"
        s = remote_stats(store)["levels"]["remote"]
        assert s["remote_errors"] == 3 and s["backend_timeouts"] >= 3
        assert s["remote_hits"] == 0 and s["remote_puts"] == 0 and s["remote_skipped"] == 1
    finally:
        run_with_timeout(store.close, BOUND)
