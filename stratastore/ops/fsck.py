"""``strata fsck``: an offline, read-only check of store directories (issue 6, first part).

:func:`fsck` yields :class:`Finding` records, each with a stable id (format-spec/FSCK.md), a
severity (error, warning, info), the object and a detail, in the style of git fsck. It opens
nothing for writing: the LMDB index is read with ``readonly=True`` and no lock file, and no
segment file is touched. ``deep`` re-hashes every page; otherwise the first and the last page of
each segment are sampled. One damaged segment is one finding, named by its cause; what follows
from it (its index record, the chains that stop at it) is in that finding's detail.
:func:`~stratastore.ops.repair.repair` quarantines, rebuilds and cuts chains (format-spec/FSCK.md);
which directories make up a store is :mod:`stratastore.ops.level_dirs`'s to find. Pages are read
with ``pread`` into memory fsck owns (:class:`~stratastore.levels.reader.SegmentReader`), never
through a mapping: a data file truncated or failing while fsck reads it is a finding, never a
SIGBUS.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import Any, Literal, TypeVar

import lmdb

from stratastore.errors import StrataError
from stratastore.format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    IndexRecord,
    UnsupportedVersion,
    decode_segment_header,
    decode_sidecar,
    parse_name,
)
from stratastore.format.index_record import INDEX_SCHEMA
from stratastore.format.manifest import (
    MAX_MANIFEST_BYTES,
    ChainManifest,
    decode_manifest,
    manifest_key_mismatch,
)
from stratastore.format.naming import (
    INDEX_DIR,
    QUARANTINE_DIR,
    TEMP_PREFIX,
    chain_name,
    data_name,
    is_chain_name,
    sidecar_name,
)
from stratastore.format.sidecar import MAX_SIDECAR_BYTES, Sidecar
from stratastore.io import files, guard, modes
from stratastore.io.errors import NotARegularFile, ShortRead, StrataIOError, SymlinkRefused
from stratastore.levels.local.index import lmdb_file_problem
from stratastore.levels.reader import SegmentReader
from stratastore.ops.level_dirs import StoreLevels, levels_of
from stratastore.ops.reachability import reachability

__all__ = ["Finding", "Severity", "committed_keys", "fsck", "quarantined_keys"]

Severity = Literal["error", "warning", "info"]
#: the damage findings whose segment repair leaves in place (a link, a FIFO, a newer reader's)
_LEFT_ALONE = ("SYMLINK", "NOT_REGULAR_FILE", "SIDECAR_UNSUPPORTED")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    severity: Severity
    object: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Damage:
    """A damaged segment: the finding that names its cause, and what follows from it (the
    index record that still names it, the chains that stop at it). They are one problem, so
    fsck reports one finding, the consequences in its detail (format-spec/FSCK.md)."""

    finding: Finding
    consequences: list[str] = field(default_factory=list)

    def report(self) -> Finding:
        if not self.consequences:
            return self.finding
        return replace(self.finding, detail="; ".join([self.finding.detail, *self.consequences]))


@dataclass(frozen=True, slots=True)
class _Chains:
    """What a chain check looks a manifest's segments up in (spec F-CHAIN-3/4)."""

    valid: dict[bytes, str]  #: key -> the checked level where it is committed and valid
    elsewhere: set[bytes]  #: keys committed in the store's levels not checked (not validated)
    damaged: dict[bytes, list[_Damage]]  #: key -> its damage in the checked levels
    quarantined: dict[bytes, str]  #: key -> the strata-quarantine/ that holds it
    searched: tuple[str, ...]  #: every level looked in, for the message


