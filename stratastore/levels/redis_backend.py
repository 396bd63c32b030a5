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
:class:`~stratastore.store.SegmentNotFound`; a value corrupted in Redis fails its digest
(:class:`~stratastore.format.ChecksumMismatch`) or its sidecar's trailer. Each is counted in
:attr:`RedisBackend.counters`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import StrataError
from ..format import (
    Codec,
    FormatError,
    IndexRecord,
    Kind,
    Level,
    MediaRef,
    ModelFingerprint,
    Sidecar,
)
from ..format.remote_record import CommitRecord, decode_commit_record
from ..io.errors import StrataIOError
from ..store import OutOfRange, PayloadReader, PutResult, SegmentNotFound, StoreError
from ..store.relocation import Relocated, relocate_by_copy, resealed
from ..store.sealing import (
    Buffer,
    Unsealed,
    byte_view,
    check_sealed,
    encode,
    kv_segment,
    sidecar_for,
    state_segment,
)
from .redis_settings import RemoteSettings, namespace

__all__ = ["RedisBackend", "RemoteError", "RemoteReport"]

T = TypeVar("T")
PENDING_MS = 600_000  #: how long an uncommitted part lives (a write abandoned mid-way expires)
_BATCH = 256  #: rows ``oldest`` reads at a time
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
# KEYS[1] the commit record, KEYS[2..] its parts; ARGV[1] the record's head (its nonce): the
# record is removed only if it is still that write's. 1: removed; 0: not (gone or replaced).
_DELETE = """
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, string.len(ARGV[1])) ~= ARGV[1] then return 0 end
redis.call('DEL', unpack(KEYS))
return 1
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
    used_recorded: int = 0
    used_actual: int = 0
    repaired: bool = False

    @property
    def clean(self) -> bool:
        return not (self.orphan_parts or self.missing_parts or self.bad_records
                    or self.stale_index or self.unindexed
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
                 level: Level = Level.COLD, *, client: Any = None) -> None:  # fmt: skip
        self.settings = settings
        self.fingerprint = fingerprint
        self.level = level
        self.ns = namespace(settings.name, fingerprint)
        self.path = f"{settings.shown}#{self.ns}"
        self.part_bytes = settings.part_bytes
        self._client = client
        self._lock = threading.Lock()
        self.counters: dict[str, int] = dict.fromkeys(
            ("errors", "timeouts", "missing_parts", "raced_puts", "stale_index"), 0
        )  # fmt: skip
        self._closed = False

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

    # -- keys ---------------------------------------------------------------------------------
    def _rec_key(self, key: bytes) -> str:
        return f"{self.ns}s/{{{key.hex()}}}"

    def _part(self, key: bytes, nonce: str, i: int) -> str:
        return f"{self.ns}p/{{{key.hex()}}}/{nonce}/{i}"

    def _kids(self, parent: bytes) -> str:
        return f"{self.ns}kids/{{{parent.hex()}}}"

    @property
    def _recs(self) -> str:
        return f"{self.ns}recs"

    @property
    def _ages(self) -> str:
        return f"{self.ns}ages"

    @property
    def _used(self) -> str:
        return f"{self.ns}used"

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

    def _call(self, op: str, key: bytes | str, fn: Callable[[], T]) -> T:
        """Run one Redis call; its failures as :class:`RemoteError` (counted)."""
        import ssl

        import redis.exceptions as rx

        what = key.hex()[:16] if isinstance(key, bytes) else key
        where = f"{self.path} {what}".rstrip()
        try:
            return fn()
        except rx.TimeoutError:
            self._count("timeouts")
            self._count("errors")
            raise RemoteError(op, where, "timed out", errno.ETIMEDOUT) from None
        except rx.AuthenticationError:
            self._count("errors")
            raise RemoteError(op, where, "authentication refused (check remote_username and "
                              "remote_password, or STRATA_REMOTE_USERNAME and "
                              "STRATA_REMOTE_PASSWORD)", errno.EACCES) from None  # fmt: skip
        except (rx.ConnectionError, rx.ClusterError, rx.ClusterDownError, rx.TryAgainError,
                rx.ResponseError, rx.RedisError, rx.RedisClusterException) as e:  # fmt: skip
            self._count("errors")
            why = type(e).__name__ if "@" in str(e) else f"{type(e).__name__}: {e}"
            err = errno.ECONNRESET if isinstance(e, rx.ConnectionError) else errno.EIO
            # a TLS setting is the user's to fix (EACCES, as a refused password: the level's
            # open says so at once), not a server that is down: the server's certificate not
            # trusted, or the client's TLS files missing or not matching
            cause = e.__context__ if isinstance(e, rx.ConnectionError) else None
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

    def _pipeline(self, op: str, key: bytes | str, cmds: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run ``cmds`` (``(method, *args)``) in one pipelined round trip (no transaction)."""

        def run() -> list[Any]:
            p = self._r.pipeline(transaction=False)
            for name, *args in cmds:
                getattr(p, name)(*args)
            out: list[Any] = p.execute()
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
        return self._call("read", key, partial(_pipelined_into, pool, cmds, into))

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

    def _commit(self, key: bytes) -> _Commit | None:
        """The key's commit record, decoded; None when it is not committed."""
        raw = self._call("read", key, lambda: self._r.get(self._rec_key(key)))
        if raw is None:
            return None
        return self._decode(key, raw)

    def _decode(self, key: bytes, raw: bytes) -> _Commit:
        """``raw`` as the commit record of ``key`` (spec F-REM-2, then identity: F-READ-1 step
        8): a :class:`FormatError` for one that does not decode or names another segment, an
        :class:`IncompatibleFingerprint` for another model's."""
        obj = f"the commit record of segment {key.hex()[:16]} in {self.path}"
        rec = decode_commit_record(raw, obj)
        sc = rec.sidecar
        if sc.key != key:
            raise FormatError(f"{obj} names segment {sc.key.hex()[:16]} (damaged or misplaced)")
        self.fingerprint.require_same(sc.fingerprint, obj)
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

    def _drop_parts(self, key: bytes, parts: list[str]) -> None:
        with contextlib.suppress(RemoteError):  # pending parts expire anyway (PENDING_MS)
            self._call("put", key, lambda: self._r.delete(*parts))

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
        got = self._call("list", "", lambda: self._r.hkeys(self._recs))
        return [bytes.fromhex(k.decode()) for k in got]

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        got = self._call("list", "", lambda: self._r.hgetall(self._recs))
        return [(bytes.fromhex(k.decode()), IndexRecord.unpack(v)) for k, v in got.items()]

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
        got = self._call("lookup", parent, lambda: self._r.hgetall(self._kids(parent)))
        out = []
        for k, v in got.items():
            try:
                s, e = (int(x) for x in v.split(b":"))
                out.append((bytes.fromhex(k.decode()), s, e))
            except ValueError:
                continue  # a damaged entry finds nothing (the walk validates by key anyway)
        return out

    # -- managing -----------------------------------------------------------------------------
    def delete(self, key: bytes) -> bool:
        raw = self._call("delete", key, lambda: self._r.get(self._rec_key(key)))
        rec_raw = self._call("delete", key, lambda: self._r.hget(self._recs, key.hex()))
        removed = False
        if raw is not None:
            try:
                c = self._decode(key, raw)
                keys = [self._rec_key(key)] + [self._part(key, c.nonce, i) for i in range(c.parts)]
                head = c.head
            except StrataError:  # a damaged record goes; its parts are orphans for fsck
                keys, head = [self._rec_key(key)], raw[:8]
            removed = self._call("delete", key, lambda: self._r.eval(
                _DELETE, len(keys), *keys, head)) == 1  # fmt: skip
        if rec_raw is not None and (removed or raw is None):
            try:
                self._index_drop(key, IndexRecord.unpack(rec_raw))
            except FormatError:
                self._call("delete", key, lambda: self._r.hdel(self._recs, key.hex()))
        return removed

    def __len__(self) -> int:
        return int(self._call("list", "", lambda: self._r.hlen(self._recs)))

    def used(self) -> int:
        got = self._call("list", "", lambda: self._r.get(self._used))
        return max(0, int(got or 0))

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        after = "-"
        while True:
            rows: list[bytes] = self._call("list", "", partial(
                self._r.zrangebylex, self._ages, after, "+", start=0, num=_BATCH))  # fmt: skip
            if not rows:
                return
            keys = [r.decode().split(":", 1)[1] for r in rows]
            recs = self._call("list", "", partial(self._r.hmget, self._recs, keys))
            for k, raw in zip(keys, recs, strict=True):
                if raw is not None:
                    yield bytes.fromhex(k), IndexRecord.unpack(raw)
            after = "(" + rows[-1].decode()

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
    def fsck(self, *, repair: bool = False) -> RemoteReport:
        """Check this namespace and nothing else (every key scanned starts with :attr:`ns`):
        commit records that decode and whose parts are all there, parts of no commit (not
        pending: an in-flight write's parts have a TTL), and the derived listing and ``used``
        against the commit records. With ``repair``: orphan parts are deleted, segments missing
        a part are deleted, the listing and ``used`` are rebuilt from the commit records (a
        listing entry that does not decode is stale: dropped, and listed again when its segment
        is whole). A name in the namespace that is not shaped as this backend's keys is left as
        it is (never judged, never deleted)."""
        rep = RemoteReport()
        commits: dict[bytes, _Commit] = {}
        parts: dict[str, list[str]] = {}
        for raw_name in self._call("fsck", "", lambda: list(self._r.scan_iter(
                match=f"{self.ns}*", count=1000))):  # fmt: skip
            try:
                name = raw_name.decode()
            except UnicodeDecodeError:  # not a name this backend writes: left as it is
                continue
            if not name.startswith(self.ns):  # never anything outside the namespace
                continue
            rest = name[len(self.ns) :]
            if rest.startswith("s/{"):
                try:
                    key = bytes.fromhex(rest[3:-1] if rest.endswith("}") else "-")
                except ValueError:  # not a name this backend writes: left as it is
                    continue
                raw = self._call("fsck", key, partial(self._r.get, name))
                if raw is None:
                    continue
                try:
                    commits[key] = self._decode(key, raw)
                except StrataError:
                    rep.bad_records.append(key)
            elif rest.startswith("p/{"):
                parts.setdefault(rest[3:].split("}", 1)[0], []).append(name)
        rep.segments = len(commits)
        for khex, names in parts.items():
            try:
                c = commits.get(bytes.fromhex(khex))
            except ValueError:  # not a name this backend writes: left as it is
                continue
            for name in names:
                nonce = name.rsplit("/", 2)[1]
                if c is None or nonce != c.nonce:
                    ttl = self._call("fsck", name, partial(self._r.pttl, name))
                    if ttl == -1:  # not pending: nobody will commit it
                        rep.orphan_parts.append(name)
        for key, c in commits.items():
            names = [self._part(key, c.nonce, i) for i in range(c.parts)]
            have = self._call("fsck", key, partial(self._r.exists, *names))
            if have != c.parts:
                rep.missing_parts.append(key)
        # the listing as stored: an entry whose field or record does not decode is stale
        listed: dict[bytes, IndexRecord | None] = {}
        fields: dict[bytes, bytes] = {}  #: listed key -> its field (itself when not hex)
        for f, v in self._call("fsck", "", lambda: self._r.hgetall(self._recs)).items():
            try:
                key = bytes.fromhex(f.decode())
            except ValueError:  # UnicodeDecodeError included
                key = f
            fields[key] = f
            try:
                listed[key] = IndexRecord.unpack(v) if key != f else None
            except FormatError:
                listed[key] = None
        whole = {k: c for k, c in commits.items() if k not in rep.missing_parts}
        rep.stale_index = [k for k, r in listed.items() if k not in whole or r is None]
        rep.unindexed = [k for k in whole if listed.get(k) is None]
        raw_used = self._call("fsck", "", lambda: self._r.get(self._used))
        try:
            rep.used_recorded = int(raw_used or 0)
        except ValueError:  # not a number: never equal to the actual bytes
            rep.used_recorded = -1
        rep.used_actual = sum(c.raw_len + c.sidecar.stored_bytes for c in whole.values())
        if repair and not rep.clean:
            for name in rep.orphan_parts:
                self._call("repair", name, partial(self._r.delete, name))
            for key in rep.missing_parts + rep.bad_records:
                self.delete(key)
                self._call("repair", key, partial(self._r.delete, self._rec_key(key)))
            for key in rep.stale_index:
                rec = listed[key]
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
        return rep


