"""The shared remote level: a segment backend on Redis or a Redis Cluster (issue 17).

Several engine nodes, each with its own RAM and disk levels, share one remote level: node B
restores, validated, what node A parked. Segments are content-addressed (spec F-KEY), so equal
prefixes are equal keys on every node and a segment parked by both is stored once; every page
carries its BLAKE3 digest in the sidecar, so whatever Redis returns is validated before it is
delivered (F-SC-3), exactly as a disk read is.

Keys (``NS`` is :func:`~.redis_settings.namespace`: ``strata/<name>/<fp>/``; ``{K}`` is the
segment key in hex, in braces: a hash tag, so in a cluster a segment's sidecar and parts live in
one slot, on one node)::

    NS s/{K}             the commit record: b"SRC1:<nonce>:<parts>:<part bytes>:" + sidecar
    NS p/{K}/<nonce>/<i> part i of the stored payload (at most part_bytes)
    NS recs              hash: K -> index record (F-IDX-1 layout)   } derived: the listing,
    NS ages              zset: "<sealed_at_ns:020d>:K" (by lex)    } used() and oldest();
    NS used              integer: bytes of every committed segment  } fsck rebuilds them
    NS kids/{P}          hash: child K -> "start:end", the K/V segments whose parent is P
                         (how another node finds a chain from the prompt's tokens)

**Commit.** The parts are written first, each with a pending TTL (an abandoned write expires by
itself); then one script in the segment's slot checks every part is there, makes them
permanent and sets the commit record, only if none is set (``SET NX``: two nodes writing one
key concurrently both succeed, one copy is kept, the other's parts are removed). A reader reads
the commit record first and never sees a partial segment; its reads name the nonce, so a
segment deleted and put again meanwhile is a typed error at the read, never a mix of two
writes. **Delete** removes the commit record first (a script checking the nonce), then the
parts, then the derived entries.

**Faults** are typed, never wrong bytes, never a hang: every call has the settings' timeout; a
refused, dropped or timed-out connection, a cluster that is down or moving is
:class:`RemoteError` (a :class:`~stratastore.io.errors.StrataIOError`: the restore's read pass
stops its ladder there); a part evicted by Redis (``maxmemory``) is
:class:`~stratastore.levels.local.SegmentNotFound`; a value corrupted in Redis fails its digest
(:class:`~stratastore.format.ChecksumMismatch`) or its sidecar's trailer. Each is counted in
:attr:`RedisBackend.counters`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from stratastore.errors import ConfigError, StrataError
from stratastore.format import (
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
    Kind,
    Level,
    MediaRef,
    ModelFingerprint,
    Sidecar,
)
from stratastore.format.remote_record import (
    MAX_COMMIT_RECORD_BYTES,
    CommitRecord,
    RemoteNames,
    decode_commit_record,
    parse_remote_name,
)
from stratastore.io.errors import StrataIOError
from stratastore.levels.local import (
    OutOfRange,
    PayloadReader,
    PutResult,
    SegmentNotFound,
    StoreError,
)
from stratastore.levels.redis.settings import RemoteSettings, check_name
from stratastore.levels.relocation import Relocated, relocate_by_copy, resealed
from stratastore.levels.sealing import (
    Buffer,
    Unsealed,
    byte_view,
    check_sealed,
    encode,
    kv_segment,
    sidecar_for,
    state_segment,
)

__all__ = ["RedisBackend", "RemoteError", "RemoteReport"]

T = TypeVar("T")
PENDING_MS = 600_000  #: how long an uncommitted part lives (a write abandoned mid-way expires)
_BATCH = 256  #: rows ``oldest`` reads at a time
_NAMES = 1024  #: part names one call checks or deletes at most
_RAISE = object()  #: :meth:`RedisBackend._pipeline`: a reply of another type raises
_WIRE_CHUNK = 16 << 10  #: bytes a direct read takes at a time for a reply's header and CRLF

# KEYS[1] the commit record, KEYS[2..] the parts; ARGV[1] the record. 1: committed here; 0:
# another writer committed the key first (the caller removes its parts); -1: a part is gone
# (expired or evicted before the commit): nothing is committed.
_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return -1 end
end
for i = 2, #KEYS do redis.call('PERSIST', KEYS[i]) end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
# KEYS[1] the commit record; ARGV[1] the record's head (its nonce): the record is removed only
# if it is still that write's. 1: removed; 0: not (gone or replaced). The parts go after it, in
# batches (a segment of any number of parts; Lua's unpack takes ~8,000 values at most).
_DELETE = """
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then return 0 end
local v = redis.call('GETRANGE', KEYS[1], 0, string.len(ARGV[1]) - 1)
if v ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
# fsck --repair: KEYS[1] a commit record, KEYS[2..] parts of one write, ARGV[1] that write's
# head prefix ``SRC1:<nonce>:``. Deletes the parts that have no expiry (not pending) only while
# the record does not name the write: a write committed since fsck looked keeps its parts.
_DROP_ORPHANS = """
if redis.call('TYPE', KEYS[1]).ok == 'string' then
  if redis.call('GETRANGE', KEYS[1], 0, string.len(ARGV[1]) - 1) == ARGV[1] then return 0 end
end
local n = 0
for i = 2, #KEYS do
  if redis.call('PTTL', KEYS[i]) == -1 then redis.call('DEL', KEYS[i]); n = n + 1 end
end
return n
"""
# fsck --repair: KEYS[1] a commit record's name holding a value of another type: deleted,
# only while it still is (a string there since is a commit: kept).
_DROP_NOT_STRING = """
if redis.call('TYPE', KEYS[1]).ok == 'string' then return 0 end
return redis.call('DEL', KEYS[1])
"""


