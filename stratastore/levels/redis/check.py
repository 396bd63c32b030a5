"""Checking one namespace of a Redis level, and with ``repair`` fixing it
(:meth:`RedisBackend.fsck <stratastore.levels.redis.backend.RedisBackend.fsck>`; every
namespace of a store name: :mod:`stratastore.levels.redis.fsck`).

Only the names of spec F-REM-1 are judged; a name of any other shape in the namespace is left as
it is (never judged, never deleted), and nothing outside the namespace is read. A read that
fails judges nothing (it is raised). Repairs keep the commit protocol (F-REM-3): a part goes
only in a script that checks, in the segment's slot, that no commit names its write and that it
has no expiry; a segment goes only through the level's own delete.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from stratastore.errors import StrataError
from stratastore.format import ChecksumMismatch, FormatError, IndexRecord
from stratastore.format.remote_record import parse_remote_name
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.redis.client import RemoteError
from stratastore.levels.redis.records import NAMES_PER_CALL, Commit, hex_key, index_record

if TYPE_CHECKING:
    from stratastore.levels.redis.backend import RedisBackend

__all__ = ["RemoteReport", "check_namespace"]

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
            or self.stale_index
            or self.unindexed
            or self.damaged
            or self.used_recorded != self.used_actual
        )


def check_namespace(b: RedisBackend, *, repair: bool = False, deep: bool = False) -> RemoteReport:
    """:meth:`RedisBackend.fsck <stratastore.levels.redis.backend.RedisBackend.fsck>` of
    ``b``'s namespace (see there)."""
    rep = RemoteReport()
    commits: dict[bytes, Commit] = {}
    parts: dict[tuple[bytes, str], list[str]] = {}  #: (key, nonce) -> names seen
    scanned = b._call("fsck", "", lambda: list(b._r.scan_iter(match=f"{b.ns}*", count=1000)))
    for raw_name in scanned:
        name = raw_name.decode("utf-8", "replace")
        if not name.startswith(b.ns):  # never anything outside the namespace
            continue
        shaped = parse_remote_name(name[len(b.ns) :])
        if shaped is None:  # not a name this backend writes: left as it is
            continue
        key, nonce, _ = shaped
        if nonce is not None:
            parts.setdefault((key, nonce), []).append(name)
            continue
        try:
            c = b._commit(key)
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
            if b._call("fsck", name, partial(b._r.pttl, name)) == -1:  # not pending
                rep.orphan_parts.append(name)
    for key, c in commits.items():
        if not _parts_there(b, key, c):
            rep.missing_parts.append(key)
        elif (bad := _first_bad_page(b, key, deep)) >= 0:
            rep.damaged.append((key, bad))
    # the listing as stored: an entry whose field or record does not decode is stale
    listed: dict[bytes, IndexRecord | None] = {}
    fields: dict[bytes, bytes] = {}  #: listed key -> its field (itself when not hex)
    for f, v in b._call("fsck", "", lambda: b._r.hgetall(b._recs)).items():
        key = hex_key(f) or f
        fields[key] = f
        listed[key] = index_record(v) if key != f else None
    gone = {*rep.missing_parts, *(k for k, _ in rep.damaged)}
    whole = {k: c for k, c in commits.items() if k not in gone}
    rep.stale_index = [k for k, r in listed.items() if k not in whole or r is None]
    rep.unindexed = [k for k in whole if listed.get(k) is None]
    try:
        rep.used_recorded = b.used()
    except FormatError:  # not a number: never equal to the actual bytes
        rep.used_recorded = -1
    rep.used_actual = sum(c.raw_len + c.sidecar.stored_bytes for c in whole.values())
    if repair and not rep.clean:
        _repair(b, rep, listed, fields, whole)
    return rep


def _first_bad_page(b: RedisBackend, key: bytes, deep: bool) -> int:
    """The first page of committed segment ``key`` failing its digest (-1: none; 0 for a
    compressed payload that does not decode); every page with ``deep``, else the first and
    the last. A part gone meanwhile is a page that fails (its segment is not whole)."""
    try:
        with b.open_reader(key) as seg:
            return seg.first_bad_page(sample=not deep)
    except RemoteError:  # the server failed: nothing is judged on a failed read
        raise
    except (FormatError, ChecksumMismatch, SegmentNotFound):
        return 0


def _parts_there(b: RedisBackend, key: bytes, c: Commit) -> bool:
    """Whether every part of ``c`` exists (checked in batches; the first gap ends it)."""
    names = (b._part(key, c.nonce, i) for i in range(c.parts))
    while batch := list(itertools.islice(names, NAMES_PER_CALL)):
        if b._call("fsck", key, partial(b._r.exists, *batch)) != len(batch):
            return False
    return True


def _repair(
    b: RedisBackend,
    rep: RemoteReport,
    listed: dict[bytes, IndexRecord | None],
    fields: dict[bytes, bytes],
    whole: dict[bytes, Commit],
) -> None:
    """:func:`check_namespace`'s repairs of what ``rep`` found (see
    :meth:`RedisBackend.fsck <stratastore.levels.redis.backend.RedisBackend.fsck>`)."""
    by_write: dict[tuple[bytes, str], list[str]] = {}
    for name in rep.orphan_parts:
        shaped = parse_remote_name(name[len(b.ns) :])
        assert shaped is not None and shaped[1] is not None
        by_write.setdefault((shaped[0], shaped[1]), []).append(name)
    for (key, nonce), names in by_write.items():
        for at in range(0, len(names), NAMES_PER_CALL):
            batch = names[at : at + NAMES_PER_CALL]
            drop = partial(
                b._r.eval, _DROP_ORPHANS, len(batch) + 1, b._rec_key(key), *batch, f"SRC1:{nonce}:"
            )
            b._call("repair", key, drop)
    for key in rep.missing_parts + rep.bad_records + [k for k, _ in rep.damaged]:
        try:
            b.delete(key)
        except FormatError:  # a value of another type at the record's name: it goes
            b._call("repair", key, partial(b._r.eval, _DROP_NOT_STRING, 1, b._rec_key(key)))
    for key in rep.stale_index:
        rec = listed[key]
        if rec is not None and key in b:  # committed since the scan: listed, keep it
            continue
        if rec is not None:
            b._index_drop(key, rec)
        else:  # nothing to undo but the entry itself (used is rebuilt below)
            b._call("repair", key, partial(b._r.hdel, b._recs, fields[key]))
    for key in rep.unindexed:
        c = whole[key]
        rec = IndexRecord.from_sidecar(c.sidecar, c.raw_len, c.sidecar.stored_bytes)
        b._index_add(key, c.sidecar, rec)
    now = sum(r.total_bytes for _, r in b.records())
    b._call("repair", "", lambda: b._r.set(b._used, now))
    rep.repaired = True
