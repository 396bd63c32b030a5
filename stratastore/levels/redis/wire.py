"""Reading a committed segment's parts: range reads received straight into the caller's memory,
on the caller's thread (spec F-REM-4: only parts of the write the commit record names).

A read sends its ``GETRANGE`` commands pipelined on a connection of the client's pool (the
server holding the segment's slot) and receives each reply's payload with ``recv_into`` into
the caller's buffer: one kernel copy, no parser buffer, few system calls, so the GIL is released
for long stretches and the hashing threads run meanwhile. Any reply that is not exactly the
bulk string expected (an error, a redirection, a part missing or short) drops that connection
and the read runs again through the client's own parser, which gives it its typed outcome.
Nothing writes the caller's memory once the read has returned: the receive runs on the caller's
thread, each ``recv`` bounded by what is left of the call's deadline.
"""

from __future__ import annotations

import socket
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.reader import PayloadReader

if TYPE_CHECKING:
    from stratastore.levels.redis.records import Commit, RedisRecords

__all__ = ["RedisSegment"]

_WIRE_CHUNK = 16 << 10  #: bytes a direct read takes at a time for a reply's header and CRLF


class RedisSegment(PayloadReader):
    """A committed segment open for range reads: each read fetches the parts it spans (one
    pipelined round trip, ``GETRANGE`` each) into the caller's memory (see the module). Reads
    name the write that was open (its nonce): a part missing, short or of another write is a
    typed error (:class:`~stratastore.levels.errors.SegmentNotFound`, counted
    ``missing_parts``)."""

    def __init__(self, backend: RedisRecords, commit: Commit) -> None:
        self.sidecar = commit.sidecar
        self._b = backend
        self._c = commit

    def _read_at(self, view: memoryview, offset: int) -> None:
        self._readv_at([view], offset)

    def _readv_at(self, views: list[memoryview], offset: int) -> None:
        pb, key = self._c.part_bytes, self.sidecar.key
        ranges: list[tuple[memoryview, int, int, int]] = []  # into, part, from, to (incl.)
        for v in views:
            pos, n = offset, v.nbytes
            done = 0
            while done < n:
                part, at = divmod(pos + done, pb)
                take = min(pb - at, n - done)
                ranges.append((v[done : done + take], part, at, at + take - 1))
                done += take
            offset += n
        if not ranges:
            return
        names = [self._b._part(key, self._c.nonce, p) for _, p, _, _ in ranges]
        cmds = [("GETRANGE", n, a, z) for n, (_, _, a, z) in zip(names, ranges, strict=True)]
        if read_direct(self._b, key, cmds, [dst for dst, *_ in ranges]):
            return
        got = self._b._pipeline(
            "read",
            key,
            [("getrange", self._b._part(key, self._c.nonce, p), a, z) for _, p, a, z in ranges],
        )
        for (dst, part, _, _), data in zip(ranges, got, strict=True):
            if not isinstance(data, bytes) or len(data) != dst.nbytes:
                self._b._count("missing_parts")
                raise SegmentNotFound(
                    f"segment {key.hex()[:16]} in {self._b.path}: part {part} is missing or "
                    "short (evicted by Redis, or deleted meanwhile); it is read as a miss"
                )
            dst[:] = data

    def close(self) -> None:
        pass


def read_direct(
    level: RedisRecords, key: bytes, cmds: list[tuple[str, str, int, int]], into: list[memoryview]
) -> bool:
    """Send ``cmds`` (reads of one segment: one hash slot) pipelined on a connection of
    ``level``'s pool and receive each reply straight into its buffer in ``into``, which must be
    exactly that long (:func:`_recv_bulks`). False, having read nothing that counts, where this
    does not apply (a client that is not a plain redis-py one, a buffer that is not contiguous
    bytes) or a reply is anything else: the caller then reads through the client's parser. A
    timeout is a :class:`~stratastore.levels.redis.client.RemoteError` as for every call."""
    if not all(v.format == "B" and v.ndim == 1 and v.contiguous for v in into):
        return False
    pool = _pool_of(level._r, cmds[0][1])
    if pool is None:
        return False
    # the connection within one deadline (a connect may retry); the replies received into
    # ``into`` on this thread, each receive bounded by what is left of it, so nothing writes
    # the caller's memory once this call has returned
    conn = level._call(
        "read", key, partial(_connection, pool), late=lambda c: c is not None and pool.release(c)
    )
    if conn is None:
        return False
    where = f"{level.path} {key.hex()[:16]}"
    deadline = time.monotonic() + level._left("read", where)
    return level._call(
        "read", key, partial(_pipelined_into, pool, conn, cmds, into, deadline), inline=True
    )


