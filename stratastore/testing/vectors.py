"""Decide what this implementation makes of each golden vector (spec F-COMPAT-4).

``vector_outcome`` returns ``"ok"``, the class name of the typed error raised
(``"FormatError"``, ``"UnsupportedVersion"``, ``"ChecksumMismatch"``) or ``"PageMismatch:N"``
when a data file parses but page N fails validation; the manifest's ``expect`` is the answer a
conforming reader gives. Segment vectors are checked the way a store reads them: placed under
their segment names in a fresh directory beside their sidecar, then opened and read.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from ..errors import StrataError
from ..format import (
    ChecksumMismatch,
    IndexRecord,
    ModelFingerprint,
    data_name,
    decode_segment_header,
    decode_sidecar,
    segment_key,
    sidecar_name,
    state_key,
)
from ..format.manifest import decode_manifest
from ..store import SegmentStore

__all__ = ["load_manifest", "vector_outcome"]


def load_manifest(vector_dir: str) -> dict[str, Any]:
    with open(os.path.join(vector_dir, "MANIFEST.json"), encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _read(vector_dir: str, name: str) -> bytes:
    with open(os.path.join(vector_dir, name), "rb") as f:
        return f.read()


def vector_outcome(vector_dir: str, entry: dict[str, Any]) -> str:
    data = _read(vector_dir, entry["file"])
    kind = entry["kind"]
    try:
        if kind == "fingerprint":
            ModelFingerprint.unpack(data)
        elif kind == "sidecar":
            decode_sidecar(data, entry["file"])
        elif kind == "index_record":
            IndexRecord.unpack(data)
        elif kind == "segment":
            decode_segment_header(data, entry["file"])
            return _segment_in_store(vector_dir, entry, data)
        elif kind == "keys":
            json.loads(data)
        elif kind == "manifest":
            decode_manifest(data, entry["file"])
        elif kind == "store":
            return _store_layout(vector_dir, json.loads(data))
        elif kind == "key_case":
            return _key_case(vector_dir, entry, json.loads(data))
        else:
            raise ValueError(f"unknown vector kind {kind!r}")
    except StrataError as e:
        return type(e).__name__
    return "ok"


def _key_case(vector_dir: str, entry: dict[str, Any], case: dict[str, Any]) -> str:
    """Derive the case's key; ``KeyMismatch`` when it differs from the one recorded."""
    if "state_of" in case:
        key = state_key(bytes.fromhex(case["state_of"]))
    else:
        fp = ModelFingerprint.unpack(_read(vector_dir, entry["fingerprint"]))
        media = [(off, bytes.fromhex(h)) for off, h in case["media"]]
        key = segment_key(fp.digest(), case["tokens"], media)
    return "ok" if key.hex() == case.get("key") else "KeyMismatch"


def _store_layout(vector_dir: str, recipe: dict[str, Any]) -> str:
    """Lay vector files out under the recipe's names, open the directory, read every segment."""
    fp = ModelFingerprint.unpack(_read(vector_dir, recipe["fingerprint"]))
    with tempfile.TemporaryDirectory(prefix="strata-vector-") as d:
        for name, source in recipe["files"].items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(_read(vector_dir, source))
        with SegmentStore.open(d, fp, create=False) as store:
            if store.skipped:
                return store.skipped[0].error
            for key in store.keys():
                sc = store.sidecar(key)
                try:
                    store.get_into(key, bytearray(sc.payload_bytes))
                except ChecksumMismatch as e:
                    return f"PageMismatch:{e.page}"
            return f"ok:{len(store)}"


def _segment_in_store(vector_dir: str, entry: dict[str, Any], data: bytes) -> str:
    side = _read(vector_dir, entry["sidecar"])
    sc = decode_sidecar(side, entry["sidecar"])
    with tempfile.TemporaryDirectory(prefix="strata-vector-") as d:
        with open(os.path.join(d, sidecar_name(sc.key)), "wb") as f:
            f.write(side)
        with open(os.path.join(d, data_name(sc.key)), "wb") as f:
            f.write(data)
        with SegmentStore.open(d, sc.fingerprint, create=False) as store:
            if store.skipped:
                return store.skipped[0].error
            out = bytearray(sc.payload_bytes)
            try:
                store.get_into(sc.key, out)
            except ChecksumMismatch as e:
                return f"PageMismatch:{e.page}" if e.page is not None else type(e).__name__
        shutil.rmtree(d, ignore_errors=True)
    return "ok"
