"""The LMDB index of a level checked against the segments it derives from (spec F-IDX):
read-only (``readonly=True``, no lock file), and by default in a child process, since LMDB
trusts its file and a damaged page can kill the reader with SIGBUS, which must not take fsck
down with it."""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from enum import Enum

import lmdb

from stratastore.errors import StrataError
from stratastore.format import IndexRecord, index_record
from stratastore.format.naming import INDEX_DIR, data_name, sidecar_name
from stratastore.format.sidecar import Sidecar
from stratastore.io import files, guard, pathnames
from stratastore.io.errors import StrataIOError
from stratastore.levels.findings import (
    INDEX_ABSENT,
    INDEX_DANGLING,
    INDEX_MISSING,
    INDEX_RECORD_INVALID,
    INDEX_SCHEMA,
    INDEX_STALE,
    INDEX_TABLES_STALE,
    INDEX_UNREADABLE,
    Finding,
)
from stratastore.levels.local.index import lmdb_file_problem
from stratastore.ops.fsck.damage import Damage
from stratastore.ops.fsck.entries import special_index_files

__all__ = ["check_index"]


#: the derived tables of a writer of 1.2 beside ``segments`` (spec F-IDX-7)
DERIVED_TABLES = (b"ages", b"totals")
_AGE = struct.Struct(">Q")  #: an ``ages`` key leads with ``sealed_at_ns``, big-endian
_TOTAL = struct.Struct("<Q")  #: ``totals``' ``bytes``, little-endian
_TOTAL_KEY = b"bytes"

#: run in a child process: LMDB trusts its file, and a damaged page can kill the reader with
#: SIGBUS, which must not take fsck down with it. Prints the schema, then one line per row:
#: its table (``segments``, or a derived table of F-IDX-7 when the index has it), key, value.
_INDEX_DUMP = """
import sys, lmdb
try:
    env = lmdb.open(sys.argv[1], subdir=True, readonly=True, lock=False, max_dbs=8)
    with env.begin() as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        schema = txn.get(b"schema", db=meta)
        out = [schema.hex() if schema is not None else "-"]
        for name in (b"segments", b"ages", b"totals"):
            try:
                db = env.open_db(name, txn=txn, create=False)
            except lmdb.NotFoundError:
                if name == b"segments":
                    raise
                continue
            table = name.decode()
            out.append(table)
            out += [f"{table} {k.hex()} {bytes(v).hex()}" for k, v in txn.cursor(db=db)]
except lmdb.Error as e:
    print(f"ERROR {e}")
    sys.exit(3)
print("\\n".join(out))
"""

#: what an index holds: its schema, and each table read -> its rows
_Dump = tuple[bytes | None, dict[bytes, dict[bytes, bytes]]]