def fsck(dirs: Sequence[str], *, deep: bool = False, isolate_index: bool = True,
         levels: StoreLevels | None = None) -> Iterator[Finding]:  # fmt: skip
    """Check each directory (a store level), then what spans them (manifests, duplicates).

    A damaged segment is one finding, named by its cause (``PAGE_HASH_MISMATCH``, ...): the
    index record that still names it and the chains that stop at it are consequences, carried
    in its detail, never findings of their own. ``CHAIN_BROKEN`` is a segment absent from every
    level of ``levels.store`` (default :func:`~stratastore.ops.level_dirs.levels_of`: ``dirs`` and
    their sibling levels), since a chain in the last level names segments of every level
    (F-CHAIN-4); levels not in ``dirs`` are only looked in, not checked. ``SEGMENT_UNREACHABLE``
    (a committed segment of ``dirs`` no chain reaches, F-CHAIN-3) only when ``levels.complete``.
    ``isolate_index=False`` reads the LMDB index in this process (faster; only for an index
    known to be a real LMDB commit, as the power-loss tests have: a damaged one can SIGBUS)."""
    for d in dirs:
        if not os.path.isdir(d):
            raise StrataError(f"{d} is not a directory; pass store level directories")
    levels = levels if levels is not None else levels_of(dirs)
    given = {os.path.abspath(d) for d in dirs}
    others = [d for d in levels.store if os.path.abspath(d) not in given]
    seen: dict[bytes, str] = {}
    manifests: list[tuple[str, str]] = []
    damaged: dict[bytes, list[_Damage]] = {}
    for d in dirs:
        here: dict[bytes, _Damage] = {}
        keys = yield from _check_dir(d, deep, manifests, isolate_index, here)
        for key, dmg in here.items():
            damaged.setdefault(key, []).append(dmg)
        for key in keys:
            if key in seen:
                yield Finding("DUPLICATE_ACROSS_LEVELS", "warning", key.hex(),
                              f"committed in {seen[key]} and in {d}")  # fmt: skip
            else:
                seen[key] = d
    chains = _Chains(seen, committed_keys(others), damaged,
                     quarantined_keys([*dirs, *others]), (*dirs, *others))  # fmt: skip
    accepted: list[tuple[str, ChainManifest]] = []
    for d, name in manifests:
        m = yield from _check_manifest(d, name, chains)
        if m is not None:
            accepted.append((os.path.join(d, name), m))
    if levels.complete:  # a guessed level set could hide a segment's predecessor
        yield from _check_reachability(dirs, others, accepted, chains)
    for found in damaged.values():
        for dmg in found:
            yield dmg.report()


def committed_keys(dirs: Sequence[str]) -> set[bytes]:
    """The keys whose sidecar is a regular file in one of ``dirs`` (``lstat``, nothing is read
    or followed: a link or a FIFO named like a sidecar commits nothing, spec F-DIR-8). The one
    definition of a present segment that fsck's chain check and repair's chain cut share."""
    keys: set[bytes] = set()
    for d in dirs:
        with contextlib.suppress(StrataIOError):
            for name in files.listdir(d):
                parsed = parse_name(name)
                if parsed is not None and parsed[1] == "side" and _is_regular(d, name):
                    keys.add(parsed[0])
    return keys


def _is_regular(d: str, name: str) -> bool:
    try:
        return guard.require_regular(os.path.join(d, name), missing_ok=True)
    except StrataIOError:  # a link, a FIFO, ... (reported where d is checked)
        return False


def quarantined_keys(dirs: Sequence[str]) -> dict[bytes, str]:
    """The keys of segment files repair moved into a ``strata-quarantine/`` of ``dirs``."""
    out: dict[bytes, str] = {}
    for d in dirs:
        qdir = os.path.join(d, QUARANTINE_DIR)
        if not os.path.isdir(qdir) or os.path.islink(qdir):
            continue
        with contextlib.suppress(StrataIOError):
            for name in files.listdir(qdir):
                parsed = parse_name(name) or parse_name(name.rsplit(".", 1)[0])  # name.N
                if parsed is not None:
                    out.setdefault(parsed[0], qdir)
    return out


def _drain(gen: Generator[Finding, None, _T]) -> tuple[list[Finding], _T]:
    """Run a findings generator to its end: (its findings, its return value)."""
    found: list[Finding] = []
    while True:
        try:
            found.append(next(gen))
        except StopIteration as stop:
            return found, stop.value


