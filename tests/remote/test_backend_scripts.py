"""RedisBackend's own scripts and calls: a delete of a segment of many parts, fsck --repair beside a
live writer, and the timeout of a read from a server that trickles."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from stratastore.levels.redis.backend import RemoteError
from tests.conftest import kv_bytes, run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import BOUND, FP, backend, unique_name

redis = import_or_skip("redis")


def test_a_segment_of_more_than_8000_parts_can_be_deleted(
    redis_session_server: RedisServer,
) -> None:
    """_DELETE does ``DEL unpack(KEYS)``: Lua's unpack takes at most ~8000 values, so a
    segment of more parts (part_bytes 4096, the settings' floor: 33 MiB; remote_part_mib=1:
    an 8 GiB segment) can never be deleted: enforce_budget and fsck --repair fail on it for
    ever ("too many results to unpack")."""
    b = backend(redis_session_server.url, unique_name(), part_bytes=4096)
    try:
        n = 8200 * 4096 // FP.token_bytes
        put = b.put_kv(FP.digest(), np.arange(n), kv_bytes(FP, n), token_start=0)
        assert b._need(put.key).parts == 8200
        assert run_with_timeout(lambda: b.delete(put.key), BOUND) is True
        assert put.key not in b and len(b) == 0 and b.used() == 0
    finally:
        b.close()


def test_fsck_repair_beside_a_writer_never_deletes_a_committed_segment(
    redis_session_server: RedisServer,
) -> None:
    """fsck --repair while a node commits: the scan sees the write's parts (pending, no
    record yet), the writer commits (the parts are made persistent), then fsck asks the
    parts' TTL, sees -1 and deletes them as orphans: a committed segment loses its parts."""
    url, name = redis_session_server.url, unique_name()
    writer, checker = backend(url, name, part_bytes=4096), backend(url, name, part_bytes=4096)
    at_commit, go = threading.Event(), threading.Event()
    real_w, real_c = writer._call, checker._call

    def w_call(op: str, key: Any, fn: Callable[[], Any], **kw: Any) -> Any:
        if op == "commit":
            at_commit.set()
            assert go.wait(BOUND)
        return real_w(op, key, fn, **kw)

    writer._call = w_call  # type: ignore[method-assign]
    kv = kv_bytes(FP, 256)
    result: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: result.setdefault(
            "put", writer.put_kv(FP.digest(), np.arange(256), kv, token_start=0)
        ),
        daemon=True,
    )
    released: list[str] = []

    def c_call(op: str, key: Any, fn: Callable[[], Any], **kw: Any) -> Any:
        if op == "fsck" and isinstance(key, str) and "/p/" in key and not released:
            released.append(key)  # fsck's first look at a part's TTL: the commit lands now
            go.set()
            t.join(BOUND)
        return real_c(op, key, fn, **kw)

    checker._call = c_call  # type: ignore[method-assign]
    try:
        t.start()
        assert at_commit.wait(BOUND)  # the parts are written, pending; nothing committed
        run_with_timeout(lambda: checker.fsck(repair=True), BOUND)
        go.set()
        t.join(BOUND)
        put = result["put"]
        assert put.created
        assert writer.get_bytes(put.key, max_bytes=1 << 20) == kv.tobytes()
    finally:
        go.set()
        writer.close()
        checker.close()


class Trickle:
    """A TCP proxy to a real server that, once ``slow`` is set, passes the server's bytes on
    one at a time, ``gap`` seconds apart (each gap shorter than the client's timeout)."""

    def __init__(self, server: RedisServer, gap: float) -> None:
        self.target = (server.host, server.port)
        self.gap = gap
        self.slow = threading.Event()
        self.done = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                c, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            s = socket.create_connection(self.target, timeout=5)
            self.socks += [c, s]
            threading.Thread(target=self._pump, args=(c, s), daemon=True).start()

    def _pump(self, c: socket.socket, s: socket.socket) -> None:
        pending = b""
        try:
            while not self.done.is_set():
                r, _, _ = select.select([c, s], [], [], 0.02)
                if c in r:
                    data = c.recv(65536)
                    if not data:
                        return
                    s.sendall(data)
                if s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    pending += data
                if pending and not self.slow.is_set():
                    c.sendall(pending)
                    pending = b""
                elif pending:
                    c.sendall(pending[:1])
                    pending = pending[1:]
                    time.sleep(self.gap)
        except OSError:
            return

    def close(self) -> None:
        self.done.set()
        for x in self.socks:
            x.close()
        self.listener.close()


@pytest.fixture
def trickle(redis_session_server: RedisServer) -> Iterator[Trickle]:
    t = Trickle(redis_session_server, gap=0.1)
    try:
        yield t
    finally:
        t.close()


def test_a_read_from_a_trickling_server_is_bounded_by_the_timeout(trickle: Trickle) -> None:
    """remote_timeout_ms=500; the server's reply to a read arrives one byte every 0.1 s (a
    saturated link, a server swapping): every recv returns within the timeout, so the read of
    one 4 KiB part takes ~7 minutes. "Every call has remote_timeout_ms": the read must end (a
    RemoteError, timed out) within a few timeouts, not run on while bytes trickle in."""
    b = backend(
        f"redis://127.0.0.1:{trickle.port}/0", unique_name(), part_bytes=4096, timeout_s=0.5
    )
    try:
        put = b.put_kv(FP.digest(), np.arange(64), kv_bytes(FP, 64), token_start=0)
        seg = b.open_reader(put.key)
        trickle.slow.set()
        out = np.zeros(4096, np.uint8)
        t0 = time.monotonic()
        with pytest.raises(RemoteError):
            run_with_timeout(lambda: seg.read_into(out, 0), 20)
        assert time.monotonic() - t0 < 20
    finally:
        trickle.slow.clear()
        b.close()