def _pool_of(r: Any, name: str) -> Any:
    """The connection pool of the server holding key ``name`` (a cluster: the primary of its
    slot, as the client ``r``'s slot map says), or None for a client of another kind."""
    import redis
    import redis.cluster

    try:
        if isinstance(r, redis.cluster.RedisCluster):
            node = r.get_node_from_key(name)  # type: ignore[no-untyped-call]
            return r.get_redis_connection(node).connection_pool
        if isinstance(r, redis.Redis):
            return r.connection_pool
    except Exception:  # a slot not covered, a node gone: the client's own path says so
        return None
    return None


def _connection(pool: Any) -> Any:
    """A connection of ``pool``, connected; None where it cannot be had but the client's own
    path may still work (refused now: its retry says so)."""
    import redis.exceptions as rx

    try:
        return pool.get_connection()
    except (rx.TimeoutError, rx.AuthenticationError):
        raise
    except (OSError, rx.ConnectionError):
        return None


def _pipelined_into(
    pool: Any,
    conn: Any,
    cmds: list[tuple[str, str, int, int]],
    into: list[memoryview],
    deadline: float,
) -> bool:
    """:func:`read_direct` on ``conn``, a connection of ``pool``: sent, received into
    ``into``; False at the first reply that is not the bulk string expected, or a connection
    the pool handed out dropped (the caller's retry through the client reconnects). Any
    connection not left exactly between replies is dropped before it goes back to the pool.
    The monotonic ``deadline`` bounds the whole call (the send, and the replies of a server
    that trickles)."""
    import redis.exceptions as rx

    clean = False
    try:
        sock = getattr(conn, "_sock", None)
        if not isinstance(sock, socket.socket):  # a caching or proxy connection: not ours
            clean = True
            return False
        before = sock.gettimeout()  # the client's own, per operation: put back after
        try:
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            conn.send_packed_command(conn.pack_commands(cmds))
            clean = _recv_bulks(sock, into, deadline)
        finally:
            sock.settimeout(before)
        return clean
    except TimeoutError:  # socket.timeout: the deadline passed
        raise rx.TimeoutError("Timeout reading from socket") from None
    except (rx.TimeoutError, rx.AuthenticationError):
        raise
    except (OSError, rx.ConnectionError):  # dropped: the client's own path reconnects
        return False
    finally:
        if not clean:
            conn.disconnect()
        pool.release(conn)


def _recv_bulks(sock: socket.socket, into: list[memoryview], deadline: float) -> bool:
    """Receive one RESP bulk string reply of exactly ``len(v)`` bytes into each ``v`` of
    ``into``, in turn, from ``sock``: the header and the CRLF through a small buffer, the
    payload with ``recv_into`` straight into ``v`` (the few payload bytes that came with a
    header are copied from that buffer). True when every reply was that and nothing followed;
    False at the first reply that is not (an error, a null, another length): the connection is
    then out of step and must be dropped. A closed connection raises ConnectionError; the
    monotonic ``deadline`` passed, TimeoutError (each receive waits at most until it)."""
    pend = bytearray()

    def wait() -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the read's deadline passed")
        sock.settimeout(left)

    def more() -> None:
        wait()
        chunk = sock.recv(_WIRE_CHUNK)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        pend.extend(chunk)

    for v in into:
        n = v.nbytes
        head = b"$%d\r\n" % n
        while len(pend) < len(head) and b"\n" not in pend:
            more()
        if not pend.startswith(head):
            return False
        del pend[: len(head)]
        got = min(n, len(pend))
        v[:got] = pend[:got]
        del pend[:got]
        while got < n:
            wait()
            k = sock.recv_into(v[got:], n - got)
            if not k:
                raise ConnectionError("connection closed by the server")
            got += k
        while len(pend) < 2:
            more()
        if pend[:2] != b"\r\n":
            return False
        del pend[:2]
    return not pend
