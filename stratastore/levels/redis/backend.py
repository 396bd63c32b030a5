"""The shared level on Redis or a Redis Cluster: a segment backend several engine nodes share.

Each node keeps its own RAM and disk levels and shares one Redis level: node B restores,
validated, what node A parked. Segments are content-addressed (spec F-KEY), so equal prefixes
are equal keys on every node and a segment parked by both is stored once; every page carries
its BLAKE3 digest in the sidecar, so whatever Redis returns is validated before it is delivered
(F-SC-3), exactly as a disk read is.

The level is built in layers, one module each: :mod:`~stratastore.levels.redis.client` (the
calls: one deadline each, typed errors, no credentials), :mod:`~stratastore.levels.redis.records`
(the names, the commit protocol and the derived listing: F-REM-1 .. F-REM-3),
:mod:`~stratastore.levels.redis.wire` (range reads into the caller's memory: F-REM-4) and
this one, the level itself: :class:`RedisBackend`, which keeps the
:class:`~stratastore.levels.backend.SharedBackend` protocol and checks its own namespace
(:meth:`RedisBackend.fsck`, :class:`RemoteReport`).

**Faults** are typed, never wrong bytes, never a hang: every call has the settings' timeout; a
refused, dropped or timed-out connection, a cluster that is down or moving is
:class:`RemoteError` (a :class:`~stratastore.io.errors.StrataIOError`: the restore's read pass
stops its ladder there); a part evicted by Redis (``maxmemory``) is
:class:`~stratastore.levels.errors.SegmentNotFound`; a value corrupted in Redis fails its digest
(:class:`~stratastore.format.ChecksumMismatch`) or its sidecar's trailer. Each is counted in
:attr:`RedisBackend.counters`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from stratastore.errors import StrataError
from stratastore.format import (
    ChecksumMismatch,
    Codec,
    FormatError,
    IndexRecord,
    KeyRequired,
    Level,
    ModelFingerprint,
    NotAuthenticated,
    Sidecar,
)
from stratastore.format.remote_record import RemoteNames, parse_remote_name
from stratastore.levels.backend import PutResult
from stratastore.levels.common import SealedLevel
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.redis.client import RemoteError
from stratastore.levels.redis.records import (
    NAMES_PER_CALL,
    Commit,
    RedisRecords,
    children,
    hex_key,
    index_record,
)
from stratastore.levels.redis.settings import RemoteSettings, check_name
from stratastore.levels.redis.wire import RedisSegment
from stratastore.levels.relocation import Relocated, relocate_by_copy, resealed
from stratastore.levels.sealing import (
    Buffer,
    Unsealed,
    check_sealed,
    encode,
    rekeyed,
    sidecar_for,
)

__all__ = ["RedisBackend", "RemoteError", "RemoteReport"]

_BATCH = 256  #: rows ``oldest`` reads at a time

# KEYS[1] a commit record, KEYS[2..] parts of one write, ARGV[1] that write's head prefix
# ``SRC1:<nonce>:``. Deletes the parts that have no expiry (not pending) only while the record
# does not name the write: a write committed since fsck looked keeps its parts.
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
# KEYS[1] a commit record's name holding a value of another type: deleted, only while it still
# is (a string there since is a commit: kept).
# KEYS[1] the listing (``recs``), KEYS[2] ``used``: ``used`` set to the sum of the listing's
# index records' bytes (F-IDX-1: sidecar_bytes, u32 at offset 16, plus file_bytes, u64 at 20), in
# one step; an entry that is not an 84-byte record of schema 1 counts nothing (fsck judges it).
_RECOUNT = """
local n = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  if string.len(v) == 84 and string.byte(v, 1) == 1 then
    n = n + struct.unpack('<I4', v, 17) + struct.unpack('<I8', v, 21)
  end