def _check_dir(d: str, deep: bool, manifests: list[tuple[str, str]], isolate_index: bool,
               damaged: dict[bytes, _Damage]) -> Generator[Finding, None, list[bytes]]:  # fmt: skip
    """Findings of one directory; returns the keys of its valid committed segments. A damaged
    segment's finding goes into ``damaged`` instead (fsck reports it once its consequences, the
    chains that stop at it, are known)."""
    names = files.listdir(d)
    sidecars: set[bytes] = set()
    datas: set[bytes] = set()
    special, names = _drain(_special_entries(d, names))
    for f in special:  # a segment file that is a link or a FIFO: the segment is left alone, and
        parsed = parse_name(os.path.basename(f.object))  # what stops at it is a consequence
        if parsed is not None and parsed[0] not in damaged:
            damaged[parsed[0]] = _Damage(f)
        else:  # not a segment file, or the segment's second special file
            yield f
    left_alone = set(damaged)  # neither an orphan data file nor a sidecar to check
    yield from _check_modes(d, names)
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
    sidecars -= left_alone
    datas -= left_alone
    for key in sorted(datas - sidecars):
        yield Finding("ORPHAN_FILE", "warning", os.path.join(d, data_name(key)),
                      "a data file without a sidecar (invisible); repair quarantines "
                      "it")  # fmt: skip
    valid: dict[bytes, Sidecar] = {}
    fingerprints: dict[bytes, int] = {}
    for key in sorted(sidecars):
        found, sc = _drain(_check_segment(d, key, deep, key in datas))
        for f in found:
            if sc is None and f.severity == "error" and key not in damaged:
                damaged[key] = _Damage(f)  # the cause: one finding per damaged segment
            else:
                yield f
        if sc is not None:
            valid[key] = sc
            fp = sc.fingerprint.pack()
            fingerprints[fp] = fingerprints.get(fp, 0) + 1
    if len(fingerprints) > 1:
        yield Finding("FINGERPRINT_MISMATCH", "error", d,
                      f"sidecars of {len(fingerprints)} different models in one directory "
                      "(spec F-DIR-6)")  # fmt: skip
    yield from _check_index(d, valid, isolate_index, damaged)
    return list(valid)


def _special_entries(d: str, names: list[str]) -> Generator[Finding, None, list[str]]:
    """Report every store name that is a symbolic link (``SYMLINK``) or not what it must be
    (``NOT_REGULAR_FILE``: a FIFO, a device, a directory where a file belongs, a file where
    ``strata-index/`` belongs), spec F-DIR-8; returns the other names. Checked with ``lstat``:
    nothing is followed or opened, so a FIFO cannot hang the check, and repair leaves them."""
    rest = []
    for name in names:
        is_dir = name in (INDEX_DIR, QUARANTINE_DIR)
        if not is_dir and not guard.is_store_name(name):
            rest.append(name)
            continue
        path = os.path.join(d, name)
        try:
            if is_dir:
                guard.store_subdir(d, name, create=False)
            else:
                guard.require_regular(path)
        except (SymlinkRefused, NotARegularFile) as e:
            yield _special_finding(path, "directory" if is_dir else "file", e)
            continue
        except StrataIOError:
            continue  # removed while we looked
        rest.append(name)
    return rest


def _special_finding(path: str, what: str, e: SymlinkRefused | NotARegularFile) -> Finding:
    if isinstance(e, SymlinkRefused):
        return Finding("SYMLINK", "error", path, f"a symbolic link where a store {what} belongs; "
                       "never followed, repair leaves it: replace it by the real one or remove "
                       "the link")  # fmt: skip
    return Finding("NOT_REGULAR_FILE", "error", path, f"{e.kind} where a store {what} belongs; "
                   "never read, repair leaves it: remove it by hand")  # fmt: skip


