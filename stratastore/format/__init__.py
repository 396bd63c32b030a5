"""Pure encode/decode of every on-disk structure (format-spec/SPEC.md). No I/O, no policy."""

from stratastore.format.errors import (
    ChecksumMismatch,
    FormatError,
    IncompatibleFingerprint,
    KeyMismatch,
    KeyRequired,
    NotAuthenticated,
    UnsupportedVersion,
)
from stratastore.format.fingerprint import DType, KVLayout, ModelFingerprint
from stratastore.format.index_record import INDEX_SCHEMA, IndexRecord
from stratastore.format.keys import (
    KEY_BYTES,
    MediaRef,
    SegmentKey,
    chain_keys,
    key_chain,
    segment_key,
    segment_media,
    state_key,
)
from stratastore.format.level_key import PLAIN, LevelKeys, PageHasher
from stratastore.format.naming import data_name, parse_name, sidecar_name
from stratastore.format.segment import (
    DATA_OFFSET,
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
)
from stratastore.format.sidecar import Codec, Kind, Level, Sidecar, decode_sidecar, encode_sidecar

__all__ = [
    "DATA_OFFSET",
    "INDEX_SCHEMA",
    "KEY_BYTES",
    "ChecksumMismatch",
    "Codec",
    "DType",
    "FormatError",
    "IncompatibleFingerprint",
    "IndexRecord",
    "KVLayout",
    "KeyMismatch",
    "KeyRequired",
    "Kind",
    "Level",
    "LevelKeys",
    "MediaRef",
    "ModelFingerprint",
    "NotAuthenticated",
    "PLAIN",
    "PageHasher",
    "SegmentHeader",
    "SegmentKey",
    "Sidecar",
    "UnsupportedVersion",
    "chain_keys",
    "data_name",
    "decode_segment_header",
    "decode_sidecar",
    "encode_segment_header",
    "encode_sidecar",
    "key_chain",
    "parse_name",
    "segment_key",
    "segment_media",
    "sidecar_name",
    "state_key",
]
