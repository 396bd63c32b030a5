"""F-SC and F-SEG: sidecar and data-file header encode/decode, bounds and typed refusals."""

from __future__ import annotations

import struct
from dataclasses import replace

import blake3
import pytest

from stratastore.errors import StrataError
from stratastore.format import (
    ChecksumMismatch,
    Codec,
    FormatError,
    IndexRecord,
    Kind,
    Level,
    SegmentHeader,
    Sidecar,
    UnsupportedVersion,
    data_name,
    decode_segment_header,
    decode_sidecar,
    encode_segment_header,
    encode_sidecar,
    parse_name,
    segment_key,
    sidecar_name,
)
from stratastore.format.sidecar import MAX_SIDECAR_BYTES, SIDECAR_HEAD
from tests.conftest import tiny_fp

FP = tiny_fp()


def make_sidecar(n_tokens: int = 10, codec: Codec = Codec.RAW, **kw: object) -> Sidecar:
    pc = -(-n_tokens // FP.page_tokens)
    last = (n_tokens - (pc - 1) * FP.page_tokens) * FP.token_bytes
    payload = (pc - 1) * FP.page_bytes + last
    lengths = tuple(range(100, 100 + pc)) if codec is Codec.ZSTD else ()
    fields: dict[str, object] = dict(
        kind=Kind.KV,
        codec=codec,
        level=Level.COLD,
        fingerprint=FP,
        key=segment_key(FP.digest(), list(range(n_tokens))),
        parent_key=FP.digest(),
        token_start=0,
        token_end=n_tokens,
        page_bytes=FP.page_bytes,
        last_page_bytes=last,
        page_hashes=bytes(range(32)) * pc,
        stored_bytes=sum(lengths) if lengths else payload,
        sealed_at_ns=123,
        stored_lengths=lengths,
    )
    fields.update(kw)
    return Sidecar(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("n_tokens", [1, 3, 4, 5, 10, 400])
@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_sidecar_roundtrip(n_tokens: int, codec: Codec) -> None:
    sc = make_sidecar(n_tokens, codec, media=((0, b"\x01" * 32),))
    raw = encode_sidecar(sc)
    assert decode_sidecar(raw) == sc
    assert sc.page_count == -(-n_tokens // 4)
    assert sc.payload_bytes == n_tokens * FP.token_bytes


def test_state_sidecar_roundtrip() -> None:
    sc = make_sidecar(
        1,
        kind=Kind.STATE,
        token_start=7,
        token_end=7,
        page_bytes=1000,
        last_page_bytes=10,
        page_hashes=b"\0" * 64,
        stored_bytes=1010,
    )
    assert decode_sidecar(encode_sidecar(sc)) == sc


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(page_hashes=b"\0" * 32 * 4), "need 3 pages"),  # F-SC-6
        (dict(page_bytes=128), "page size|need"),
        (dict(stored_bytes=1), "stored bytes"),
        (dict(token_start=5, token_end=4), "token range"),
        (dict(kind=Kind.STATE), "STATE"),
        (dict(media=((10, b"\0" * 32),)), "media"),
        (dict(key=b"\0" * 31), "32 bytes"),
        (dict(page_hashes=b""), "page count"),
    ],
)
def test_sidecar_semantic_rules(change: dict[str, object], match: str) -> None:
    with pytest.raises(FormatError, match=match):
        encode_sidecar(replace(make_sidecar(10), **change))  # type: ignore[arg-type]


def test_state_page_size_is_bounded() -> None:
    big = 1 << 27
    sc = make_sidecar(
        1,
        kind=Kind.STATE,
        token_start=7,
        token_end=7,
        page_bytes=big,
        last_page_bytes=10,
        page_hashes=b"\0" * 64,
        stored_bytes=big + 10,
    )
    with pytest.raises(FormatError, match="STATE page"):
        encode_sidecar(sc)


def test_zstd_lengths_must_add_up() -> None:
    sc = make_sidecar(10, Codec.ZSTD)
    with pytest.raises(FormatError, match="add up"):
        encode_sidecar(replace(sc, stored_bytes=sc.stored_bytes + 1))
    with pytest.raises(FormatError, match="one stored length"):
        encode_sidecar(replace(sc, stored_lengths=(1,)))


