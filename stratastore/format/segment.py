"""The segment data file: a 4 KiB header block, then the pages (spec F-SEG).

Layout::

    [0, data_offset)            SEGMENT_HEAD (100 bytes) then zeros; data_offset is a multiple
                                of 4096 so the payload can be mmapped or read with O_DIRECT
    [data_offset, +stored_bytes) pages: RAW -> page i at i * page_bytes, the last may be short;
                                ZSTD -> one zstd frame per page, lengths in the sidecar

The header repeats the key and sizes so that a data file can be matched to its sidecar (and
identified without one), and carries its own BLAKE3 so a damaged header is told apart from a
damaged page.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3

from stratastore.format.errors import ChecksumMismatch, FormatError, UnsupportedVersion
from stratastore.format.sidecar import MAX_PAGES, Codec, Kind, Sidecar

__all__ = [
    "DATA_OFFSET",
    "SEGMENT_HEAD",
    "SEGMENT_MAGIC",
    "SegmentHeader",
    "decode_segment_header",
    "encode_segment_header",
]

SEGMENT_MAGIC = b"STRATSEG"
MAJOR, MINOR = 1, 0
DATA_OFFSET = 4096
MAX_DATA_OFFSET = 16 * 4096
# magic, major, minor, data_offset, kind, codec, reserved, key, page_count, page_bytes,
# stored_bytes, header digest (BLAKE3-256 of the 68 bytes before it)
SEGMENT_HEAD = struct.Struct("<8sHHIBB2x32sIIQ32s")
assert SEGMENT_HEAD.size == 100
_SIGNED = SEGMENT_HEAD.size - 32


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    kind: Kind
    codec: Codec
    key: bytes
    page_count: int
    page_bytes: int
    stored_bytes: int
    data_offset: int = DATA_OFFSET
    minor: int = MINOR

    @classmethod
    def for_sidecar(cls, sc: Sidecar) -> SegmentHeader:
        return cls(sc.kind, sc.codec, sc.key, sc.page_count, sc.page_bytes, sc.stored_bytes)

    @property
    def file_bytes(self) -> int:
        return self.data_offset + self.stored_bytes

    def matches(self, sc: Sidecar) -> bool:
        """True when this header describes the segment ``sc`` commits (spec F-SEG-2)."""
        return (
            self.kind,
            self.codec,
            self.key,
            self.page_count,
            self.page_bytes,
            self.stored_bytes,
        ) == (sc.kind, sc.codec, sc.key, sc.page_count, sc.page_bytes, sc.stored_bytes)


def encode_segment_header(h: SegmentHeader) -> bytes:
    """The whole header block (``data_offset`` bytes, zero-padded)."""
    signed = SEGMENT_HEAD.pack(
        SEGMENT_MAGIC,
        MAJOR,
        h.minor,
        h.data_offset,
        int(h.kind),
        int(h.codec),
        h.key,
        h.page_count,
        h.page_bytes,
        h.stored_bytes,
        b"\0" * 32,
    )[:_SIGNED]
    head = signed + blake3.blake3(signed).digest()
    return head + b"\0" * (h.data_offset - len(head))


def decode_segment_header(data: bytes, obj: str = "segment") -> SegmentHeader:
    """Parse the first bytes of a data file (at least ``SEGMENT_HEAD.size``)."""
    if len(data) < SEGMENT_HEAD.size:
        raise FormatError(f"{obj}: header truncated at {len(data)} bytes (spec F-SEG-1)")
    magic, major, minor, off, kind, codec, key, pc, pb, stored, digest = SEGMENT_HEAD.unpack_from(
        data
    )
    if magic != SEGMENT_MAGIC:
        raise FormatError(f"{obj}: bad magic {magic!r}; not a stratastore segment (spec F-SEG-1)")
    if major != MAJOR:
        raise UnsupportedVersion(
            f"{obj}: segment format {major}.{minor} is not readable by this version "
            f"(reads {MAJOR}.x); upgrade stratastore to read it"
        )
    actual = blake3.blake3(memoryview(data)[:_SIGNED]).digest()
    if actual != digest:
        raise ChecksumMismatch(f"{obj} header", digest, actual)
    if off % 4096 or not DATA_OFFSET <= off <= MAX_DATA_OFFSET:
        raise FormatError(f"{obj}: data offset {off} is not a multiple of 4096 in 4096..65536")
    try:
        kind_e, codec_e = Kind(kind), Codec(codec)
    except ValueError:
        raise FormatError(f"{obj}: unknown kind {kind} or codec {codec}") from None
    if not 1 <= pc <= MAX_PAGES or pb < 1:
        raise FormatError(f"{obj}: page count {pc} or page size {pb} is out of range")
    return SegmentHeader(kind_e, codec_e, key, pc, pb, stored, off, minor)