def _special_index_files(index: str) -> Iterator[Finding]:
    """``SYMLINK`` / ``NOT_REGULAR_FILE`` for the index folder's own files
    (:data:`~stratastore.io.guard.INDEX_FILES`), checked with ``lstat`` (spec F-DIR-8): a
    Store refuses to open through them, and repair's rebuild leaves them."""
    for name in sorted(guard.INDEX_FILES):
        path = os.path.join(index, name)
        try:
            guard.require_regular(path, missing_ok=True)
        except (SymlinkRefused, NotARegularFile) as e:
            yield _special_finding(path, "index file", e)
        except StrataIOError:
            continue  # removed while we looked


def _check_modes(d: str, names: list[str]) -> Iterator[Finding]:
    """``STORE_READABLE_BY_OTHERS`` (warning, spec F-DIR-9) when the directory, its index or any
    store file in it lets other users read it: manifests hold token ids, segments K/V."""
    # d/. : the level directory's own bits, not those of a link that names it (F-DIR-8)
    paths = [os.path.join(d, ".")] + [os.path.join(d, n) for n in names
                                       if n == INDEX_DIR or guard.is_store_name(n)]  # fmt: skip
    index = os.path.join(d, INDEX_DIR)
    if INDEX_DIR in names:
        with contextlib.suppress(StrataIOError):
            paths += [os.path.join(index, n) for n in files.listdir(index)
                      if guard.is_store_name(n, in_index=True)]  # fmt: skip
    loose = []
    for path in paths:
        if os.path.islink(path) or not (os.path.isfile(path) or os.path.isdir(path)):
            continue  # a link or a FIFO in the index: SYMLINK / NOT_REGULAR_FILE say so
        with contextlib.suppress(StrataIOError):
            mode = files.permissions(path)
            if modes.others_can_read(mode):
                loose.append(f"{os.path.relpath(path, d)} ({mode:#o})")
    if loose:
        yield Finding("STORE_READABLE_BY_OTHERS", "warning", d,
                      f"{len(loose)} store file(s) or directories other users can read, e.g. "
                      f"{', '.join(loose[:3])}; manifests hold conversations' token ids: "
                      f"`chmod -R o-rwx {d}` (and set file_mode for new files)")  # fmt: skip


def _check_segment(d: str, key: bytes, deep: bool, has_data: bool
                   ) -> Generator[Finding, None, Sidecar | None]:  # fmt: skip
    side = os.path.join(d, sidecar_name(key))
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
    data = os.path.join(d, data_name(key))
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
    bad = _bad_page(data, sc, deep)
    if isinstance(bad, Finding):
        yield bad
        return None
    if bad >= 0:
        yield Finding(
            "PAGE_HASH_MISMATCH",
            "error",
            data,
            f"page {bad} fails BLAKE3 validation" + ("" if deep else " (sampled)"),
        )
        return None
    return sc


def _bad_page(path: str, sc: Sidecar, deep: bool) -> int | Finding:
    """The first bad page (every page with ``deep``, else a sample), or -1; read through a
    :class:`SegmentReader` (``pread``, never a mapping), so a file truncated or failing meanwhile
    is a finding: ``SEGMENT_SIZE_MISMATCH`` when it ends early or no longer matches what was
    checked, ``PAGE_HASH_MISMATCH`` when its pages cannot be read (they cannot be validated),
    ``SEGMENT_HEADER_INVALID`` when its header changed into one that fails its checksum."""
    if sc.codec is not Codec.RAW and not deep:
        return -1  # decoding a compressed segment is the deep check
    try:
        with SegmentReader(sc, path) as seg:
            return seg.first_bad_page(sample=not deep)
    except (ShortRead, FormatError) as e:
        return Finding("SEGMENT_SIZE_MISMATCH", "error", path, f"changed while fsck read it: {e}")
    except StrataIOError as e:
        return Finding("PAGE_HASH_MISMATCH", "error", path, f"its pages could not be read: {e}")
    except StrataError as e:
        return Finding("SEGMENT_HEADER_INVALID", "error", path, f"changed while fsck read it: {e}")


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