class RemoteError(StrataIOError):
    """The remote level did not answer as it should: a connection refused, dropped or timed
    out, a cluster down or reconfiguring, authentication refused. Never carries credentials."""

    def __init__(self, op: str, where: str, why: str, err: int = errno.EIO) -> None:
        super().__init__(op, where, err, why,
                         "check that the Redis server (or cluster) is up and reachable, and the "
                         "remote_* settings; the local levels keep serving meanwhile")  # fmt: skip


@dataclass
class RemoteReport:
    """What :meth:`RedisBackend.fsck` found in its namespace (and, with ``repair``, fixed)."""

    segments: int = 0  #: committed segments (commit records)
    orphan_parts: list[str] = field(default_factory=list)  #: parts of no commit, not pending
    missing_parts: list[bytes] = field(default_factory=list)  #: committed, a part gone
    bad_records: list[bytes] = field(default_factory=list)  #: commit records that do not decode
    stale_index: list[bytes] = field(default_factory=list)  #: listed, not committed
    unindexed: list[bytes] = field(default_factory=list)  #: committed, not listed
    #: committed and whole, a page failing its digest (spec F-SC-3): (key, first bad page)
    damaged: list[tuple[bytes, int]] = field(default_factory=list)
    used_recorded: int = 0
    used_actual: int = 0
    repaired: bool = False

    @property
    def clean(self) -> bool:
        return not (self.orphan_parts or self.missing_parts or self.bad_records
                    or self.stale_index or self.unindexed or self.damaged
                    or self.used_recorded != self.used_actual)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Commit:
    """A decoded commit record: the write's nonce, its parts and the sidecar."""

    nonce: str
    parts: int
    part_bytes: int
    sidecar: Sidecar
    raw_len: int

    @property
    def head(self) -> bytes:
        return CommitRecord(self.nonce, self.parts, self.part_bytes, self.sidecar).head


class RedisSegment(PayloadReader):
    """A committed segment open for range reads: each read fetches the parts it spans (one
    pipelined round trip, ``GETRANGE`` each) into the caller's memory. Reads name the write
    that was open (its nonce): a part missing, short or of another write is a typed error.

    The bytes go from the socket straight into the caller's memory (:func:`_recv_bulks`: one
    kernel copy, no parser buffer, few system calls, so the GIL is released for long stretches
    and the hashing threads run meanwhile); any reply that is not exactly the bulk string
    expected (an error, a redirection, a part missing or short) drops that connection and the
    read runs again through the client's own parser, which gives it its typed outcome."""

    def __init__(self, backend: RedisBackend, commit: _Commit) -> None:
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
        if self._b._read_direct(key, [("GETRANGE", n, a, z) for n, (_, _, a, z)
                                      in zip(names, ranges, strict=True)],
                                [dst for dst, *_ in ranges]):  # fmt: skip
            return
        got = self._b._pipeline(
            "read", key,
            [("getrange", self._b._part(key, self._c.nonce, p), a, z) for _, p, a, z in ranges],
        )  # fmt: skip
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


