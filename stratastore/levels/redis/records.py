"""What a Redis level keeps in Redis, and the commit protocol that keeps it whole (spec F-REM-1
.. F-REM-3).

Keys (``NS`` is :func:`~stratastore.levels.redis.settings.namespace`: ``strata/<name>/<fp>/``;
``{K}`` is the segment key in hex, in braces: a hash tag, so in a cluster a segment's commit
record and parts live in one slot, on one node)::

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
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from stratastore.errors import StrataError
from stratastore.format import (
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
    Kind,
    ModelFingerprint,
    NotAuthenticated,
    Sidecar,
)
from stratastore.format.level_key import LevelKeys
from stratastore.format.remote_record import CommitRecord, RemoteNames, decode_commit_record
from stratastore.levels.backend import PutResult
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.redis.client import RedisCalls, RemoteError

__all__ = [
    "NAMES_PER_CALL",
    "PENDING_MS",
    "Commit",
    "RedisRecords",
    "children",
    "hex_key",
    "index_record",
]

PENDING_MS = 600_000  #: how long an uncommitted part lives (a write abandoned mid-way expires)
NAMES_PER_CALL = 1024  #: part names one call checks or deletes at most

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


@dataclass(frozen=True, slots=True)
class Commit:
    """A decoded commit record: the write's nonce, its parts and the sidecar."""

    nonce: str
    parts: int
    part_bytes: int
    sidecar: Sidecar
    raw_len: int

    @property
    def head(self) -> bytes:
        return CommitRecord(self.nonce, self.parts, self.part_bytes, self.sidecar).head


