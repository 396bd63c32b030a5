"""The remote level's commit record (spec F-REM-2), pure: every malformed head is a typed
:class:`FormatError` (never a ZeroDivisionError, a huge allocation or a wrong parse), and the
sidecar inside is checked in its own order (F-READ-1)."""

from __future__ import annotations

import numpy as np
import pytest

from stratastore.format import ChecksumMismatch, Codec, FormatError, Level, encode_sidecar
from stratastore.format.remote_record import (
    MAX_PART_BYTES,
    MIN_PART_BYTES,
    CommitRecord,
    decode_commit_record,
)
from stratastore.levels.sealing import encode, kv_segment, sidecar_for
from tests.conftest import kv_bytes, tiny_fp

NONCE = "0123456789abcdef" * 2


def _record(tokens: int = 100, part_bytes: int = 4096) -> CommitRecord:
    fp = tiny_fp()
    u = kv_segment(fp, fp.digest(), np.arange(tokens), kv_bytes(fp, tokens), token_start=0)
    enc = encode(u, Codec.RAW)
    sc = sidecar_for(u, enc, enc.hashes(), fp, Level.COLD)
    return CommitRecord.for_sidecar(NONCE, sc, part_bytes)


def test_the_record_is_its_head_then_the_sidecar() -> None:
    rec = _record()  # 6,400 stored bytes: 2 parts of 4,096
    raw = rec.encode()
    assert raw == f"SRC1:{NONCE}:2:4096:".encode() + encode_sidecar(rec.sidecar)
    assert decode_commit_record(raw) == rec
    assert rec.head == raw[: raw.index(b":", 43) + 1]


def test_parts_cover_the_stored_bytes_exactly() -> None:
    for pb, parts in ((6400, 1), (6399, 2), (4096, 2), (MAX_PART_BYTES, 1), (MIN_PART_BYTES, 2)):
        rec = _record(part_bytes=pb)
        assert rec.parts == parts
        assert decode_commit_record(rec.encode()).parts == parts


@pytest.mark.parametrize(
    "head",
    [
        b"SRC2:%s:2:4096:",  # another magic
        b"src1:%s:2:4096:",
        b"SRC1:%s:2:0:",  # zero part bytes (a division by zero before)
        b"SRC1:%s:0:4096:",  # no part
        b"SRC1:%s:02:4096:",  # a leading zero
        b"SRC1:%s:+2:4096:",  # a sign
        b"SRC1:%s:-2:4096:",
        b"SRC1:%s: 2:4096:",  # a space int() would take
        b"SRC1:%s:2_0:4096:",  # an underscore int() would take
        b"SRC1:%s:2:4096",  # no colon before the sidecar
        b"SRC1:%s:3:4096:",  # parts that do not match the stored bytes
        b"SRC1:%s:1:4096:",
        b"SRC1:%s:99999999999:4096:",  # more digits than any count
        b"SRC1:%s:1:536870913:",  # a part over 512 MiB
        b"SRC1:%s:2:4095:",  # a part under 4 KiB (the bound on a record's part count)
        b"SRC1:%s:6400:1:",
    ],
)
def test_a_malformed_head_is_a_format_error(head: bytes) -> None:
    side = encode_sidecar(_record().sidecar)
    with pytest.raises(FormatError):
        decode_commit_record(head % NONCE.encode() + side)


@pytest.mark.parametrize("nonce", [NONCE.upper(), NONCE[:-1], NONCE + "0", "g" * 32, "é" * 16])
def test_a_nonce_that_is_not_32_lowercase_hex_digits_is_refused(nonce: str) -> None:
    side = encode_sidecar(_record().sidecar)
    with pytest.raises(FormatError):
        decode_commit_record(b"SRC1:" + nonce.encode() + b":2:4096:" + side)
    with pytest.raises(ValueError):
        CommitRecord.for_sidecar(nonce, _record().sidecar, 4096)


def test_the_sidecar_is_checked_as_from_a_file() -> None:
    raw = bytearray(_record().encode())
    raw[-40] ^= 1  # a byte of the sidecar's body: its trailer no longer matches
    with pytest.raises(ChecksumMismatch):
        decode_commit_record(bytes(raw))
    with pytest.raises(FormatError):
        decode_commit_record(bytes(raw[:-5]))  # truncated
    with pytest.raises(FormatError):
        decode_commit_record(b"")
    with pytest.raises(FormatError):
        decode_commit_record(b"SRC1:" + b"0" * (64 << 20))  # longer than any record


def test_a_writer_refuses_parts_outside_the_bounds() -> None:
    sc = _record().sidecar
    for pb in (0, -1, 1, MIN_PART_BYTES - 1, MAX_PART_BYTES + 1):
        with pytest.raises(ValueError):
            CommitRecord.for_sidecar(NONCE, sc, pb)