def _read_index_isolated(path: str) -> _Dump | str:
    """The index's schema and tables, read by a child process; or why they could not be."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", _INDEX_DUMP, path], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the index reader could not run ({e})"
    if r.returncode < 0:
        return f"reading it killed the reader (signal {-r.returncode}): its pages are damaged"
    if r.returncode != 0:
        return r.stdout.strip().removeprefix("ERROR ") or r.stderr.strip()[-300:]
    lines = r.stdout.splitlines()
    if not lines:
        return "the index reader printed nothing"
    schema = None if lines[0] == "-" else bytes.fromhex(lines[0])
    tables: dict[bytes, dict[bytes, bytes]] = {}
    for line in lines[1:]:
        name, _, row = line.partition(" ")
        rows = tables.setdefault(name.encode(), {})
        if row:
            k, _, v = row.partition(" ")
            rows[bytes.fromhex(k)] = bytes.fromhex(v)
    return schema, tables


def _read_index_here(path: str) -> _Dump | str:
    try:
        env = lmdb.open(path, subdir=True, readonly=True, lock=False, max_dbs=8)
        try:
            with env.begin() as txn:
                schema = txn.get(b"schema", db=env.open_db(b"meta", txn=txn, create=False))
                tables = {}
                for name in (b"segments", *DERIVED_TABLES):
                    try:
                        db = env.open_db(name, txn=txn, create=False)
                    except lmdb.NotFoundError:
                        if name == b"segments":
                            raise
                        continue
                    tables[name] = {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
                return bytes(schema) if schema is not None else None, tables
        finally:
            env.close()
    except lmdb.Error as e:
        return str(e)


def check_index(
    d: str,
    valid: dict[bytes, Sidecar],
    isolate: bool = True,
    damaged: dict[bytes, Damage] | None = None,
) -> Iterator[Finding]:
    """The index of ``d`` against its valid segments ``valid`` (spec F-IDX). A record of a
    segment in ``damaged`` is a consequence of that damage (added to its finding), not an
    ``INDEX_DANGLING`` of its own."""
    path = pathnames.join(d, INDEX_DIR)
    if not files.lexists(path):
        yield INDEX_ABSENT.found(path, "no index: the next open rebuilds it")
        return
    try:  # a link or a non-directory was reported as SYMLINK / NOT_REGULAR_FILE (F-DIR-8)
        guard.store_subdir(d, INDEX_DIR, create=False)
    except StrataIOError:
        return
    special = list(special_index_files(path))
    yield from special
    if any(pathnames.basename(f.object) == "data.mdb" for f in special):
        return  # never read through a link, or from a FIFO
    problem = lmdb_file_problem(path)
    if problem is not None:  # mapping it could kill this process (SIGBUS)
        yield INDEX_UNREADABLE.found(path, f"{problem}; it is derived: repair rebuilds it")
        return
    got = _read_index_isolated(path) if isolate else _read_index_here(path)
    if isinstance(got, str):
        yield INDEX_UNREADABLE.found(path, f"{got}; it is derived: repair rebuilds it")
        return
    schema, tables = got
    indexed = tables.get(b"segments", {})
    if schema is None or int.from_bytes(schema, "little") != index_record.INDEX_SCHEMA:
        yield INDEX_SCHEMA.found(path, "another schema: open rebuilds it")
        return
    rows: dict[bytes, IndexRecord] = {}  #: each record as the derived tables must count it
    for key, raw in sorted(indexed.items()):
        with contextlib.suppress(StrataError):  # one that does not parse counts for nothing
            rows[key] = IndexRecord.unpack(raw)
        if key not in valid and damaged and key in damaged:
            fix = (
                ""
                if damaged[key].left_alone
                else " (repair quarantines the segment and rebuilds the index)"
            )
            damaged[key].consequences.append(f"the index {path} still names it{fix}")
            continue
        if key not in valid:
            yield INDEX_DANGLING.found(
                pathnames.join(path, key.hex()),
                f"indexed in {path} but not a valid committed segment",
            )
            continue
        try:
            rec = IndexRecord.unpack(raw)
        except StrataError as e:
            yield INDEX_RECORD_INVALID.found(pathnames.join(path, key.hex()), str(e))
            continue
        derived = _derived_record(d, valid[key], rec)
        if derived is not None:
            rows[key] = derived
        stale = _stale_fields(rec, derived)
        if stale:
            yield INDEX_STALE.found(
                pathnames.join(path, key.hex()),
                f"{'; '.join(stale)}: the record disagrees with the sidecar and data "
                "file it derives from (F-IDX-2); repair rebuilds the index",
            )
    for key in sorted(set(valid) - set(indexed)):
        yield INDEX_MISSING.found(pathnames.join(path, key.hex()), "not indexed: open adopts it")
    yield from _check_derived_tables(path, rows, tables)


def _check_derived_tables(
    path: str, rows: dict[bytes, IndexRecord], tables: dict[bytes, dict[bytes, bytes]]
) -> Iterator[Finding]:
    """The derived ``ages`` and ``totals`` tables (spec F-IDX-7) against the records they
    derive from, ``rows``: one per ``segments`` record, as derived from its sidecar and files
    where it is a valid segment's (so a stale record is ``INDEX_STALE`` alone, one problem,
    one finding), else as recorded (a dangling record is its own finding). Every row is
    compared, not only the count, so a ``totals`` written big-endian (8 bytes, the right
    count, another number) is found. One ``INDEX_TABLES_STALE`` per table that differs. An
    index with neither table (one a 1.0 or 1.1 writer last wrote) has nothing to compare."""
    if not any(name in tables for name in DERIVED_TABLES):
        return
    records = list(rows.items())
    want = {
        b"ages": {_AGE.pack(rec.sealed_at_ns) + key: b"" for key, rec in records},
        b"totals": {
            _TOTAL_KEY: _TOTAL.pack(sum(r.file_bytes + r.sidecar_bytes for _, r in records))
        },
    }
    for name in DERIVED_TABLES:
        got = tables.get(name, {})
        if got != want[name]:
            yield INDEX_TABLES_STALE.found(
                pathnames.join(path, name.decode()),
                f"{_table_difference(name, got, want[name])}: the table disagrees with the "
                "segment records it derives from (F-IDX-7); repair rebuilds the index",
            )


def _table_difference(name: bytes, got: dict[bytes, bytes], want: dict[bytes, bytes]) -> str:
    """What differs between a derived table as read and as derived, for an operator."""
    if name == b"totals":
        raw = got.get(_TOTAL_KEY)
        if raw is None:
            said = "has no bytes row"
        elif len(raw) != _TOTAL.size:
            said = f"holds a {len(raw)}-byte bytes row ({raw.hex()})"
        else:
            said = f"says {_TOTAL.unpack(raw)[0]} bytes ({raw.hex()} read little-endian)"
        others = sorted(k.hex() for k in got if k != _TOTAL_KEY)
        if others:
            said += f", and {len(others)} other row(s) ({', '.join(others[:2])})"
        return f"totals {said}; the records sum to {_TOTAL.unpack(want[_TOTAL_KEY])[0]} bytes"
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    valued = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    parts = [f"{len(got)} rows, the records give {len(want)}"]
    for what, keys in (("missing", missing), ("not a record's", extra), ("not empty", valued)):
        if keys:
            shown = ", ".join(k.hex() for k in keys[:2]) + (", ..." if len(keys) > 2 else "")
            parts.append(f"{len(keys)} {what} ({shown})")
    return "ages: " + "; ".join(parts)


def _derived_record(d: str, sc: Sidecar, rec: IndexRecord) -> IndexRecord | None:
    """The record derived from the sidecar ``sc`` and the sizes of its two files (spec
    F-IDX-2), ``rec``'s reserved ``refcount`` kept; None when a file went while we looked."""
    try:
        side_bytes = files.file_size(pathnames.join(d, sidecar_name(sc.key)))
        file_bytes = files.file_size(pathnames.join(d, data_name(sc.key)))
    except StrataIOError:
        return None  # removed while we looked: the next check sees it
    return IndexRecord.from_sidecar(sc, side_bytes, file_bytes, refcount=rec.refcount)


def _stale_fields(rec: IndexRecord, want: IndexRecord | None) -> list[str]:
    """Each field of ``rec`` that differs from ``want``, the record derived from its sidecar
    and files (spec F-IDX-2: every field but the reserved ``refcount``), as
    ``name indexed X, derived Y``."""
    if want is None:
        return []

    def show(v: object) -> str:
        return v.hex() if isinstance(v, bytes) else v.name if isinstance(v, Enum) else str(v)

    return [
        f"{f.name} indexed {show(getattr(rec, f.name))}, derived {show(getattr(want, f.name))}"
        for f in fields(IndexRecord)
        if getattr(rec, f.name) != getattr(want, f.name)
    ]