def _check_index(d: str, valid: dict[bytes, Sidecar], isolate: bool = True,
                 damaged: dict[bytes, _Damage] | None = None) -> Iterator[Finding]:  # fmt: skip
    """The index of ``d`` against its valid segments ``valid`` (spec F-IDX). A record of a
    segment in ``damaged`` is a consequence of that damage (added to its finding), not an
    ``INDEX_DANGLING`` of its own."""
    path = os.path.join(d, INDEX_DIR)
    if not os.path.lexists(path):
        yield Finding("INDEX_ABSENT", "info", path, "no index: the next open rebuilds it")
        return
    try:  # a link or a non-directory was reported as SYMLINK / NOT_REGULAR_FILE (F-DIR-8)
        guard.store_subdir(d, INDEX_DIR, create=False)
    except StrataIOError:
        return
    special = list(_special_index_files(path))
    yield from special
    if any(os.path.basename(f.object) == "data.mdb" for f in special):
        return  # never read through a link, or from a FIFO
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
        if key not in valid and damaged and key in damaged:
            left = damaged[key].finding.id in _LEFT_ALONE  # repair leaves it
            fix = "" if left else " (repair quarantines the segment and rebuilds the index)"
            damaged[key].consequences.append(f"the index {path} still names it{fix}")
            continue
        if key not in valid:
            yield Finding("INDEX_DANGLING", "error", os.path.join(path, key.hex()),
                          f"indexed in {path} but not a valid committed segment")  # fmt: skip
            continue
        try:
            rec = IndexRecord.unpack(raw)
        except StrataError as e:
            yield Finding("INDEX_RECORD_INVALID", "error", os.path.join(path, key.hex()), str(e))
            continue
        stale = _stale_fields(d, valid[key], rec)
        if stale:
            yield Finding("INDEX_STALE", "warning", os.path.join(path, key.hex()),
                          f"{'; '.join(stale)}: the record disagrees with the sidecar and data "
                          "file it derives from (F-IDX-2); repair rebuilds the index")  # fmt: skip
    for key in sorted(set(valid) - set(indexed)):
        yield Finding(
            "INDEX_MISSING", "warning", os.path.join(path, key.hex()), "not indexed: open adopts it"
        )


def _stale_fields(d: str, sc: Sidecar, rec: IndexRecord) -> list[str]:
    """Each field of ``rec`` that differs from the record derived from the sidecar ``sc`` and
    the sizes of its two files (spec F-IDX-2: every field but the reserved ``refcount``), as
    ``name indexed X, derived Y``."""
    try:
        side_bytes = files.file_size(os.path.join(d, sidecar_name(sc.key)))
        file_bytes = files.file_size(os.path.join(d, data_name(sc.key)))
    except StrataIOError:
        return []  # removed while we looked: the next check sees it
    want = IndexRecord.from_sidecar(sc, side_bytes, file_bytes, refcount=rec.refcount)

    def show(v: object) -> str:
        return v.hex() if isinstance(v, bytes) else v.name if isinstance(v, Enum) else str(v)

    return [f"{f.name} indexed {show(getattr(rec, f.name))}, derived {show(getattr(want, f.name))}"
            for f in fields(IndexRecord)
            if getattr(rec, f.name) != getattr(want, f.name)]  # fmt: skip


def _read_manifest(path: str) -> ChainManifest | Finding:
    """The manifest at ``path`` as a reader accepts it, or the finding why a reader refuses
    it: it does not decode, its name is not its conversation's (F-CHAIN-4), or its keys are not
    its tokens' (F-CHAIN-2)."""
    try:
        m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), path)
    except (StrataError, StrataIOError) as e:
        return Finding("CHAIN_INVALID", "error", path, str(e))
    if os.path.basename(path) != chain_name(m.conv_id):  # F-CHAIN-4: a reader refuses it
        return Finding("CHAIN_INVALID", "error", path,
                       f"it holds conversation {m.conv_id!r}, whose manifest is named "
                       f"{chain_name(m.conv_id)}: a copy under another conversation's "
                       "name")  # fmt: skip
    forged = manifest_key_mismatch(m, obj=path)  # keys not its tokens' (F-CHAIN-2)
    if forged is not None:
        return Finding("MANIFEST_KEY_MISMATCH", "error", path, str(forged))
    return m


