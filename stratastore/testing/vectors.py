"""Decide what this implementation makes of each golden vector (spec F-COMPAT-4).

``vector_outcome`` returns ``"ok"``, the class name of the typed error raised
(``"FormatError"``, ``"UnsupportedVersion"``, ``"ChecksumMismatch"``, ``"KeyMismatch"``) or
``"PageMismatch:N"`` when a data file parses but page N fails validation; the manifest's
``expect`` is the answer a conforming reader gives. Segment vectors are checked the way a store
reads them: placed under their segment names in a fresh directory beside their sidecar, then
opened and read. Manifest vectors are decoded, then their keys checked (spec F-CHAIN-2).
A ``sized`` vector is a recipe for a file too long to commit: a small vector file padded with
zero bytes to a given length, read as another kind (a size bound, spec F-READ-1 step 1).

A vector found wrong is never edited (spec F-COMPAT-5): a later folder lists it under
``supersedes`` with the outcome a conforming reader gives; :func:`load_vectors` applies those
records, so ``entry["expect"]`` is always the answer to compare with.

The vectors ship inside the package with the spec they test (:func:`kit_path`: ``SPEC.md``,
``FSCK.md`` and ``vectors/``, one folder per format version), so an installed stratastore checks
itself, or another implementation, without a checkout of the repository.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

from stratastore.errors import StrataError
from stratastore.format import (
    ChecksumMismatch,
    FormatError,
    IndexRecord,
    LevelKeys,
    ModelFingerprint,
    data_name,
    decode_segment_header,
    decode_sidecar,
    segment_key,
    sidecar_name,
    state_key,
)
from stratastore.format.manifest import decode_manifest, verify_manifest_keys
from stratastore.format.remote_record import RemoteNames, decode_commit_record
from stratastore.io import files, pathnames
from stratastore.levels.directory import open_directory

__all__ = [
    "REFUSALS",
    "kit_path",
    "load_manifest",
    "load_vectors",
    "refusal_class",
    "vector_outcome",
]

#: the conformance kit's folder in the installed package (package data; format-spec/ at the
#: repository root is a link to it)
_KIT = pathnames.join(
    pathnames.dirname(pathnames.dirname(pathnames.abspath(__file__))), "format_spec"
)


def kit_path(*parts: str) -> str:
    """The absolute path of ``parts`` inside the conformance kit shipped with this package:
    ``kit_path("SPEC.md")``, ``kit_path("FSCK.md")``, ``kit_path("vectors", "v1")``;
    ``kit_path()`` is the kit's folder. Existence is not checked."""
    return pathnames.join(_KIT, *parts)