class RedisRecords(RedisCalls):
    """The records of one namespace (see the module): its names, its commit records, writes
    and deletes under the commit protocol, and the derived listing kept beside them."""

    fingerprint: ModelFingerprint
    names: RemoteNames
    ns: str
    part_bytes: int
    #: a keyed level's keys (spec F-KEYED): a commit record whose sidecar is not keyed by one
    #: of them is damage (counted: ``unauthenticated``)
    level_keys: LevelKeys | None

    # -- names (spec F-REM-1: format/remote_record.py spells them) ------------------------------
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

    # -- commit records (spec F-REM-2) ----------------------------------------------------------
    def _record_bytes(self, op: str, key: bytes) -> tuple[int, bytes]:
        """``(length, bytes)`` of the value at ``key``'s commit record (:meth:`bounded_get`)."""
        return self.bounded_get(op, self._rec_key(key), key)

    def _commit(self, key: bytes, unchecked: bool = False) -> Commit | None:
        """The key's commit record, decoded; None when it is not committed. ``unchecked``: a
        keyed record read without keys is parsed unchecked (fsck without the key)."""
        n, raw = self._record_bytes("read", key)
        if not n:
            return None
        if n > len(raw):
            raise FormatError(
                f"the commit record of segment {key.hex()[:16]} in {self.path} is {n:,} bytes, "
                "longer than any commit record (damage, or a key written by hand)"
            )
        return self._decode(key, raw, unchecked)

    def _decode(self, key: bytes, raw: bytes, unchecked: bool = False) -> Commit:
        """``raw`` as the commit record of ``key`` (spec F-REM-2, then identity: F-READ-1 step
        8): a :class:`FormatError` for one that does not decode, names another segment or
        another model (damage under this namespace, never the caller's mistake)."""
        obj = f"the commit record of segment {key.hex()[:16]} in {self.path}"
        try:
            rec = decode_commit_record(raw, obj, keys=self.level_keys, unchecked=unchecked)
        except NotAuthenticated:
            self._count("unauthenticated")
            raise
        sc = rec.sidecar
        if sc.key != key:
            raise FormatError(f"{obj} names segment {sc.key.hex()[:16]} (damaged or misplaced)")
        try:  # another model's record under this model's namespace: damage, a ladder stop
            self.fingerprint.require_same(sc.fingerprint, obj)
        except IncompatibleFingerprint as e:
            raise FormatError(f"{e} (damaged or misplaced)") from None
        return Commit(rec.nonce, rec.parts, rec.part_bytes, sc, len(raw))

    def _need(self, key: bytes) -> Commit:
        c = self._commit(key)
        if c is None:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}")
        return c

    # -- writing (spec F-REM-3, F-DUR-2, F-DUR-7) -----------------------------------------------
    def read_parts(self, c: Commit, views: list[memoryview], offset: int) -> None:
        """Read the stored payload of the write ``c`` names from ``offset`` into ``views``, in
        turn: the parts each view spans, fetched in one pipelined round trip (``GETRANGE``
        each) straight into the caller's memory where the client allows
        (:meth:`~stratastore.levels.redis.client.RedisCalls._read_direct`), else through the
        client's parser (spec F-REM-4: only parts of that write). A part missing or short is
        :class:`~stratastore.levels.errors.SegmentNotFound` (counted ``missing_parts``)."""
        pb, key = c.part_bytes, c.sidecar.key
        ranges: list[tuple[memoryview, int, int, int]] = []  # into, part, from, to (incl.)
        for v in views:
            n, done = v.nbytes, 0
            while done < n:
                part, at = divmod(offset + done, pb)
                take = min(pb - at, n - done)
                ranges.append((v[done : done + take], part, at, at + take - 1))
                done += take
            offset += n
        if not ranges:
            return
        names = [self._part(key, c.nonce, p) for _, p, _, _ in ranges]
        cmds = [("GETRANGE", n, a, z) for n, (_, _, a, z) in zip(names, ranges, strict=True)]
        if self._read_direct(key, cmds, [dst for dst, *_ in ranges]):
            return
        got = self._pipeline(
            "read",
            key,
            [("getrange", n, a, z) for n, (_, _, a, z) in zip(names, ranges, strict=True)],
        )
        for (dst, part, _, _), data in zip(ranges, got, strict=True):
            if not isinstance(data, bytes) or len(data) != dst.nbytes:
                self._count("missing_parts")
                raise SegmentNotFound(
                    f"segment {key.hex()[:16]} in {self.path}: part {part} is missing or "
                    "short (evicted by Redis, or deleted meanwhile); it is read as a miss"
                )
            dst[:] = data

    def _write_with(
        self, key: bytes, stored: memoryview, sidecar: Callable[[], Sidecar]
    ) -> PutResult:
        """Write the parts of ``stored`` (pending), then commit the sidecar ``sidecar()``
        gives once they are written (a RAW put hashes its pages meanwhile)."""
        if stored.format != "B" or stored.ndim != 1:
            stored = stored.cast("B")
        nonce, pb = os.urandom(16).hex(), self.part_bytes
        n = max(1, -(-len(stored) // pb))
        parts = [self._part(key, nonce, i) for i in range(n)]
        try:
            pending = [
                ("set", parts[i], stored[i * pb : (i + 1) * pb], None, PENDING_MS) for i in range(n)
            ]
            self._pipeline("put", key, pending)
            sc = sidecar()
            value = CommitRecord(nonce, n, pb, sc).encode()
            got = self._call(
                "commit",
                key,
                lambda: self._r.eval(_COMMIT, len(parts) + 1, self._rec_key(key), *parts, value),
            )
        except BaseException:
            self._drop_parts(key, parts)
            raise
        if got == 0:  # another writer committed this key first: one copy is kept
            self._count("raced_puts")
            self._drop_parts(key, parts)
            return PutResult(key, False, 0)
        if got != 1:
            self._drop_parts(key, parts)
            raise RemoteError(
                "commit",
                f"{self.path} {key.hex()[:16]}",
                "a part expired or was evicted before the commit (a write slower than "
                f"{PENDING_MS // 1000} s, or Redis out of memory)",
            )
        self._index_add(key, sc, IndexRecord.from_sidecar(sc, len(value), sc.stored_bytes))
        return PutResult(key, True, sc.stored_bytes)

    def _drop_parts(self, key: bytes, parts: Iterable[str]) -> None:
        """Delete ``parts`` (one write's, one slot) in batches of :data:`NAMES_PER_CALL`,
        stopping after a batch of which none was there (a record that claimed more parts than
        were ever written: what is left, if anything, is an orphan for fsck). Best effort:
        pending parts expire anyway (:data:`PENDING_MS`)."""
        it = iter(parts)
        with contextlib.suppress(RemoteError):
            while batch := list(itertools.islice(it, NAMES_PER_CALL)):
                if not self._call("put", key, partial(self._r.delete, *batch)):
                    return

    # -- the derived listing (spec F-REM-1: recs, ages, used, kids) -----------------------------
    def _index_add(self, key: bytes, sc: Sidecar, rec: IndexRecord) -> None:
        """List ``key`` (its derived entries); ``used`` goes up only for whoever created its
        ``recs`` entry (a repair and the writer listing the same segment never count it twice),
        as :meth:`_index_drop` takes it down only for whoever removed it."""
        created = self._call("index", key, lambda: self._r.hset(self._recs, key.hex(), rec.pack()))
        cmds: list[tuple[Any, ...]] = [
            ("zadd", self._ages, {f"{sc.sealed_at_ns:020d}:{key.hex()}": 0}),
        ]
        if created == 1:
            cmds.append(("incrby", self._used, rec.total_bytes))
        if sc.kind is Kind.KV:
            kids = (self._kids(sc.parent_key), key.hex(), f"{sc.token_start}:{sc.token_end}")
            cmds.append(("hset", *kids))
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

    # -- deleting (spec F-REM-3, F-DUR-5) -------------------------------------------------------
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
            removed = (
                self._call(
                    "delete", key, lambda: self._r.eval(_DELETE, 1, self._rec_key(key), head)
                )
                == 1
            )
            if removed and c is not None:
                self._drop_parts(key, (self._part(key, c.nonce, i) for i in range(c.parts)))
        if rec_raw is not None and (removed or not n):
            try:
                self._index_drop(key, IndexRecord.unpack(rec_raw))
            except FormatError:
                self._call("delete", key, lambda: self._r.hdel(self._recs, key.hex()))
        return removed


def hex_key(field: bytes) -> bytes | None:
    """A listing's field as a segment key (64 hex digits), or None for anything else."""
    try:
        key = bytes.fromhex(field.decode("ascii"))
    except ValueError:  # UnicodeDecodeError included
        return None
    return key if len(key) == 32 else None


def index_record(raw: bytes | None) -> IndexRecord | None:
    """A listing's value as an index record, or None (absent, or not one: fsck says so)."""
    if raw is None:
        return None
    try:
        return IndexRecord.unpack(raw)
    except FormatError:
        return None


def children(kids: dict[bytes, bytes]) -> list[tuple[bytes, int, int]]:
    """A ``kids`` hash as ``(key, start, end)`` rows; a damaged entry finds nothing (the walk
    checks every child by its key anyway)."""
    out = []
    for k, v in kids.items():
        key = hex_key(k)
        try:
            s, e = (int(x) for x in v.split(b":"))
        except ValueError:
            continue
        if key is not None:
            out.append((key, s, e))
    return out