def _check_manifest(d: str, name: str, chains: _Chains
                    ) -> Generator[Finding, None, ChainManifest | None]:  # fmt: skip
    """One chain manifest (spec F-CHAIN); returns it when a reader accepts it. Its first
    segment that no level holds valid stops the chain: when that segment is damaged in a checked
    level, the stop is a consequence added to the damage's finding; when it is in no level
    searched, ``CHAIN_BROKEN``."""
    path = os.path.join(d, name)
    m = _read_manifest(path)
    if isinstance(m, Finding):
        yield m
        return None
    for start, _, key in m.segments:
        if key in chains.valid or key in chains.elsewhere:
            continue
        what = "saved session" if m.session else "conversation"
        for dmg in chains.damaged.get(key, []):
            dmg.consequences.append(f"the chain of {what} {m.conv_id!r} ({path}) stops here: it "
                                    f"restores only up to token {start}")  # fmt: skip
        if key not in chains.damaged:
            qdir = chains.quarantined.get(key)
            level: Severity = "error" if m.session else "warning"
            yield Finding("CHAIN_BROKEN", level, path,
                          f"{what} {m.conv_id!r}: its segment {key.hex()} at token {start} is in "
                          f"none of the levels searched ({', '.join(chains.searched)})"
                          + (f"; it was moved into {qdir} as damaged" if qdir else "")
                          + "; it restores only up to there")  # fmt: skip
        break
    return m


def _check_reachability(dirs: Sequence[str], others: Sequence[str],
                        accepted: list[tuple[str, ChainManifest]], chains: _Chains
                        ) -> Iterator[Finding]:  # fmt: skip
    """``SEGMENT_UNREACHABLE`` for each committed segment of ``dirs`` that no chain reaches
    (spec F-CHAIN-3, :mod:`stratastore.ops.reachability`), only for a complete level set: the
    manifests of ``others`` count too (read, not checked), a segment of any level is present,
    and a damaged one stops its chains. A damaged segment is reported by its damage, and one
    reached only past damaged segments is a consequence in that damage's detail (one problem,
    one finding); names and manifests only, nothing is hashed."""
    for d in others:
        with contextlib.suppress(StrataIOError):
            for name in sorted(files.listdir(d)):
                m = _read_manifest(os.path.join(d, name)) if is_chain_name(name) else None
                if isinstance(m, ChainManifest):
                    accepted.append((os.path.join(d, name), m))
    here = {d: committed_keys([d]) for d in dirs}
    mine: set[bytes] = set().union(*here.values())
    store = mine | set(chains.valid) | chains.elsewhere | set(chains.damaged)
    reach = reachability(accepted, mine - set(chains.damaged), store.__contains__,
                         chains.damaged.__contains__)  # fmt: skip
    behind: dict[bytes, list[str]] = {}  # a damaged key -> the segments only it hides
    for d in dirs:
        for key in sorted(here[d] & set(reach.unreachable)):
            gone, path = reach.unreachable[key], os.path.join(d, data_name(key))
            if gone.only_damage:
                behind.setdefault(gone.stops[0].key, []).append(path)
                continue
            stop = next((s for s in gone.stops if s.missing), None)
            qdir = chains.quarantined.get(stop.key) if stop is not None else None
            yield Finding("SEGMENT_UNREACHABLE", "warning", path,
                          f"segment {key.hex()} in level {d}: {gone.reason()}"
                          + (f" (moved into {qdir} as damaged)" if qdir else "")
                          + "; no restore reads it, yet it occupies the level's budget "
                          "(F-CHAIN-3); repair quarantines it")  # fmt: skip
    for key, paths in behind.items():
        for dmg in chains.damaged[key][:1]:
            fix = ("repair leaves them, as it leaves this segment" if dmg.finding.id in _LEFT_ALONE
                   else "once repair cuts the chains here, it quarantines them")  # fmt: skip
            dmg.consequences.append(f"{len(paths)} segment(s) after it are reached by no chain "
                                    f"(F-CHAIN-3), e.g. {', '.join(paths[:3])}: {fix}")  # fmt: skip