end
redis.call('SET', KEYS[2], string.format('%d', n))
return n
"""
_DROP_NOT_STRING = """
if redis.call('TYPE', KEYS[1]).ok == 'string' then return 0 end
return redis.call('DEL', KEYS[1])
"""


@dataclass
class RemoteReport:
    """What :meth:`RedisBackend.fsck` found in its namespace (and, with ``repair``, fixed)."""

    segments: int = 0  #: committed segments (commit records)
    orphan_parts: list[str] = field(default_factory=list)  #: parts of no commit, not pending
    missing_parts: list[bytes] = field(default_factory=list)  #: committed, a part gone
    bad_records: list[bytes] = field(default_factory=list)  #: commit records that do not decode
    #: a keyed level's records not keyed by one of its keys (spec F-KEYED-5): planted, or of a
    #: key fsck was not given; deleted by a repair
    unauthenticated: list[bytes] = field(default_factory=list)
    #: keyed records fsck had no key for: whole as far as seen, their digests not checked
    #: (spec F-KEYED-6); never deleted
    keyed_unchecked: list[bytes] = field(default_factory=list)
    stale_index: list[bytes] = field(default_factory=list)  #: listed, not committed
    unindexed: list[bytes] = field(default_factory=list)  #: committed, not listed
    #: committed and whole, a page failing its digest (spec F-SC-3): (key, first bad page)
    damaged: list[tuple[bytes, int]] = field(default_factory=list)
    used_recorded: int = 0
    used_actual: int = 0
    repaired: bool = False

    @property
    def clean(self) -> bool:
        return not (
            self.orphan_parts
            or self.missing_parts
            or self.bad_records
            or self.unauthenticated
            or self.stale_index
            or self.unindexed
            or self.damaged
            or self.used_recorded != self.used_actual
        )

    def counts(self) -> dict[str, int]:
        """What was found, by name, in the order a report names them."""
        return {
            "segments": self.segments,
            "orphan_parts": len(self.orphan_parts),
            "missing_parts": len(self.missing_parts),
            "bad_records": len(self.bad_records),
            "unauthenticated": len(self.unauthenticated),
            "keyed_unchecked": len(self.keyed_unchecked),
            "stale_index": len(self.stale_index),
            "unindexed": len(self.unindexed),
            "damaged": len(self.damaged),
            "used_recorded": self.used_recorded,
            "used_actual": self.used_actual,
        }


class RedisBackend(SealedLevel, RedisRecords):
    """A level on Redis (:class:`~stratastore.levels.redis.settings.RemoteSettings` names it);
    see the module's docstring. Keeps the segment-backend protocol
    (:class:`~stratastore.levels.backend.SharedBackend`): every method from any thread, every
    call bounded by the timeout."""

    persistent = True  #: as the server keeps it (RDB/AOF); never the only copy of a park
    shared = True
    chain_index = True  #: walked by parent key (``children_many``, spec F-REM-5)
    hosts_catalog = False

    def __init__(
        self,
        settings: RemoteSettings,
        fingerprint: ModelFingerprint,
        level: Level = Level.COLD,
        *,
        client: Any = None,
        names: RemoteNames | None = None,
    ) -> None:
        """Made, not connected (the first call connects). ``names``: the keys of another
        namespace than ``fingerprint``'s (fsck of a namespace whose records name no model of
        its own: each is then judged another model's)."""
        self.fingerprint = fingerprint
        self.level = level
        self.names = names or RemoteNames(check_name(settings.name), fingerprint.digest())
        self.ns = self.names.ns
        self.part_bytes = settings.part_bytes
        self.level_keys = settings.level_keys()  # spec F-KEYED: None for an unkeyed level
        super().__init__(settings, f"{settings.shown}#{self.ns}", client)

    @classmethod
    def open(
        cls, settings: RemoteSettings, fingerprint: ModelFingerprint, level: Level = Level.COLD
    ) -> RedisBackend:
        """Connect and check the server answers (``PING``): a :class:`RemoteError` now, not at
        the first park, for a server that is down, a wrong password or TLS that fails."""
        b = cls(settings, fingerprint, level)
        try:
            b.connect()
        except BaseException:
            b.close()
            raise
        return b

    def open_warnings(self) -> list[str]:
        """``remote_eviction = "redis"`` leaves the budget to the server: what to say when a
        server will never evict this level's keys (no ``maxmemory``, or a policy other than
        ``allkeys-*``: ``volatile-*`` evicts only keys with an expiry, which committed parts
        have not). A server that does not say (``CONFIG`` refused) is taken at its word."""
        if self.settings.eviction != "redis":
            return []
        out = []
        for node, (maxmemory, policy) in sorted((self.eviction_settings() or {}).items()):
            if not maxmemory or not policy.startswith("allkeys-"):
                out.append(
                    f'the remote level {self.settings.shown}: remote_eviction = "redis" but '
                    f"server {node} has maxmemory {maxmemory} and maxmemory-policy "
                    f"{policy or '?'}, so it never evicts committed segments and fills up; set "
                    "maxmemory and maxmemory-policy allkeys-lru there, or use "
                    'remote_eviction = "store" with remote_mib'
                )
        return out

    # -- writing (spec F-DUR-2, F-DUR-7) --------------------------------------------------------
    def put_sealed(self, sidecar: Sidecar, stored: Buffer) -> PutResult:
        if sidecar.key in self:
            return PutResult(sidecar.key, False, 0)
        data = check_sealed(sidecar, stored, self.fingerprint)
        sc = resealed(rekeyed(sidecar, data, self.hasher), self.level)
        return self._write_with(sc.key, memoryview(data.data), lambda: sc)

    def _put(self, u: Unsealed, codec: Codec) -> PutResult:
        if u.key in self:
            return PutResult(u.key, False, 0)
        u = u.in_memory()  # shipped whole: a page source is gathered first
        assert isinstance(u.payload, memoryview)
        enc = encode(u, codec)
        # RAW is written as it is: the parts are slices of the caller's bytes
        view = u.payload if codec is Codec.RAW else memoryview(b"".join(enc.chunks))
        return self._write_with(
            u.key, view, lambda: sidecar_for(u, enc, enc.hashes(), self.fingerprint, self.level)
        )

    # -- reading (spec F-SC-3, F-IDX, F-REM-4) --------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return bool(self._call("read", key, lambda: self._r.exists(self._rec_key(key))))

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each of ``keys`` is committed, in one pipelined round trip."""
        there = self._pipeline("lookup", "", [("exists", self._rec_key(k)) for k in keys])
        return [bool(n) for n in there]

    def record(self, key: bytes) -> IndexRecord:
        raw = self._call("read", key, lambda: self._r.hget(self._recs, key.hex()))
        if raw is None or key not in self:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}")
        return IndexRecord.unpack(raw, f"the index record of {key.hex()[:16]} in {self.path}")

    def keys(self) -> list[bytes]:
        """The listed segments (a listing entry that does not decode is skipped: fsck)."""
        got = self._call("list", "", lambda: self._r.hkeys(self._recs))
        return [k for k in map(hex_key, got) if k is not None]

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        """The listed segments and their index records (entries that do not decode skipped)."""
        got = self._call("list", "", lambda: self._r.hgetall(self._recs))
        out = []
        for f, v in got.items():
            key, rec = hex_key(f), index_record(v)
            if key is not None and rec is not None:
                out.append((key, rec))
        return out

    def open_reader(self, key: bytes) -> RedisSegment:
        return RedisSegment(self, self._need(key))

    def prefetch(self, key: bytes) -> bool:
        return False

    # -- the chain index (spec F-REM-5) ---------------------------------------------------------
    def children(self, parent: bytes) -> list[tuple[bytes, int, int]]:
        """The K/V segments stored after the prefix ``parent``: ``(key, start, end)`` each (how
        a node that did not park a chain finds it from a prompt's tokens)."""
        return self.children_many([parent])[0]

    def children_many(self, parents: Sequence[bytes]) -> list[list[tuple[bytes, int, int]]]:
        """:meth:`children` of each of ``parents``, in one pipelined round trip."""
        got = self._pipeline(
            "lookup",
            parents[0] if parents else "",
            [("hgetall", self._kids(p)) for p in parents],
            wrong_type={},  # a damaged listing finds nothing
        )
        return [children(kids) for kids in got]

    # -- managing (delete: :meth:`RedisRecords.delete`) -----------------------------------------
    def __len__(self) -> int:
        return int(self._call("list", "", lambda: self._r.hlen(self._recs)))

    def used(self) -> int:
        got = self._call("list", "", lambda: self._r.get(self._used))
        try:
            return max(0, int(got or 0))
        except ValueError:
            raise FormatError(
                f"the byte count {self._used} in {self.path} is not a number (damage, or a key "
                "written by hand): strata fsck --remote --repair rebuilds it"
            ) from None

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        after: bytes = b"-"
        while True:
            rows: list[bytes] = self._call(
                "list",
                "",
                partial(self._r.zrangebylex, self._ages, after, "+", start=0, num=_BATCH),
            )
            if not rows:
                return
            keys = [r.split(b":", 1)[-1] for r in rows]  # a row of another shape finds nothing
            recs = self._call("list", "", partial(self._r.hmget, self._recs, keys))
            for k, raw in zip(keys, recs, strict=True):
                key, rec = hex_key(k), index_record(raw)
                if key is not None and rec is not None:
                    yield key, rec
            after = b"(" + rows[-1]

    def relocate_from(self, src: Any, key: bytes) -> Relocated:
        return relocate_by_copy(self, src, key)

    # -- checking the namespace (only the names of spec F-REM-1 are judged; a name of any
    # other shape is left as it is, and nothing outside the namespace is read; a read that
    # fails judges nothing: it is raised; repairs keep the commit protocol, F-REM-3) -----------
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
        commits: dict[bytes, Commit] = {}
        parts: dict[tuple[bytes, str], list[str]] = {}  #: (key, nonce) -> names seen
        for name in self.scan_names("fsck", f"{self.ns}*"):
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
            except KeyRequired:  # keyed, and no key given: counted, never judged
                c = self._commit(key, unchecked=True)
                rep.keyed_unchecked.append(key)
            except NotAuthenticated:  # planted, or keyed by a key fsck was not given
                rep.unauthenticated.append(key)
                continue
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
            elif not c.sidecar.authenticated:  # no key to hash its pages with
                continue
            elif (bad := self._first_bad_page(key, deep)) >= 0:
                rep.damaged.append((key, bad))
        # the listing as stored: an entry whose field or record does not decode is stale
        listed: dict[bytes, IndexRecord | None] = {}
        fields: dict[bytes, bytes] = {}  #: listed key -> its field (itself when not hex)
        for f, v in self._call("fsck", "", lambda: self._r.hgetall(self._recs)).items():
            key = hex_key(f) or f
            fields[key] = f
            listed[key] = index_record(v) if key != f else None
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

    def _parts_there(self, key: bytes, c: Commit) -> bool:
        """Whether every part of ``c`` exists (checked in batches; the first gap ends it)."""
        names = (self._part(key, c.nonce, i) for i in range(c.parts))
        while batch := list(itertools.islice(names, NAMES_PER_CALL)):
            if self._call("fsck", key, partial(self._r.exists, *batch)) != len(batch):
                return False
        return True

    def _repair(
        self,
        rep: RemoteReport,
        listed: dict[bytes, IndexRecord | None],
        fields: dict[bytes, bytes],
        whole: dict[bytes, Commit],
    ) -> None:
        """:meth:`fsck`'s repairs of what ``rep`` found (see there)."""
        by_write: dict[tuple[bytes, str], list[str]] = {}
        for name in rep.orphan_parts:
            shaped = parse_remote_name(name[len(self.ns) :])
            assert shaped is not None and shaped[1] is not None
            by_write.setdefault((shaped[0], shaped[1]), []).append(name)
        for (key, nonce), names in by_write.items():
            for at in range(0, len(names), NAMES_PER_CALL):
                batch = names[at : at + NAMES_PER_CALL]
                drop = partial(
                    self._r.eval,
                    _DROP_ORPHANS,
                    len(batch) + 1,
                    self._rec_key(key),
                    *batch,
                    f"SRC1:{nonce}:",
                )
                self._call("repair", key, drop)
        doomed = rep.missing_parts + rep.bad_records + rep.unauthenticated
        for key in doomed + [k for k, _ in rep.damaged]:
            try:
                self.delete(key)
            except FormatError:  # a value of another type at the record's name: it goes
                drop_one = partial(self._r.eval, _DROP_NOT_STRING, 1, self._rec_key(key))
                self._call("repair", key, drop_one)
        for key in rep.stale_index:
            rec = listed[key]
            if rec is not None and key in self:  # committed since the scan: listed, keep it
                continue
            if rec is not None:
                self._index_drop(key, rec)
                self._relist_if_committed(key)  # (a writer that committed meanwhile)
            else:  # nothing to undo but the entry itself (used is recounted below)
                self._call("repair", key, partial(self._r.hdel, self._recs, fields[key]))
        for key in rep.unindexed:
            self._relist_if_committed(key, whole[key].nonce)
        self._recount_used()
        rep.repaired = True

    def _relist_if_committed(self, key: bytes, nonce: str | None = None) -> None:
        """List ``key`` if it is committed now (by the write ``nonce`` when given), and take
        the entry back if its record went meanwhile: a repair racing a writer's commit or
        delete leaves the listing as the writer would (each of :meth:`_index_add` and
        :meth:`_index_drop` counts ``used`` only for the entry it created or removed)."""
        c = self._commit(key)
        if c is None or (nonce is not None and c.nonce != nonce):
            return
        rec = IndexRecord.from_sidecar(c.sidecar, c.raw_len, c.sidecar.stored_bytes)
        self._index_add(key, c.sidecar, rec)
        if self._commit(key) is None:  # deleted while it was listed: undone
            self._index_drop(key, rec)

    def _recount_used(self) -> None:
        """Set ``used`` to the sum of the listing's records: on one server in a script, so
        that a writer's listing between the sum and the write is never lost; a cluster keeps
        ``recs`` and ``used`` in two slots, so there the sum and the write are two calls (a
        repair with writers running may leave it off by what they listed meanwhile; the next
        repair puts it right)."""
        if not self.settings.cluster:
            self._call("repair", "", lambda: self._r.eval(_RECOUNT, 2, self._recs, self._used))
            return
        now = sum(r.total_bytes for _, r in self.records())
        self._call("repair", "", lambda: self._r.set(self._used, now))


if TYPE_CHECKING:  # the protocol check (mypy strict), as levels/backend.py does for the directory
    from stratastore.levels.backend import SharedBackend

    _remote: type[SharedBackend] = RedisBackend
