"""Fuzz targets for every parser: each must either parse or raise a ``StrataError``. Anything
else (IndexError, struct.error, MemoryError, a hang) is a bug. Used by the atheris runners in
this folder and by tests/unit/format/test_fuzz_targets.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from stratastore.config import StoreConfig
from stratastore.errors import StrataError
from stratastore.format import (
    IndexRecord,
    ModelFingerprint,
    decode_segment_header,
    decode_sidecar,
)
from stratastore.format.manifest import decode_manifest


def sidecar(data: bytes) -> None:
    sc = decode_sidecar(data, "fuzz.side")
    # a sidecar that parses must be internally consistent and re-encode to the same bytes
    # when it is a v1.0 one (newer minors keep unknown head bytes)
    assert sc.page_count >= 1 and sc.payload_bytes >= 1


def segment_header(data: bytes) -> None:
    h = decode_segment_header(data, "fuzz.seg")
    assert h.file_bytes >= h.data_offset


def index_record(data: bytes) -> None:
    IndexRecord.unpack(data, "fuzz record")


def fingerprint(data: bytes) -> None:
    fp = ModelFingerprint.unpack(data)
    assert fp.page_bytes >= 1


def chain_manifest(data: bytes) -> None:
    m = decode_manifest(data, "fuzz.chain")
    assert all(s < e for s, e, _ in m.segments)


def config(data: bytes) -> None:
    StoreConfig.from_toml_bytes(data, "fuzz.toml")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "sidecar": sidecar,
    "segment_header": segment_header,
    "index_record": index_record,
    "fingerprint": fingerprint,
    "chain_manifest": chain_manifest,
    "config": config,
}


def run_one(target: str, data: bytes) -> None:
    """Run a target on one input; typed errors are the expected way to refuse input."""
    with contextlib.suppress(StrataError):
        TARGETS[target](data)