def _pipelined_into(pool: Any, cmds: list[tuple[str, str, int, int]],
                    into: list[memoryview]) -> bool:  # fmt: skip
    """:meth:`RedisBackend._read_direct` on one connection of ``pool``: sent, received into
    ``into``; False at the first reply that is not the bulk string expected, or a connection
    the pool handed out dropped (the caller's retry through the client reconnects). Any
    connection not left exactly between replies is dropped before it goes back to the pool."""
    import redis.exceptions as rx

    try:
        conn = pool.get_connection()
    except (rx.TimeoutError, rx.AuthenticationError):
        raise
    except (OSError, rx.ConnectionError):  # refused: the client's own path retries, says so
        return False
    clean = False
    try:
        sock = getattr(conn, "_sock", None)
        if not isinstance(sock, socket.socket):  # a caching or proxy connection: not ours
            clean = True
            return False
        conn.send_packed_command(conn.pack_commands(cmds))
        clean = _recv_bulks(sock, into)
        return clean
    except TimeoutError:  # socket.timeout: the settings' timeout, per receive
        raise rx.TimeoutError("Timeout reading from socket") from None
    except (rx.TimeoutError, rx.AuthenticationError):
        raise
    except (OSError, rx.ConnectionError):  # dropped: the client's own path reconnects
        return False
    finally:
        if not clean:
            conn.disconnect()
        pool.release(conn)


def _recv_bulks(sock: socket.socket, into: list[memoryview]) -> bool:
    """Receive one RESP bulk string reply of exactly ``len(v)`` bytes into each ``v`` of
    ``into``, in turn, from ``sock``: the header and the CRLF through a small buffer, the
    payload with ``recv_into`` straight into ``v`` (the few payload bytes that came with a
    header are copied from that buffer). True when every reply was that and nothing followed;
    False at the first reply that is not (an error, a null, another length): the connection is
    then out of step and must be dropped. A closed connection raises ConnectionError."""
    pend = bytearray()

    def more() -> None:
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
    from .backend import SegmentBackend

    _remote: type[SegmentBackend] = RedisBackend