def test_sidecar_truncations_are_typed() -> None:
    raw = encode_sidecar(make_sidecar(10))
    for n in range(len(raw)):
        with pytest.raises(FormatError):
            decode_sidecar(raw[:n], "cut.side")


def test_sidecar_every_byte_flip_is_refused_with_a_typed_error() -> None:
    raw = encode_sidecar(make_sidecar(10, media=((3, b"\x05" * 32),)))
    for i in range(len(raw)):
        b = bytearray(raw)
        b[i] ^= 0x20
        with pytest.raises(StrataError):
            decode_sidecar(bytes(b), "flipped.side")


def test_sidecar_oversized_refused_before_parsing() -> None:
    with pytest.raises(FormatError, match="limit"):
        decode_sidecar(b"\0" * (MAX_SIDECAR_BYTES + 1))


def test_sidecar_newer_minor_is_read_and_newer_major_refused() -> None:
    sc = make_sidecar(10)
    newer = replace(sc, minor=3, optional_features=0xFFFF, extra_head=b"future fields!!!")
    got = decode_sidecar(encode_sidecar(newer))
    assert got.key == sc.key and got.minor == 3 and got.extra_head == b"future fields!!!"
    raw = bytearray(encode_sidecar(sc))
    struct.pack_into("<H", raw, 8, 2)
    with pytest.raises(UnsupportedVersion, match="upgrade"):
        decode_sidecar(bytes(raw))


def test_sidecar_unknown_required_feature_refused() -> None:
    raw = bytearray(encode_sidecar(make_sidecar(10)))
    struct.pack_into("<I", raw, 16, 1)
    body = bytes(raw[:-32])
    with pytest.raises(UnsupportedVersion, match="required feature"):
        decode_sidecar(body + blake3.blake3(body).digest())


def test_sidecar_trailer_mismatch_is_checksum_error() -> None:
    raw = bytearray(encode_sidecar(make_sidecar(10)))
    raw[SIDECAR_HEAD.size + 1] ^= 1  # a page digest byte
    with pytest.raises(ChecksumMismatch) as ei:
        decode_sidecar(bytes(raw), "x.side")
    assert ei.value.expected != ei.value.actual and "x.side" in str(ei.value)


def test_segment_header_roundtrip_and_refusals() -> None:
    sc = make_sidecar(10)
    h = SegmentHeader.for_sidecar(sc)
    block = encode_segment_header(h)
    assert len(block) == 4096 and block[100:] == b"\0" * 3996
    got = decode_segment_header(block)
    assert got == h and got.matches(sc) and got.file_bytes == 4096 + sc.stored_bytes
    assert not got.matches(replace(sc, stored_bytes=sc.stored_bytes, key=b"\1" * 32))
    for n in range(100):
        with pytest.raises(FormatError):
            decode_segment_header(block[:n])
    for i in range(100):
        b = bytearray(block)
        b[i] ^= 0x01
        with pytest.raises(StrataError):
            decode_segment_header(bytes(b))


def test_index_record_roundtrip() -> None:
    sc = make_sidecar(10)
    rec = IndexRecord.from_sidecar(sc, 500, 4096 + sc.stored_bytes, refcount=2)
    assert IndexRecord.unpack(rec.pack()) == rec
    assert rec.total_bytes == 500 + 4096 + sc.stored_bytes
    with pytest.raises(FormatError):
        IndexRecord.unpack(rec.pack()[:-1])
    bad = bytearray(rec.pack())
    bad[1] = 77
    with pytest.raises(FormatError, match="rebuild"):
        IndexRecord.unpack(bytes(bad))


def test_names() -> None:
    key = bytes(range(32))
    assert data_name(key) == f"strata-conv-{key.hex()}.seg"
    assert parse_name(sidecar_name(key)) == (key, "side")
    assert parse_name(data_name(key)) == (key, "seg")
    for other in [
        "strata-conv-xyz.seg",
        "strata-tmp-1-" + data_name(key),
        "notes.txt",
        f"strata-conv-{key.hex().upper()}.seg",
        data_name(key) + ".bak",
    ]:
        assert parse_name(other) is None
    with pytest.raises(FormatError):
        data_name(b"short")
