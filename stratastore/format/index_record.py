"""Records of the LMDB index (spec F-IDX). The index is derived state: every field here is
computed from a sidecar and its data file, so the whole index can be rebuilt from them.

Database ``segments``: key (32 bytes) -> INDEX_RECORD. Database ``meta``: ``b"schema"`` ->
u32 schema version; ``b"fingerprint"`` -> the 84-byte fingerprint shared by every sidecar.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from stratastore.format.errors import FormatError
from stratastore.format.sidecar import Codec, Kind, Level, Sidecar

__all__ = ["INDEX_RECORD", "INDEX_SCHEMA", "IndexRecord"]

INDEX_SCHEMA = 1
# version, kind, level, codec, refcount, page_count, page_bytes, sidecar_bytes, file_bytes,
# token_start, token_end, sealed_at_ns, parent_key
INDEX_RECORD = struct.Struct("<BBBBIIIIQQQQ32s")
assert INDEX_RECORD.size == 84


@dataclass(frozen=True, slots=True)
class IndexRecord:
    kind: Kind
    level: Level
    codec: Codec
    refcount: int
    page_count: int
    page_bytes: int
    sidecar_bytes: int
    file_bytes: int
    token_start: int
    token_end: int
    sealed_at_ns: int
    parent_key: bytes

    @classmethod
    def from_sidecar(
        cls, sc: Sidecar, sidecar_bytes: int, file_bytes: int, refcount: int = 0
    ) -> IndexRecord:
        return cls(
            sc.kind,
            sc.level,
            sc.codec,
            refcount,
            sc.page_count,
            sc.page_bytes,
            sidecar_bytes,
            file_bytes,
            sc.token_start,
            sc.token_end,
            sc.sealed_at_ns,
            sc.parent_key,
        )

    @property
    def total_bytes(self) -> int:
        """Disk bytes of the segment: data file plus sidecar (what budgets count)."""
        return self.file_bytes + self.sidecar_bytes

    def pack(self) -> bytes:
        return INDEX_RECORD.pack(
            INDEX_SCHEMA,
            int(self.kind),
            int(self.level),
            int(self.codec),
            self.refcount,
            self.page_count,
            self.page_bytes,
            self.sidecar_bytes,
            self.file_bytes,
            self.token_start,
            self.token_end,
            self.sealed_at_ns,
            self.parent_key,
        )

    @classmethod
    def unpack(cls, raw: bytes, obj: str = "index record") -> IndexRecord:
        if len(raw) != INDEX_RECORD.size:
            raise FormatError(f"{obj}: {len(raw)} bytes, expected {INDEX_RECORD.size}")
        ver, kind, level, codec, ref, pc, pb, sb, fb, t0, t1, sealed, parent = INDEX_RECORD.unpack(
            raw
        )
        if ver != INDEX_SCHEMA:
            raise FormatError(f"{obj}: schema {ver}, expected {INDEX_SCHEMA}; rebuild the index")
        try:
            return cls(
                Kind(kind), Level(level), Codec(codec), ref, pc, pb, sb, fb, t0, t1, sealed, parent
            )
        except ValueError:
            raise FormatError(f"{obj}: unknown kind, level or codec; rebuild the index") from None
