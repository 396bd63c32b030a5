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
from typing import TYPE_CHECKING, Any

from stratastore.levels.reader import PayloadReader

if TYPE_CHECKING:
    from stratastore.levels.redis.records import Commit, RedisRecords

__all__ = ["RedisSegment", "pipelined_into", "pool_of", "pooled_connection", "recv_bulks"]

_WIRE_CHUNK = 16 << 10  #: bytes a direct read takes at a time for a reply's header and CRLF


class RedisSegment(PayloadReader):
    """A committed segment open for range reads: each read fetches the parts it spans (one
    pipelined round trip, ``GETRANGE`` each) into the caller's memory
    (:meth:`RedisRecords.read_parts <stratastore.levels.redis.records.RedisRecords.read_parts>`).
    Reads name the write that was open (its nonce): a part missing, short or of another write
    is a typed error (:class:`~stratastore.levels.errors.SegmentNotFound`, counted
    ``missing_parts``)."""

    def __init__(self, backend: RedisRecords, commit: Commit) -> None:
        self.sidecar = commit.sidecar
        self.backend = backend
        self.commit = commit

    def _read_at(self, view: memoryview, offset: int) -> None:
        self.backend.read_parts(self.commit, [view], offset)

    def _readv_at(self, views: list[memoryview], offset: int) -> None:
        self.backend.read_parts(self.commit, views, offset)

    def close(self) -> None:
        pass


def pool_of(r: Any, name: str) -> Any:
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


def pooled_connection(pool: Any) -> Any:
    """A connection of ``pool``, connected; None where it cannot be had but the client's own
    path may still work (refused now: its retry says so)."""
    import redis.exceptions as rx

    try:
        return pool.get_connection()
    except (rx.TimeoutError, rx.AuthenticationError):
        raise
    except (OSError, rx.ConnectionError):
        return None


def pipelined_into(
    pool: Any,
    conn: Any,
    cmds: list[tuple[str, str, int, int]],
    into: list[memoryview],
    deadline: float,
) -> bool:
    """A direct read (``RedisCalls._read_direct``) on ``conn``, a connection of ``pool``: sent,
    received into
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
            clean = recv_bulks(sock, into, deadline)
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


def recv_bulks(sock: socket.socket, into: list[memoryview], deadline: float) -> bool:
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