class RedisBackend:
    """A level on Redis (:mod:`.redis_settings` names it); see the module's docstring. Keeps
    the segment-backend protocol (:class:`~stratastore.levels.backend.SegmentBackend`): every
    method from any thread, every call bounded by the timeout."""

    def __init__(self, settings: RemoteSettings, fingerprint: ModelFingerprint,
                 level: Level = Level.COLD, *, client: Any = None,
                 names: RemoteNames | None = None) -> None:  # fmt: skip
        """``names``: the keys of another namespace than ``fingerprint``'s (fsck of a namespace
        whose records name no model of its own: each is then judged another model's)."""
        self.settings = settings
        self.fingerprint = fingerprint
        self.level = level
        self.names = names or RemoteNames(check_name(settings.name), fingerprint.digest())
        self.ns = self.names.ns
        self.path = f"{settings.shown}#{self.ns}"
        self.part_bytes = settings.part_bytes
        self._client = client
        self._lock = threading.Lock()
        self.counters: dict[str, int] = dict.fromkeys(
            ("errors", "timeouts", "missing_parts", "raced_puts", "stale_index"), 0
        )  # fmt: skip
        self._closed = False
        self._until = threading.local()  #: this thread's :meth:`deadline`, if any

    @classmethod
    def open(cls, settings: RemoteSettings, fingerprint: ModelFingerprint,
             level: Level = Level.COLD) -> RedisBackend:  # fmt: skip
        """Connect and check the server answers (``PING``): a :class:`RemoteError` now, not at
        the first park, for a server that is down, a wrong password or TLS that fails."""
        b = cls(settings, fingerprint, level)
        try:
            b._call("connect", "", lambda: b._r.ping())
        except BaseException:
            b.close()
            raise
        return b

    # -- keys (spec F-REM-1: format/remote_record.py names them) ------------------------------
    def _rec_key(self, key: bytes) -> str:
        return self.names.record(key)

    def _part(self, key: bytes, nonce: str, i: int) -> str:
        return self.names.part(key, nonce, i)

    def _kids(self, parent: bytes) -> str:
        return self.names.kids(parent)

    @property
    def _recs(self) -> str:
        return self.names.recs

    @property
    def _ages(self) -> str:
        return self.names.ages

    @property
    def _used(self) -> str:
        return self.names.used

    # -- calls --------------------------------------------------------------------------------
    @property
    def _r(self) -> Any:
        """The redis-py client, made at first use (a cluster client connects as it is made: a
        cluster that is down is then a :class:`RemoteError` of the call, not of the open)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self.settings.client()
        return self._client

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + n

    @contextlib.contextmanager
    def deadline(self, seconds: float) -> Iterator[None]:
        """Every call this thread makes inside the block ends by ``seconds`` from now, all of
        them together (the chain walk of one lookup: one deadline for its round trips)."""
        outer = getattr(self._until, "t", None)
        self._until.t = min(time.monotonic() + seconds, outer if outer is not None else 1e300)
        try:
            yield
        finally:
            self._until.t = outer

    def _left(self, op: str, where: str) -> float:
        """Seconds this call may take: the settings' timeout, or what is left of this
        thread's :meth:`deadline` when less (none left: :class:`RemoteError`, timed out)."""
        left = self.settings.timeout_s
        until = getattr(self._until, "t", None)
        if until is not None:
            left = min(left, until - time.monotonic())
        if left <= 0:
            raise RemoteError(op, where, "timed out", errno.ETIMEDOUT)
        return left

    def _bounded(self, op: str, where: str, fn: Callable[[], T],
                 late: Callable[[T], object] | None = None) -> T:  # fmt: skip
        """``fn()`` run on a thread of its own while the caller waits at most :meth:`_left`:
        one deadline for the whole call, whatever the client does underneath (its retry, a
        cluster's redirects and slot-map refreshes). A call past it is left to end by its own
        socket timeouts, its result handed to ``late`` (a connection back to its pool) or
        dropped; the caller gets :class:`RemoteError` (timed out) now. ``fn`` must write no
        memory the caller keeps: what it returns is the caller's only once it is handed over."""
        left = self._left(op, where)
        gate = threading.Lock()
        done = threading.Event()
        box: list[tuple[bool, Any]] = []
        left_behind = False

        def run() -> None:
            try:
                got: tuple[bool, Any] = (True, fn())
            except BaseException as e:  # handed to the caller (or dropped, if it left)
                got = (False, e)
            with gate:
                if not left_behind:
                    box.append(got)
                    done.set()
                    return
            if got[0] and late is not None:
                late(got[1])

        threading.Thread(target=run, name="strata-remote-call", daemon=True).start()
        if not done.wait(left):
            with gate:
                if not box:
                    left_behind = True
            if left_behind:
                raise RemoteError(op, where, "timed out", errno.ETIMEDOUT)
        ok, got = box[0]
        if not ok:
            raise got
        return got  # type: ignore[no-any-return]

    def _call(self, op: str, key: bytes | str, fn: Callable[[], T], *,
              late: Callable[[T], object] | None = None, inline: bool = False) -> T:  # fmt: skip
        """Run one Redis call within one deadline (:meth:`_bounded`; ``inline``: on this
        thread, ``fn`` bounding itself by :meth:`_left`, for a call that writes the caller's
        memory); its failures as :class:`RemoteError` (counted). Without the ``redis``
        extra, a :class:`~stratastore.errors.ConfigError` naming it."""
        import ssl

        try:
            import redis.exceptions as rx
        except ImportError:
            raise ConfigError("the remote level needs the redis extra: pip install "
                              "'stratastore[redis]'") from None  # fmt: skip

        what = key.hex()[:16] if isinstance(key, bytes) else key
        where = f"{self.path} {what}".rstrip()
        try:
            return fn() if inline else self._bounded(op, where, fn, late)
        except RemoteError as e:
            self._count("errors")
            if e.errno == errno.ETIMEDOUT:
                self._count("timeouts")
            raise
        except rx.TimeoutError:
            self._count("timeouts")
            self._count("errors")
            raise RemoteError(op, where, "timed out", errno.ETIMEDOUT) from None
        except rx.AuthenticationError:
            self._count("errors")
            raise RemoteError(op, where, "authentication refused (check remote_username and "
                              "remote_password, or STRATA_REMOTE_USERNAME and "
                              "STRATA_REMOTE_PASSWORD)", errno.EACCES) from None  # fmt: skip
        except rx.ResponseError as e:
            # (a pipeline words it "Command # 1 (...) of pipeline caused error: WRONGTYPE ...")
            if "WRONGTYPE" not in str(e):  # (never a URL: "@" would say so)
                self._count("errors")
                why = type(e).__name__ if "@" in str(e) else f"{type(e).__name__}: {e}"
                raise RemoteError(op, where, why) from None
            raise FormatError(f"{where}: a value of another type where this backend keeps its "
                              "own (damage, or a key written by hand): strata fsck --remote "
                              "reports it") from None  # fmt: skip
        except (rx.ConnectionError, rx.ClusterError, rx.ClusterDownError, rx.TryAgainError,
                rx.RedisError, rx.RedisClusterException) as e:  # fmt: skip
            self._count("errors")
            why = type(e).__name__ if "@" in str(e) else f"{type(e).__name__}: {e}"
            err = errno.ECONNRESET if isinstance(e, rx.ConnectionError) else errno.EIO
            cause = e.__context__ if isinstance(e, rx.ConnectionError) else None
            if isinstance(cause, OSError) and cause.errno:  # refused, unreachable, reset
                err = cause.errno
            # a TLS setting is the user's to fix (EACCES, as a refused password: the level's
            # open says so at once), not a server that is down: the server's certificate not
            # trusted, or the client's TLS files missing or not matching
            if isinstance(cause, ssl.SSLCertVerificationError):
                err = errno.EACCES
                why = (f"TLS: the server's certificate was refused ({cause.verify_message}); "
                       "set remote_tls_ca to the CA file that signed it, and name the server in "
                       "remote_url as its certificate does")  # fmt: skip
            elif self.settings.tls and (
                (isinstance(cause, ssl.SSLError) and cause.library in ("PEM", "X509"))
                or type(cause) in (FileNotFoundError, PermissionError, IsADirectoryError)
            ):
                err = errno.EACCES
                why = (f"TLS: the files of remote_tls_ca, remote_tls_cert and remote_tls_key "
                       f"cannot be used ({cause}); name readable PEM files, the certificate "
                       "with its own key")  # fmt: skip
            raise RemoteError(op, where, why, err) from None
        except OSError as e:  # a TLS handshake, a socket the client did not wrap
            self._count("errors")
            raise RemoteError(op, where, f"{type(e).__name__}: {e.strerror or e}",
                              e.errno or errno.EIO) from None  # fmt: skip

    def _pipeline(self, op: str, key: bytes | str, cmds: Sequence[tuple[Any, ...]], *,
                  wrong_type: Any = _RAISE) -> list[Any]:  # fmt: skip
        """Run ``cmds`` (``(method, *args)``) in one pipelined round trip (no transaction).
        A reply that is a value of another type raises :class:`FormatError`, or with
        ``wrong_type`` given is that instead (one damaged key does not fail the others)."""

        def run() -> list[Any]:
            import redis.exceptions as rx

            p = self._r.pipeline(transaction=False)
            for name, *args in cmds:
                getattr(p, name)(*args)
            out: list[Any] = p.execute(raise_on_error=wrong_type is _RAISE)
            for i, got in enumerate(out):
                if isinstance(got, rx.ResponseError) and "WRONGTYPE" in str(got):
                    out[i] = wrong_type
                elif isinstance(got, Exception):
                    raise got
            return out

        return self._call(op, key, run)

    def _read_direct(self, key: bytes, cmds: list[tuple[str, str, int, int]],
                     into: list[memoryview]) -> bool:  # fmt: skip
        """Send ``cmds`` (reads of one segment: one hash slot) pipelined on a connection of the
        client's pool and receive each reply straight into its buffer in ``into``, which must
        be exactly that long (:func:`_recv_bulks`). False, having read nothing that counts,
        where this does not apply (a client that is not a plain redis-py one, a buffer that is
        not contiguous bytes) or a reply is anything else: the caller then reads through the
        client's parser. A timeout is a :class:`RemoteError` as for every call."""
        if not all(v.format == "B" and v.ndim == 1 and v.contiguous for v in into):
            return False
        pool = self._pool_of(cmds[0][1])
        if pool is None:
            return False
        # the connection within one deadline (a connect may retry); the replies received into
        # ``into`` on this thread, each receive bounded by what is left of it, so nothing
        # writes the caller's memory once this call has returned
        conn = self._call("read", key, partial(_connection, pool),
                          late=lambda c: c is not None and pool.release(c))  # fmt: skip
        if conn is None:
            return False
        where = f"{self.path} {key.hex()[:16]}"
        deadline = time.monotonic() + self._left("read", where)
        return self._call("read", key, partial(_pipelined_into, pool, conn, cmds, into, deadline),
                          inline=True)  # fmt: skip

    def _pool_of(self, name: str) -> Any:
        """The connection pool of the server holding key ``name`` (a cluster: the primary of
        its slot, as the client's slot map says), or None for a client of another kind."""
        import redis
        import redis.cluster

        r = self._r
        try:
            if isinstance(r, redis.cluster.RedisCluster):
                node = r.get_node_from_key(name)  # type: ignore[no-untyped-call]
                return r.get_redis_connection(node).connection_pool
            if isinstance(r, redis.Redis):
                return r.connection_pool
        except Exception:  # a slot not covered, a node gone: the client's own path says so
            return None
        return None

    def _record_bytes(self, op: str, key: bytes) -> tuple[int, bytes]:
        """``(length, bytes)`` of the value at ``key``'s commit record (:meth:`bounded_get`)."""
        return self.bounded_get(op, self._rec_key(key), key)

    def bounded_get(self, op: str, name: str, key: bytes | str = "") -> tuple[int, bytes]:
        """``(length, bytes)`` of the string at ``name``, of which at most
        :data:`MAX_COMMIT_RECORD_BYTES` are read (one round trip): a hostile value is never
        read whole. ``(0, b"")`` when there is none; a value of another type is a
        :class:`FormatError`."""
        n, raw = self._pipeline(op, key or name, [
            ("strlen", name), ("getrange", name, 0, MAX_COMMIT_RECORD_BYTES - 1)])  # fmt: skip
        return int(n), bytes(raw or b"")

    def _commit(self, key: bytes) -> _Commit | None:
        """The key's commit record, decoded; None when it is not committed."""
        n, raw = self._record_bytes("read", key)
        if not n:
            return None
        if n > len(raw):
            raise FormatError(f"the commit record of segment {key.hex()[:16]} in {self.path} is "
                              f"{n:,} bytes, longer than any commit record (damage, or a key "
                              "written by hand)")  # fmt: skip
        return self._decode(key, raw)

    def _decode(self, key: bytes, raw: bytes) -> _Commit:
        """``raw`` as the commit record of ``key`` (spec F-REM-2, then identity: F-READ-1 step
        8): a :class:`FormatError` for one that does not decode, names another segment or
        another model (damage under this namespace, never the caller's mistake)."""
        obj = f"the commit record of segment {key.hex()[:16]} in {self.path}"
        rec = decode_commit_record(raw, obj)
        sc = rec.sidecar
        if sc.key != key:
            raise FormatError(f"{obj} names segment {sc.key.hex()[:16]} (damaged or misplaced)")
        try:  # another model's record under this model's namespace: damage, a ladder stop
            self.fingerprint.require_same(sc.fingerprint, obj)
        except IncompatibleFingerprint as e:
            raise FormatError(f"{e} (damaged or misplaced)") from None
        return _Commit(rec.nonce, rec.parts, rec.part_bytes, sc, len(raw))

    def _need(self, key: bytes) -> _Commit:
        c = self._commit(key)
        if c is None:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}")
        return c

    # -- writing (spec F-DUR-2, F-DUR-7) ------------------------------------------------------
    def put_kv(
        self,
        parent_key: bytes,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        payload: Buffer,
        *,
        token_start: int,
        media: Sequence[MediaRef] = (),
        codec: Codec = Codec.RAW,
        page_hashes: npt.NDArray[np.uint8] | None = None,
    ) -> PutResult:
        u = kv_segment(self.fingerprint, parent_key, tokens, payload, token_start=token_start,
                       media=media, page_hashes=page_hashes)  # fmt: skip
        return self._put(u, codec)

    def put_state(
        self, checkpoint_key: bytes, payload: Buffer, *, token_pos: int, codec: Codec = Codec.RAW
    ) -> PutResult:
        return self._put(state_segment(checkpoint_key, payload, token_pos=token_pos), codec)

    def put_sealed(self, sidecar: Sidecar, stored: Buffer) -> PutResult:
        if sidecar.key in self:
            return PutResult(sidecar.key, False, 0)
        data = check_sealed(sidecar, stored, self.fingerprint)
        return self._write(resealed(sidecar, self.level), memoryview(data.data))

    def _put(self, u: Unsealed, codec: Codec) -> PutResult:
        if u.key in self:
            return PutResult(u.key, False, 0)
        enc = encode(u, codec)
        # RAW is written as it is: the parts are slices of the caller's bytes
        view = u.payload if codec is Codec.RAW else memoryview(b"".join(enc.chunks))
        return self._write_with(u.key, view, lambda: sidecar_for(
            u, enc, enc.hashes(), self.fingerprint, self.level))  # fmt: skip

    def _write(self, sc: Sidecar, stored: memoryview) -> PutResult:
        return self._write_with(sc.key, stored, lambda: sc)

    def _write_with(self, key: bytes, stored: memoryview, sidecar: Callable[[], Sidecar]
                    ) -> PutResult:  # fmt: skip
        """Write the parts of ``stored`` (pending), then commit the sidecar ``sidecar()``
        gives once they are written (a RAW put hashes its pages meanwhile)."""
        if stored.format != "B" or stored.ndim != 1:
            stored = stored.cast("B")
        nonce, pb = os.urandom(16).hex(), self.part_bytes
        n = max(1, -(-len(stored) // pb))
        parts = [self._part(key, nonce, i) for i in range(n)]
        try:
            self._pipeline("put", key, [("set", parts[i], stored[i * pb : (i + 1) * pb],
                                         None, PENDING_MS) for i in range(n)])  # fmt: skip
            sc = sidecar()
            value = CommitRecord(nonce, n, pb, sc).encode()
            got = self._call("commit", key, lambda: self._r.eval(
                _COMMIT, len(parts) + 1, self._rec_key(key), *parts, value))  # fmt: skip
        except BaseException:
            self._drop_parts(key, parts)
            raise
        if got == 0:  # another writer committed this key first: one copy is kept
            self._count("raced_puts")
            self._drop_parts(key, parts)
            return PutResult(key, False, 0)
        if got != 1:
            self._drop_parts(key, parts)
            raise RemoteError("commit", f"{self.path} {key.hex()[:16]}",
                              "a part expired or was evicted before the commit (a write slower "
                              f"than {PENDING_MS // 1000} s, or Redis out of memory)")  # fmt: skip
        self._index_add(key, sc, IndexRecord.from_sidecar(sc, len(value), sc.stored_bytes))
        return PutResult(key, True, sc.stored_bytes)

    def _drop_parts(self, key: bytes, parts: Iterable[str]) -> None:
        """Delete ``parts`` (one write's, one slot) in batches of :data:`_NAMES`, stopping
        after a batch of which none was there (a record that claimed more parts than were
        ever written: what is left, if anything, is an orphan for fsck). Best effort: pending
        parts expire anyway (:data:`PENDING_MS`)."""
        it = iter(parts)
        with contextlib.suppress(RemoteError):
            while batch := list(itertools.islice(it, _NAMES)):
                if not self._call("put", key, partial(self._r.delete, *batch)):
                    return

    def _index_add(self, key: bytes, sc: Sidecar, rec: IndexRecord) -> None:
        cmds: list[tuple[Any, ...]] = [
            ("hset", self._recs, key.hex(), rec.pack()),
            ("zadd", self._ages, {f"{sc.sealed_at_ns:020d}:{key.hex()}": 0}),
            ("incrby", self._used, rec.total_bytes),
        ]
        if sc.kind is Kind.KV:
            cmds.append(("hset", self._kids(sc.parent_key), key.hex(),
                         f"{sc.token_start}:{sc.token_end}"))  # fmt: skip
        self._pipeline("index", key, cmds)

    def _index_drop(self, key: bytes, rec: IndexRecord) -> None:
        """Remove ``key``'s derived entries; ``used`` goes down only for whoever removed its
        record (two deleters never subtract it twice)."""
        if self._call("index", key, lambda: self._r.hdel(self._recs, key.hex())) != 1:
            return
        cmds: list[tuple[Any, ...]] = [
            ("decrby", self._used, rec.total_bytes),
            ("zrem", self._ages, f"{rec.sealed_at_ns:020d}:{key.hex()}"),
        ]
        if rec.kind is Kind.KV:
            cmds.append(("hdel", self._kids(rec.parent_key), key.hex()))
        self._pipeline("index", key, cmds)

    # -- reading (spec F-SC-3, F-IDX) ---------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return bool(self._call("read", key, lambda: self._r.exists(self._rec_key(key))))

    def record(self, key: bytes) -> IndexRecord:
        raw = self._call("read", key, lambda: self._r.hget(self._recs, key.hex()))
        if raw is None or key not in self:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}")
        return IndexRecord.unpack(raw, f"the index record of {key.hex()[:16]} in {self.path}")

    def keys(self) -> list[bytes]:
        """The listed segments (a listing entry that does not decode is skipped: fsck)."""
        got = self._call("list", "", lambda: self._r.hkeys(self._recs))
        return [k for k in map(_hex_key, got) if k is not None]

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        """The listed segments and their index records (entries that do not decode skipped)."""
        got = self._call("list", "", lambda: self._r.hgetall(self._recs))
        out = []
        for f, v in got.items():
            key, rec = _hex_key(f), _index_record(v)
            if key is not None and rec is not None:
                out.append((key, rec))
        return out

    def open_reader(self, key: bytes) -> RedisSegment:
        return RedisSegment(self, self._need(key))

    def prefetch(self, key: bytes) -> bool:
        return False

    def read_into(self, key: bytes, offset: int, out: Buffer) -> int:
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only; pass a writable one")
        with self.open_reader(key) as seg:
            end = seg.sidecar.stored_bytes
            if offset < 0 or offset > end:
                raise OutOfRange(f"offset {offset} is outside the {end} stored bytes of "
                                 f"segment {key.hex()[:16]}")  # fmt: skip
            n = min(len(dst), end - offset)
            if n:
                seg.read_into(dst[:n], offset)
        return n

    def get_into(self, key: bytes, out: Buffer, *, verify: bool = True) -> Sidecar:
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only; pass a writable one")
        with self.open_reader(key) as seg:
            sc = seg.sidecar
            if len(dst) < sc.payload_bytes:
                raise StoreError(f"output buffer is {len(dst):,} bytes; segment {key.hex()[:16]} "
                                 f"needs {sc.payload_bytes:,}")  # fmt: skip
            seg.copy_validated(dst[: sc.payload_bytes], verify)
        return sc

    def get_bytes(self, key: bytes, *, max_bytes: int) -> bytes:
        with self.open_reader(key) as seg:
            if seg.sidecar.payload_bytes > max_bytes:
                raise StoreError(f"segment {key.hex()[:16]} is {seg.sidecar.payload_bytes:,} "
                                 f"bytes, over the {max_bytes:,} asked for")  # fmt: skip
            out = bytearray(seg.sidecar.payload_bytes)
            seg.copy_validated(memoryview(out), True)
        return bytes(out)

    def children(self, parent: bytes) -> list[tuple[bytes, int, int]]:
        """The K/V segments stored after the prefix ``parent``: ``(key, start, end)`` each (how
        a node that did not park a chain finds it from a prompt's tokens)."""
        return self.children_many([parent])[0]

    def children_many(self, parents: Sequence[bytes]) -> list[list[tuple[bytes, int, int]]]:
        """:meth:`children` of each of ``parents``, in one pipelined round trip."""
        got = self._pipeline("lookup", parents[0] if parents else "",
                             [("hgetall", self._kids(p)) for p in parents],
                             wrong_type={})  # a damaged listing finds nothing  # fmt: skip
        return [_children(kids) for kids in got]

    # -- managing -----------------------------------------------------------------------------
    def delete(self, key: bytes) -> bool:
        """Remove ``key``: its commit record (a script: only while it names the write read
        here), then its parts, in batches, then its derived entries. A record that does not
        decode goes too; its parts are orphans for fsck."""
        n, raw = self._record_bytes("delete", key)
        rec_raw = self._call("delete", key, lambda: self._r.hget(self._recs, key.hex()))
        removed = False
        if n:
            c: CommitRecord | None = None
            with contextlib.suppress(StrataError):  # damaged: removed by its own first bytes
                c = decode_commit_record(raw) if n <= len(raw) else None
            if c is not None and c.sidecar.key != key:  # another segment's: its parts are not
                c = None  # this name's (fsck finds this name's as orphans)
            # (another model's record, under this name: removed with its parts)
            head = c.head if c is not None else raw[:8]
            removed = self._call("delete", key, lambda: self._r.eval(
                _DELETE, 1, self._rec_key(key), head)) == 1  # fmt: skip
            if removed and c is not None:
                self._drop_parts(key, (self._part(key, c.nonce, i) for i in range(c.parts)))
        if rec_raw is not None and (removed or not n):
            try:
                self._index_drop(key, IndexRecord.unpack(rec_raw))
            except FormatError:
                self._call("delete", key, lambda: self._r.hdel(self._recs, key.hex()))
        return removed

    def __len__(self) -> int:
        return int(self._call("list", "", lambda: self._r.hlen(self._recs)))

    def used(self) -> int:
        got = self._call("list", "", lambda: self._r.get(self._used))
        try:
            return max(0, int(got or 0))
        except ValueError:
            raise FormatError(f"the byte count {self._used} in {self.path} is not a number "
                              "(damage, or a key written by hand): strata fsck --remote "
                              "--repair rebuilds it") from None  # fmt: skip

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        after: bytes = b"-"
        while True:
            rows: list[bytes] = self._call("list", "", partial(
                self._r.zrangebylex, self._ages, after, "+", start=0, num=_BATCH))  # fmt: skip
            if not rows:
                return
            keys = [r.split(b":", 1)[-1] for r in rows]  # a row of another shape finds nothing
            recs = self._call("list", "", partial(self._r.hmget, self._recs, keys))
            for k, raw in zip(keys, recs, strict=True):
                key, rec = _hex_key(k), _index_record(raw)
                if key is not None and rec is not None:
                    yield key, rec
            after = b"(" + rows[-1]

    def eviction_settings(self) -> dict[str, tuple[int, str]] | None:
        """Each server's ``maxmemory`` and ``maxmemory-policy`` (a cluster: every primary's),
        by ``host:port``; None where the server does not say (``CONFIG`` refused, as managed
        services and restricted ACL users do)."""
        import redis.cluster

        r: Any = self._r
        per: dict[str, Any]
        try:
            if isinstance(self._r, redis.cluster.RedisCluster):
                got: dict[str, Any] = self._call("connect", "", lambda: r.config_get(
                    "maxmemory*", target_nodes=redis.cluster.RedisCluster.PRIMARIES))  # fmt: skip
                per = got if all(isinstance(v, dict) for v in got.values()) else {"?": got}
            else:
                per = {
                    self.settings.shown: self._call(
                        "connect", "", lambda: r.config_get("maxmemory*")
                    )
                }
            out: dict[str, tuple[int, str]] = {}
            for node, cfg in per.items():
                out[node] = (int(cfg.get("maxmemory") or 0), str(cfg.get("maxmemory-policy", "")))
            return out
        except (RemoteError, ValueError, AttributeError, TypeError):
            return None

    def relocate_from(self, src: Any, key: bytes) -> Relocated:
        return relocate_by_copy(self, src, key)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            with contextlib.suppress(Exception):  # a client that never connected
                self._client.close()

    # -- checking the namespace -----------------------------------------------------------------
    def fsck(self, *, repair: bool = False, deep: bool = False) -> RemoteReport:
        """Check this namespace and nothing else (every key scanned starts with :attr:`ns`):
        commit records that decode and whose parts are all there, parts of no commit (not
        pending: an in-flight write's parts have a TTL), and the derived listing and ``used``
        against the commit records. With ``repair``: orphan parts are deleted (each in a script
        that re-checks, in the segment's slot, that no commit names its write and that it has
        no expiry: a write committed meanwhile keeps its parts), segments missing a part are
        deleted, the listing and ``used`` are rebuilt from the commit records (a listing entry
        that does not decode is stale: dropped, and listed again when its segment is whole).
        Only the names of spec F-REM-1 are judged; a name of any other shape in the namespace
        is left as it is (never judged, never deleted). Every whole segment's pages are hashed
        against its sidecar (``deep``: every page; else the first and the last), read a
        bounded chunk at a time; one that fails is ``damaged`` and, with ``repair``, deleted
        under the commit protocol (F-REM-3). A read that fails judges nothing (raised)."""
        rep = RemoteReport()
        commits: dict[bytes, _Commit] = {}
        parts: dict[tuple[bytes, str], list[str]] = {}  #: (key, nonce) -> names seen
        for raw_name in self._call("fsck", "", lambda: list(self._r.scan_iter(
                match=f"{self.ns}*", count=1000))):  # fmt: skip
            name = raw_name.decode("utf-8", "replace")
            if not name.startswith(self.ns):  # never anything outside the namespace
                continue
            shaped = parse_remote_name(name[len(self.ns) :])
            if shaped is None:  # not a name this backend writes: left as it is
                continue
            key, nonce, _ = shaped
            if nonce is not None:
                parts.setdefault((key, nonce), []).append(name)
                continue
            try:
                c = self._commit(key)
            except RemoteError:  # the server failed: nothing is judged on a failed read
                raise
            except StrataError:  # damaged, too long, of another type, another model's
                rep.bad_records.append(key)
                continue
            if c is not None:
                commits[key] = c
        rep.segments = len(commits)
        for (key, nonce), names in parts.items():
            c = commits.get(key)
            if c is not None and c.nonce == nonce:
                continue
            for name in names:
                if self._call("fsck", name, partial(self._r.pttl, name)) == -1:  # not pending
                    rep.orphan_parts.append(name)
        for key, c in commits.items():
            if not self._parts_there(key, c):
                rep.missing_parts.append(key)
            elif (bad := self._first_bad_page(key, deep)) >= 0:
                rep.damaged.append((key, bad))
        # the listing as stored: an entry whose field or record does not decode is stale
        listed: dict[bytes, IndexRecord | None] = {}
        fields: dict[bytes, bytes] = {}  #: listed key -> its field (itself when not hex)
        for f, v in self._call("fsck", "", lambda: self._r.hgetall(self._recs)).items():
            key = _hex_key(f) or f
            fields[key] = f
            listed[key] = _index_record(v) if key != f else None
        gone = {*rep.missing_parts, *(k for k, _ in rep.damaged)}
        whole = {k: c for k, c in commits.items() if k not in gone}
        rep.stale_index = [k for k, r in listed.items() if k not in whole or r is None]
        rep.unindexed = [k for k in whole if listed.get(k) is None]
        try:
            rep.used_recorded = self.used()
        except FormatError:  # not a number: never equal to the actual bytes
            rep.used_recorded = -1
        rep.used_actual = sum(c.raw_len + c.sidecar.stored_bytes for c in whole.values())
        if repair and not rep.clean:
            self._repair(rep, listed, fields, whole)
        return rep

    def _first_bad_page(self, key: bytes, deep: bool) -> int:
        """The first page of committed segment ``key`` failing its digest (-1: none; 0 for a
        compressed payload that does not decode); every page with ``deep``, else the first and
        the last. A part gone meanwhile is a page that fails (its segment is not whole)."""
        try:
            with self.open_reader(key) as seg:
                return seg.first_bad_page(sample=not deep)
        except RemoteError:  # the server failed: nothing is judged on a failed read
            raise
        except (FormatError, ChecksumMismatch, SegmentNotFound):
            return 0

    def _parts_there(self, key: bytes, c: _Commit) -> bool:
        """Whether every part of ``c`` exists (checked in batches; the first gap ends it)."""
        names = (self._part(key, c.nonce, i) for i in range(c.parts))
        while batch := list(itertools.islice(names, _NAMES)):
            if self._call("fsck", key, partial(self._r.exists, *batch)) != len(batch):
                return False
        return True

    def _repair(self, rep: RemoteReport, listed: dict[bytes, IndexRecord | None],
                fields: dict[bytes, bytes], whole: dict[bytes, _Commit]) -> None:  # fmt: skip
        """:meth:`fsck`'s repairs of what ``rep`` found (see there)."""
        by_write: dict[tuple[bytes, str], list[str]] = {}
        for name in rep.orphan_parts:
            shaped = parse_remote_name(name[len(self.ns) :])
            assert shaped is not None and shaped[1] is not None
            by_write.setdefault((shaped[0], shaped[1]), []).append(name)
        for (key, nonce), names in by_write.items():
            for at in range(0, len(names), _NAMES):
                batch = names[at : at + _NAMES]
                self._call("repair", key, partial(self._r.eval, _DROP_ORPHANS, len(batch) + 1,
                                                  self._rec_key(key), *batch,
                                                  f"SRC1:{nonce}:"))  # fmt: skip
        for key in rep.missing_parts + rep.bad_records + [k for k, _ in rep.damaged]:
            try:
                self.delete(key)
            except FormatError:  # a value of another type at the record's name: it goes
                self._call("repair", key, partial(self._r.eval, _DROP_NOT_STRING, 1,
                                                  self._rec_key(key)))  # fmt: skip
        for key in rep.stale_index:
            rec = listed[key]
            if rec is not None and key in self:  # committed since the scan: listed, keep it
                continue
            if rec is not None:
                self._index_drop(key, rec)
            else:  # nothing to undo but the entry itself (used is rebuilt below)
                self._call("repair", key, partial(self._r.hdel, self._recs, fields[key]))
        for key in rep.unindexed:
            c = whole[key]
            rec = IndexRecord.from_sidecar(c.sidecar, c.raw_len, c.sidecar.stored_bytes)
            self._index_add(key, c.sidecar, rec)
        now = sum(r.total_bytes for _, r in self.records())
        self._call("repair", "", lambda: self._r.set(self._used, now))
        rep.repaired = True


def _children(kids: dict[bytes, bytes]) -> list[tuple[bytes, int, int]]:
    """A ``kids`` hash as ``(key, start, end)`` rows; a damaged entry finds nothing (the walk
    checks every child by its key anyway)."""
    out = []
    for k, v in kids.items():
        key = _hex_key(k)
        try:
            s, e = (int(x) for x in v.split(b":"))
        except ValueError:
            continue
        if key is not None:
            out.append((key, s, e))
    return out


def _hex_key(field: bytes) -> bytes | None:
    """A listing's field as a segment key (64 hex digits), or None for anything else."""
    try:
        key = bytes.fromhex(field.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        return None
    return key if len(key) == 32 else None


def _index_record(raw: bytes | None) -> IndexRecord | None:
    """A listing's value as an index record, or None (absent, or not one: fsck says so)."""
    if raw is None:
        return None
    try:
        return IndexRecord.unpack(raw)
    except FormatError:
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


def _pipelined_into(pool: Any, conn: Any, cmds: list[tuple[str, str, int, int]],
                    into: list[memoryview], deadline: float) -> bool:  # fmt: skip
    """:meth:`RedisBackend._read_direct` on ``conn``, a connection of ``pool``: sent, received
    into ``into``; False at the first reply that is not the bulk string expected, or a
    connection the pool handed out dropped (the caller's retry through the client reconnects).
    Any connection not left exactly between replies is dropped before it goes back to the
    pool. The monotonic ``deadline`` bounds the whole call (the send, and the replies of a
    server that trickles)."""
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


if TYPE_CHECKING:  # the protocol check (mypy strict), as backend.py does for the directory
    from stratastore.levels.backend import SegmentBackend

    _remote: type[SegmentBackend] = RedisBackend
