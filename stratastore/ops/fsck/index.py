"""The LMDB index of a level checked against the segments it derives from (spec F-IDX):
read-only (``readonly=True``, no lock file), and by default in a child process, since LMDB
trusts its file and a damaged page can kill the reader with SIGBUS, which must not take fsck
down with it."""

from __future__ import annotations

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
    INDEX_UNREADABLE,
    Finding,
)
from stratastore.levels.local.index import lmdb_file_problem
from stratastore.ops.fsck.damage import Damage
from stratastore.ops.fsck.entries import special_index_files

__all__ = ["check_index"]


#: run in a child process: LMDB trusts its file, and a damaged page can kill the reader with
#: SIGBUS, which must not take fsck down with it (prints the schema, then key/value rows)
_INDEX_DUMP = """
import sys, lmdb
try:
    env = lmdb.open(sys.argv[1], subdir=True, readonly=True, lock=False, max_dbs=4)
    with env.begin() as txn:
        meta = env.open_db(b"meta", txn=txn, create=False)
        schema = txn.get(b"schema", db=meta)
        out = [schema.hex() if schema is not None else "-"]
        db = env.open_db(b"segments", txn=txn, create=False)
        out += [k.hex() + " " + bytes(v).hex() for k, v in txn.cursor(db=db)]
except lmdb.Error as e:
    print(f"ERROR {e}")
    sys.exit(3)
print("\\n".join(out))
"""


def _read_index_isolated(path: str) -> tuple[bytes | None, dict[bytes, bytes]] | str:
    """The index's schema and rows, read by a child process; or why they could not be."""
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
    rows = {}
    for line in lines[1:]:
        k, _, v = line.partition(" ")
        rows[bytes.fromhex(k)] = bytes.fromhex(v)
    return schema, rows


def _read_index_here(path: str) -> tuple[bytes | None, dict[bytes, bytes]] | str:
    try:
        env = lmdb.open(path, subdir=True, readonly=True, lock=False, max_dbs=4)
        try:
            with env.begin() as txn:
                schema = txn.get(b"schema", db=env.open_db(b"meta", txn=txn, create=False))
                db = env.open_db(b"segments", txn=txn, create=False)
                return (
                    bytes(schema) if schema is not None else None,
                    {bytes(k): bytes(v) for k, v in txn.cursor(db=db)},
                )
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
    schema, indexed = got
    if schema is None or int.from_bytes(schema, "little") != index_record.INDEX_SCHEMA:
        yield INDEX_SCHEMA.found(path, "another schema: open rebuilds it")
        return
    for key, raw in sorted(indexed.items()):
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
        stale = _stale_fields(d, valid[key], rec)
        if stale:
            yield INDEX_STALE.found(
                pathnames.join(path, key.hex()),
                f"{'; '.join(stale)}: the record disagrees with the sidecar and data "
                "file it derives from (F-IDX-2); repair rebuilds the index",
            )
    for key in sorted(set(valid) - set(indexed)):
        yield INDEX_MISSING.found(pathnames.join(path, key.hex()), "not indexed: open adopts it")


def _stale_fields(d: str, sc: Sidecar, rec: IndexRecord) -> list[str]:
    """Each field of ``rec`` that differs from the record derived from the sidecar ``sc`` and
    the sizes of its two files (spec F-IDX-2: every field but the reserved ``refcount``), as
    ``name indexed X, derived Y``."""
    try:
        side_bytes = files.file_size(pathnames.join(d, sidecar_name(sc.key)))
        file_bytes = files.file_size(pathnames.join(d, data_name(sc.key)))
    except StrataIOError:
        return []  # removed while we looked: the next check sees it
    want = IndexRecord.from_sidecar(sc, side_bytes, file_bytes, refcount=rec.refcount)

    def show(v: object) -> str:
        return v.hex() if isinstance(v, bytes) else v.name if isinstance(v, Enum) else str(v)

    return [
        f"{f.name} indexed {show(getattr(rec, f.name))}, derived {show(getattr(want, f.name))}"
        for f in fields(IndexRecord)
        if getattr(rec, f.name) != getattr(want, f.name)
    ]