def load_manifest(vector_dir: str) -> dict[str, Any]:
    with open(pathnames.join(vector_dir, "MANIFEST.json"), encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def load_vectors(
    vectors_root: pathnames.StrPath | None = None, versions: Iterable[str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """``(version, entry)`` for every vector of the folders ``versions`` under ``vectors_root``,
    with every ``supersedes`` record of any of those folders applied (spec F-COMPAT-5): a
    superseded entry's ``expect`` becomes the superseding record's, and the entry gains
    ``superseded_by`` (``"<folder>/<file>"`` of its replacement, or the folder) and
    ``violates`` (the clauses the committed vector breaks).

    Both arguments are optional: ``vectors_root`` defaults to the vectors shipped in the package
    (``kit_path("vectors")``), ``versions`` to every folder under ``vectors_root`` that holds a
    ``MANIFEST.json``, in version order (``v1``, ``v1.1``, ``v1.1-errata1``, ``v1.2``, ...).
    Given explicitly, they behave as before: exactly those folders, in the order given; a
    folder without a manifest raises :class:`FileNotFoundError`."""
    root = kit_path("vectors") if vectors_root is None else pathnames.fspath(vectors_root)
    versions = _version_folders(root) if versions is None else list(versions)
    docs = {v: load_manifest(pathnames.join(root, v)) for v in versions}
    fixes: dict[str, tuple[str, dict[str, Any]]] = {}
    for v, doc in docs.items():
        for rec in doc.get("supersedes", []):
            fixes[rec["file"]] = (v, rec)
    out = []
    for v, doc in docs.items():
        for entry in doc["vectors"]:
            fix = fixes.get(f"{v}/{entry['file']}")
            if fix is not None:
                by, rec = fix
                entry = {
                    **entry,
                    "expect": rec["expect"],
                    "violates": rec["violates"],
                    "superseded_by": f"{by}/{rec['replaced_by']}" if rec.get("replaced_by") else by,
                }
            out.append((v, entry))
    return out


def _version_folders(root: str) -> list[str]:
    """The folders under ``root`` holding a ``MANIFEST.json``, numbers compared as numbers."""

    def order(name: str) -> list[tuple[int, str]]:
        return [(int(t), "") if t.isdigit() else (-1, t) for t in re.split(r"(\d+)", name)]

    found = [
        name
        for name in files.subdirectories(root)
        if files.is_file(pathnames.join(root, name, "MANIFEST.json"))
    ]
    return sorted(found, key=order)


def _read(vector_dir: str, name: str) -> bytes:
    with open(pathnames.join(vector_dir, name), "rb") as f:
        return f.read()


#: the kinds a ``sized`` recipe may read its file as: those whose outcome is the file's bytes
SIZED_KINDS = ("fingerprint", "sidecar", "index_record", "manifest", "remote_commit")
#: the longest file a ``sized`` recipe may describe (a recipe is input: it is bounded too)
MAX_SIZED_BYTES = 1 << 28


def _sized(vector_dir: str, recipe: dict[str, Any]) -> tuple[str, bytes]:
    """A ``sized`` recipe's kind and bytes: the vector file ``head`` followed by zero bytes up
    to ``bytes`` long, read as the kind ``of`` (a size bound's vector without the megabytes)."""
    of, size = recipe["of"], recipe["bytes"]
    head = _read(vector_dir, recipe["head"])
    if (
        of not in SIZED_KINDS
        or not isinstance(size, int)
        or not len(head) <= size <= (MAX_SIZED_BYTES)
    ):
        raise ValueError(
            f"a sized recipe reads {SIZED_KINDS} of at most {MAX_SIZED_BYTES} "
            f"bytes, not {of!r} of {size!r}"
        )
    return of, head + bytes(size - len(head))


def _keys(vector_dir: str, name: str) -> LevelKeys:
    """The keys of key file ``name`` in the folder (spec F-KEYED-1: one secret a line,
    ``#`` lines and empty ones skipped); a secret too short is a :class:`FormatError`."""
    lines = [ln.strip() for ln in _read(vector_dir, name).split(b"\n")]
    try:
        return LevelKeys([ln for ln in lines if ln and not ln.startswith(b"#")])
    except ValueError as e:
        raise FormatError(f"{name}: {e}") from None


def vector_outcome(vector_dir: str, entry: dict[str, Any]) -> str:
    """What this implementation makes of vector ``entry`` of ``vector_dir`` (see the module).
    An entry with ``key_file`` is read by a keyed level whose keys that file of the folder
    holds (spec F-KEYED); without it, by an unkeyed reader."""
    data = _read(vector_dir, entry["file"])
    kind = entry["kind"]
    if kind == "sized":
        kind, data = _sized(vector_dir, json.loads(data))
    try:
        keys = _keys(vector_dir, entry["key_file"]) if "key_file" in entry else None
        if kind == "fingerprint":
            ModelFingerprint.unpack(data)
        elif kind == "level_key":
            return (
                "ok"
                if list(_keys(vector_dir, entry["file"]).key_ids) == entry["key_ids"]
                else ("KeyMismatch")
            )
        elif kind == "sidecar":
            decode_sidecar(data, entry["file"], keys=keys)
        elif kind == "index_record":
            IndexRecord.unpack(data)
        elif kind == "segment":
            decode_segment_header(data, entry["file"])
            return _segment_in_store(vector_dir, entry, data, keys)
        elif kind == "keys":
            json.loads(data)
        elif kind == "manifest":
            verify_manifest_keys(decode_manifest(data, entry["file"]), obj=entry["file"])
        elif kind == "store":
            return _store_layout(vector_dir, json.loads(data))
        elif kind == "key_case":
            return _key_case(vector_dir, entry, json.loads(data))
        elif kind == "remote_commit":
            decode_commit_record(data, entry["file"], keys=keys)
        elif kind == "remote_keys":
            return _remote_keys(vector_dir, json.loads(data))
        elif kind == "index_tables":
            return _index_tables(vector_dir, json.loads(data))
        else:
            raise ValueError(f"unknown vector kind {kind!r}")
    except StrataError as e:
        return refusal_class(e)
    return "ok"


#: the classes of refusal the vectors name (README "Error names"); a subclass an implementation
#: adds (a more precise I/O error, say) reports the documented class it refines
REFUSALS = (
    "NotAuthenticated",
    "KeyMismatch",
    "UnsupportedVersion",
    "FormatError",
    "ChecksumMismatch",
    "IncompatibleFingerprint",
    "StrataIOError",
)


def refusal_class(e: BaseException) -> str:
    """The nearest class of ``e`` (itself first) that the vectors name, else its own name."""
    for cls in type(e).__mro__:
        if cls.__name__ in REFUSALS:
            return cls.__name__
    return type(e).__name__


def _key_case(vector_dir: str, entry: dict[str, Any], case: dict[str, Any]) -> str:
    """Derive the case's key; ``KeyMismatch`` when it differs from the one recorded."""
    if "state_of" in case:
        key = state_key(bytes.fromhex(case["state_of"]))
    else:
        fp = ModelFingerprint.unpack(_read(vector_dir, entry["fingerprint"]))
        media = [(off, bytes.fromhex(h)) for off, h in case["media"]]
        key = segment_key(fp.digest(), case["tokens"], media)
    return "ok" if key.hex() == case.get("key") else "KeyMismatch"


def _remote_keys(vector_dir: str, case: dict[str, Any]) -> str:
    """Name the case's Redis keys (spec F-REM-1); ``KeyMismatch`` when one differs from the
    recorded names, ``FormatError`` for a store name a writer may not use."""
    fp = ModelFingerprint.unpack(_read(vector_dir, case["fingerprint"]))
    try:
        names = RemoteNames(case["name"], fp.digest())
    except ValueError as e:
        raise FormatError(f"remote store name {case['name']!r}: {e}") from None
    key, parent = bytes.fromhex(case["key"]), bytes.fromhex(case["parent"])
    ours = {
        "record": names.record(key),
        "part": names.part(key, case["nonce"], case["part"]),
        "recs": names.recs,
        "ages": names.ages,
        "used": names.used,
        "kids": names.kids(parent),
    }
    return "ok" if ours == case["names"] else "KeyMismatch"


def _lay_out(d: str, vector_dir: str, layout: dict[str, str]) -> None:
    """Write each vector file ``layout[name]`` into the directory ``d`` as ``name``."""
    for name, source in layout.items():
        with open(pathnames.join(d, name), "wb") as f:
            f.write(_read(vector_dir, source))


#: the derived tables of an index a writer of 1.2 keeps (spec F-IDX-7)
DERIVED_TABLES = ("ages", "totals")


def _index_tables(vector_dir: str, recipe: dict[str, Any]) -> str:
    """Lay the recipe's files out, open the directory (its index is built, spec F-IDX-3), and
    compare the derived tables (F-IDX-7) with the rows the recipe records, every key and value
    in hex: ``KeyMismatch`` when a row differs (a deliberately wrong encoding: the file's name
    says which), the error of the open or of the first sidecar not adopted otherwise."""
    fp = ModelFingerprint.unpack(_read(vector_dir, recipe["fingerprint"]))
    want = {
        name: {bytes.fromhex(k): bytes.fromhex(v) for k, v in recipe["tables"][name].items()}
        for name in DERIVED_TABLES
    }
    with tempfile.TemporaryDirectory(prefix="strata-vector-") as d:
        _lay_out(d, vector_dir, recipe["files"])
        with open_directory(d, fp, create=False) as store:
            if store.skipped:
                return store.skipped[0].error
            tables = store.catalog_tables()
            env = tables.env
            with tables.read_txn() as txn:
                built = {
                    name: {
                        bytes(k): bytes(v)
                        for k, v in txn.cursor(db=env.open_db(name.encode(), txn=txn, create=False))
                    }
                    for name in DERIVED_TABLES
                }
    return "ok" if built == want else "KeyMismatch"


def _store_layout(vector_dir: str, recipe: dict[str, Any]) -> str:
    """Lay vector files out under the recipe's names, open the directory, read every segment."""
    fp = ModelFingerprint.unpack(_read(vector_dir, recipe["fingerprint"]))
    with tempfile.TemporaryDirectory(prefix="strata-vector-") as d:
        _lay_out(d, vector_dir, recipe["files"])
        with open_directory(d, fp, create=False) as store:
            if store.skipped:
                return store.skipped[0].error
            for key in store.keys():
                sc = store.sidecar(key)
                try:
                    store.get_into(key, bytearray(sc.payload_bytes))
                except ChecksumMismatch as e:
                    return f"PageMismatch:{e.page}"
            return f"ok:{len(store)}"


def _segment_in_store(
    vector_dir: str, entry: dict[str, Any], data: bytes, keys: LevelKeys | None = None
) -> str:
    side = _read(vector_dir, entry["sidecar"])
    sc = decode_sidecar(side, entry["sidecar"], keys=keys)
    with tempfile.TemporaryDirectory(prefix="strata-vector-") as d:
        with open(pathnames.join(d, sidecar_name(sc.key)), "wb") as f:
            f.write(side)
        with open(pathnames.join(d, data_name(sc.key)), "wb") as f:
            f.write(data)
        with open_directory(d, sc.fingerprint, create=False, keys=keys) as store:
            if store.skipped:
                return store.skipped[0].error
            out = bytearray(sc.payload_bytes)
            try:
                store.get_into(sc.key, out)
            except ChecksumMismatch as e:
                return f"PageMismatch:{e.page}" if e.page is not None else type(e).__name__
        shutil.rmtree(d, ignore_errors=True)
    return "ok"
