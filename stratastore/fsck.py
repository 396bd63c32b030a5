"""``strata fsck``: an offline, read-only check of store directories (issue 6, first part).

:func:`fsck` yields :class:`Finding` records, each with a stable id (format-spec/FSCK.md), a
severity (error, warning, info), the object and a detail, in the style of git fsck. It opens
nothing for writing: the LMDB index is read with ``readonly=True`` and no lock file, and no
segment file is touched. ``deep`` re-hashes every page; otherwise the first and the last page of
each segment are sampled. Repair is not implemented yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import lmdb
import numpy as np

from .errors import StrataError
from .format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    IndexRecord,
    SegmentHeader,
    UnsupportedVersion,
    decode_segment_header,
    decode_sidecar,
    parse_name,
)
from .format.index_record import INDEX_SCHEMA
from .format.manifest import MAX_MANIFEST_BYTES, decode_manifest
from .format.naming import INDEX_DIR, QUARANTINE_DIR, TEMP_PREFIX, is_chain_name
from .format.sidecar import MAX_SIDECAR_BYTES, Sidecar
from .io import files
from .io.errors import StrataIOError
from .store.index import lmdb_file_problem

__all__ = ["Finding", "fsck"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    severity: Severity
    object: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fsck(dirs: Sequence[str], *, deep: bool = False, isolate_index: bool = True
         ) -> Iterator[Finding]:  # fmt: skip
    """Check each directory (a store level), then what spans them (manifests, duplicates).
    ``isolate_index=False`` reads the LMDB index in this process (faster; only for an index
    known to be a real LMDB commit, as the power-loss tests have: a damaged one can SIGBUS)."""
    seen: dict[bytes, str] = {}
    manifests: list[tuple[str, str]] = []
    for d in dirs:
        if not os.path.isdir(d):
            raise StrataError(f"{d} is not a directory; pass store level directories")
        keys = yield from _check_dir(d, deep, manifests, isolate_index)
        for key in keys:
            if key in seen:
                yield Finding("DUPLICATE_ACROSS_LEVELS", "warning", key.hex(),
                              f"committed in {seen[key]} and in {d}")  # fmt: skip
            else:
                seen[key] = d
    for d, name in manifests:
        yield from _check_manifest(d, name, seen)


def _check_dir(d: str, deep: bool, manifests: list[tuple[str, str]], isolate_index: bool
               ) -> Generator[Finding, None, list[bytes]]:  # fmt: skip
    """Findings of one directory; returns the keys of its valid committed segments."""
    names = files.listdir(d)
    sidecars: set[bytes] = set()
    datas: set[bytes] = set()
    for name in names:
        parsed = parse_name(name)
        if parsed is not None:
            (sidecars if parsed[1] == "side" else datas).add(parsed[0])
        elif name.startswith(TEMP_PREFIX):
            yield Finding("ORPHAN_TEMP", "warning", os.path.join(d, name),
                          "a temp file of an interrupted write; repair removes it")  # fmt: skip
        elif is_chain_name(name):
            manifests.append((d, name))
        elif name not in (INDEX_DIR, QUARANTINE_DIR):
            yield Finding(
                "UNKNOWN_FILE", "info", os.path.join(d, name), "not a store file; ignored"
            )
    for key in sorted(datas - sidecars):
        yield Finding("ORPHAN_FILE", "warning", os.path.join(d, f"strata-conv-{key.hex()}.seg"),
                      "a data file without a sidecar (invisible); repair removes it")  # fmt: skip
    valid: dict[bytes, Sidecar] = {}
    fingerprints: dict[bytes, int] = {}
    for key in sorted(sidecars):
        sc = yield from _check_segment(d, key, deep, key in datas)
        if sc is not None:
            valid[key] = sc
            fp = sc.fingerprint.pack()
            fingerprints[fp] = fingerprints.get(fp, 0) + 1
    if len(fingerprints) > 1:
        yield Finding("FINGERPRINT_MISMATCH", "error", d,
                      f"sidecars of {len(fingerprints)} different models in one directory "
                      "(spec F-DIR-6)")  # fmt: skip
    yield from _check_index(d, valid, isolate_index)
    return list(valid)


def _check_segment(d: str, key: bytes, deep: bool, has_data: bool
                   ) -> Generator[Finding, None, Sidecar | None]:  # fmt: skip
    side = os.path.join(d, f"strata-conv-{key.hex()}.side")
    try:
        sc = decode_sidecar(files.read_file(side, MAX_SIDECAR_BYTES), side)
    except UnsupportedVersion as e:
        yield Finding("SIDECAR_UNSUPPORTED", "error", side, str(e))
        return None
    except ChecksumMismatch as e:
        yield Finding("SIDECAR_CHECKSUM", "error", side, str(e))
        return None
    except (StrataError, StrataIOError) as e:
        yield Finding("SIDECAR_INVALID", "error", side, str(e))
        return None
    if sc.key != key:
        yield Finding("SIDECAR_KEY_MISMATCH", "error", side, f"it holds key {sc.key.hex()}")
        return None
    data = os.path.join(d, f"strata-conv-{key.hex()}.seg")
    if not has_data:
        yield Finding("DATA_MISSING", "error", data, "the sidecar commits a data file that is gone")
        return None
    try:
        head, size = files.read_head(data, DATA_OFFSET)
        hdr = decode_segment_header(head, data)
    except (StrataError, StrataIOError) as e:
        yield Finding("SEGMENT_HEADER_INVALID", "error", data, str(e))
        return None
    if not hdr.matches(sc):
        yield Finding("SEGMENT_HEADER_MISMATCH", "error", data, "header disagrees with its sidecar")
        return None
    if size != hdr.file_bytes:
        yield Finding("SEGMENT_SIZE_MISMATCH", "error", data,
                      f"{size} bytes, the header needs {hdr.file_bytes}")  # fmt: skip
        return None
    bad = _bad_page(data, sc, hdr, deep)
    if bad >= 0:
        yield Finding(
            "PAGE_HASH_MISMATCH",
            "error",
            data,
            f"page {bad} fails BLAKE3 validation" + ("" if deep else " (sampled)"),
        )
        return None
    return sc


def _bad_page(path: str, sc: Sidecar, hdr: SegmentHeader, deep: bool) -> int:
    """The first bad page (every page with ``deep``, else a sample), or -1."""
    from .store.segment_store import first_bad_page

    if sc.codec is not Codec.RAW and not deep:
        return -1  # decoding a compressed segment is the deep check
    mm, _ = files.map_readonly(path)
    return first_bad_page(sc, np.frombuffer(mm, dtype=np.uint8)[hdr.data_offset :],
                          sample=not deep)  # fmt: skip


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
        r = subprocess.run([sys.executable, "-c", _INDEX_DUMP, path], capture_output=True,
                           text=True, timeout=600)  # fmt: skip
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
                return (bytes(schema) if schema is not None else None,
                        {bytes(k): bytes(v) for k, v in txn.cursor(db=db)})  # fmt: skip
        finally:
            env.close()
    except lmdb.Error as e:
        return str(e)


def _check_index(d: str, valid: dict[bytes, Sidecar], isolate: bool = True
                 ) -> Iterator[Finding]:  # fmt: skip
    path = os.path.join(d, INDEX_DIR)
    if not os.path.isdir(path):
        yield Finding("INDEX_ABSENT", "info", path, "no index: the next open rebuilds it")
        return
    problem = lmdb_file_problem(path)
    if problem is not None:  # mapping it could kill this process (SIGBUS)
        yield Finding("INDEX_UNREADABLE", "error", path, f"{problem}; it is derived: repair "
                      "rebuilds it")  # fmt: skip
        return
    got = _read_index_isolated(path) if isolate else _read_index_here(path)
    if isinstance(got, str):
        yield Finding("INDEX_UNREADABLE", "error", path,
                      f"{got}; it is derived: repair rebuilds it")  # fmt: skip
        return
    schema, indexed = got
    if schema is None or int.from_bytes(schema, "little") != INDEX_SCHEMA:
        yield Finding("INDEX_SCHEMA", "warning", path, "another schema: open rebuilds it")
        return
    for key, raw in sorted(indexed.items()):
        if key not in valid:
            yield Finding("INDEX_DANGLING", "error", os.path.join(path, key.hex()),
                          f"indexed in {path} but not a valid committed segment")  # fmt: skip
            continue
        try:
            rec = IndexRecord.unpack(raw)
        except StrataError as e:
            yield Finding("INDEX_RECORD_INVALID", "error", os.path.join(path, key.hex()), str(e))
            continue
        sc = valid[key]
        if (rec.page_count, rec.token_start, rec.token_end) != (sc.page_count, sc.token_start,
                                                                sc.token_end):  # fmt: skip
            yield Finding(
                "INDEX_STALE",
                "warning",
                os.path.join(path, key.hex()),
                "disagrees with its sidecar",
            )
    for key in sorted(set(valid) - set(indexed)):
        yield Finding(
            "INDEX_MISSING", "warning", os.path.join(path, key.hex()), "not indexed: open adopts it"
        )


def _check_manifest(d: str, name: str, segments: dict[bytes, str]) -> Iterator[Finding]:
    path = os.path.join(d, name)
    try:
        m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), path)
    except (StrataError, StrataIOError) as e:
        yield Finding("CHAIN_INVALID", "error", path, str(e))
        return
    for start, _, key in m.segments:
        if key not in segments:
            level: Severity = "error" if m.session else "warning"
            yield Finding("CHAIN_BROKEN", level, path,
                          f"conversation {m.conv_id!r}: the segment at token {start} is in no "
                          "level; it restores only up to there")  # fmt: skip
            return


# -- repair ------------------------------------------------------------------------------------
_QUARANTINE = {
    "SIDECAR_INVALID", "SIDECAR_CHECKSUM", "SIDECAR_KEY_MISMATCH", "DATA_MISSING",
    "SEGMENT_HEADER_INVALID", "SEGMENT_HEADER_MISMATCH", "SEGMENT_SIZE_MISMATCH",
    "PAGE_HASH_MISMATCH", "ORPHAN_FILE",
}  # fmt: skip
_INDEX = {"INDEX_DANGLING", "INDEX_RECORD_INVALID", "INDEX_UNREADABLE", "INDEX_STALE",
          "INDEX_MISSING", "INDEX_SCHEMA", "INDEX_ABSENT"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  #: "quarantine", "remove_temp", "rebuild_index", "truncate_chain"
    object: str
    detail: str


def repair(dirs: Sequence[str], *, deep: bool = True) -> list[Action]:
    """Bring the directories back to a clean fsck without destroying valid data: quarantine
    damaged segments and manifests (moved into ``strata-quarantine/``, never deleted), remove
    temp files, truncate a broken chain to its deepest checkpoint below the gap, and rebuild the
    indexes from the sidecars. Offline only: no process may have the store open. A second run
    changes nothing."""
    actions: list[Action] = []
    findings = list(fsck(dirs, deep=deep))
    rebuild = set()
    for f in findings:
        if f.id == "ORPHAN_TEMP":
            files.unlink(f.object, missing_ok=True)
            actions.append(Action("remove_temp", f.object, "a temp file of an interrupted write"))
        elif f.id in _QUARANTINE:
            d = os.path.dirname(f.object)
            for path in _segment_files(f.object):
                actions.append(Action("quarantine", path, f.id))
                _quarantine(path)
            rebuild.add(d)
        elif f.id == "CHAIN_INVALID":
            actions.append(Action("quarantine", f.object, f.id))
            _quarantine(f.object)
    for d in dirs:  # an index is derived: rebuild it where anything is off
        if d in rebuild or any(f.id in _INDEX and f.object.startswith(d + os.sep)
                               for f in findings):  # fmt: skip
            _rebuild_index(d)
            actions.append(Action("rebuild_index", os.path.join(d, INDEX_DIR), "from the sidecars"))
    for f in fsck(dirs, deep=False):  # chains broken by what was quarantined above, too
        if f.id == "CHAIN_BROKEN":
            actions.append(_truncate_chain(f.object, dirs))
    return actions


def _segment_files(path: str) -> list[str]:
    base = path[: -len(".side")] if path.endswith(".side") else path[: -len(".seg")]
    return [p for p in (base + ".side", base + ".seg") if os.path.exists(p)]


def _quarantine(path: str) -> None:
    from .io.relocate import relocate_file

    qdir = os.path.join(os.path.dirname(path), QUARANTINE_DIR)
    files.makedirs(qdir)
    dst = os.path.join(qdir, os.path.basename(path))
    n = 1
    while os.path.exists(dst):
        dst = os.path.join(qdir, f"{os.path.basename(path)}.{n}")
        n += 1
    relocate_file(path, dst)


def _rebuild_index(d: str) -> None:
    from .store import SegmentStore

    index = os.path.join(d, INDEX_DIR)
    if os.path.isdir(index):
        for name in files.listdir(index):
            files.unlink(os.path.join(index, name), missing_ok=True)
    for name in sorted(files.listdir(d)):
        parsed = parse_name(name)
        if parsed is None or parsed[1] != "side":
            continue
        try:
            sc = decode_sidecar(files.read_file(os.path.join(d, name), MAX_SIDECAR_BYTES), name)
        except StrataError:
            continue
        with SegmentStore.open(d, sc.fingerprint, create=False):
            return  # opening an empty index rebuilds it from every valid sidecar
    if os.path.isdir(index):
        files.rmdir(index)


def _truncate_chain(path: str, dirs: Sequence[str]) -> Action:
    """Keep a manifest's segments up to its deepest checkpoint below the first missing one; a
    manifest that keeps nothing is quarantined."""
    import dataclasses

    from .format.manifest import encode_manifest
    from .io import durable_write

    m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), path)
    present = set()
    for d in dirs:
        present |= {k for k, kind in filter(None, map(parse_name, files.listdir(d)))
                    if kind == "side"}  # fmt: skip
    gap = next(s for s, _, k in m.segments if k not in present)
    keep = max((c.length for c in m.checkpoints if c.length <= gap), default=0)
    if keep == 0:
        _quarantine(path)
        return Action("quarantine", path, "CHAIN_BROKEN at its first segment")
    cut = dataclasses.replace(
        m, tokens=m.tokens[:keep],
        checkpoints=tuple(c for c in m.checkpoints if c.length <= keep),
        media=tuple((p, dg) for p, dg in m.media if p < keep),
        segments=tuple(s for s in m.segments if s[1] <= keep),
    )  # fmt: skip
    durable_write(path, encode_manifest(cut))
    return Action("truncate_chain", path, f"{m.conv_id!r} cut to {keep} tokens (gap at {gap})")
