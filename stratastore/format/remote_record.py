"""The commit record of a segment on the shared remote level (spec F-REM-2). Pure: no I/O.

A commit record is an ASCII head followed by the segment's sidecar (F-SC), byte for byte::

    SRC1:<nonce>:<parts>:<part bytes>:<sidecar>

``<nonce>`` is 32 lowercase hex digits naming the write; ``<parts>`` and ``<part bytes>`` are
decimal integers without sign or leading zeros. The stored payload is ``<parts>`` values of
``<part bytes>`` each, the last one shorter: ``parts == ceil(stored_bytes / part_bytes)``, and a
part holds at most :data:`MAX_PART_BYTES`. The record is checked in the order of F-READ-1: its
size bound, the magic, the head's fields, then the sidecar (its own order), then the parts
against the sidecar's stored bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import FormatError
from .sidecar import MAX_SIDECAR_BYTES, Sidecar, decode_sidecar, encode_sidecar

__all__ = ["MAX_PART_BYTES", "REMOTE_MAGIC", "CommitRecord", "decode_commit_record"]

REMOTE_MAGIC = b"SRC1"
MAX_PART_BYTES = 512 << 20  #: the largest part a writer may write (F-REM-2)
#: the head: magic, nonce, parts, part bytes (decimal, no sign, no leading zero)
_HEAD = re.compile(rb"SRC1:([0-9a-f]{32}):([1-9][0-9]{0,9}):([1-9][0-9]{0,9}):")
_MAX_HEAD = 4 + 1 + 32 + 1 + 10 + 1 + 10 + 1


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """A decoded commit record: the write's nonce, how its payload is cut, and the sidecar."""

    nonce: str
    parts: int
    part_bytes: int
    sidecar: Sidecar

    @property
    def head(self) -> bytes:
        """The record's ASCII head (what a delete compares to know it removes this write)."""
        return f"SRC1:{self.nonce}:{self.parts}:{self.part_bytes}:".encode()

    def encode(self) -> bytes:
        """The record's bytes: the head, then the sidecar's encoding."""
        return self.head + encode_sidecar(self.sidecar)

    @classmethod
    def for_sidecar(cls, nonce: str, sidecar: Sidecar, part_bytes: int) -> CommitRecord:
        """The record of a write of ``sidecar``'s payload in parts of ``part_bytes``."""
        if not re.fullmatch("[0-9a-f]{32}", nonce):
            raise ValueError(f"a nonce is 32 lowercase hex digits, not {nonce!r}")
        if not 1 <= part_bytes <= MAX_PART_BYTES:
            raise ValueError(f"part_bytes {part_bytes} is outside 1..{MAX_PART_BYTES}")
        parts = max(1, -(-sidecar.stored_bytes // part_bytes))
        return cls(nonce, parts, part_bytes, sidecar)


def decode_commit_record(raw: bytes, obj: str = "commit record") -> CommitRecord:
    """Parse ``raw`` (spec F-REM-2). :class:`FormatError` for a record that is too long, has
    another magic or a malformed head, parts that do not cover the sidecar's stored bytes or
    parts over :data:`MAX_PART_BYTES`; the sidecar's own errors (F-READ-1) as
    :func:`decode_sidecar` raises them. The caller checks identity (the key, the model)."""
    if len(raw) > _MAX_HEAD + MAX_SIDECAR_BYTES:
        raise FormatError(f"{obj} is {len(raw):,} bytes, longer than any commit record")
    if not raw.startswith(REMOTE_MAGIC + b":"):
        raise FormatError(f"{obj} is not a stratastore commit record (magic {raw[:4]!r})")
    m = _HEAD.match(raw)
    if m is None:
        raise FormatError(f"{obj} has a malformed head (SRC1:<32 hex>:<parts>:<part bytes>:)")
    parts, part_bytes = int(m[2]), int(m[3])
    if part_bytes > MAX_PART_BYTES:
        raise FormatError(f"{obj} names parts of {part_bytes:,} bytes, over the "
                          f"{MAX_PART_BYTES:,} allowed")  # fmt: skip
    sc = decode_sidecar(raw[m.end() :], obj)
    if parts != max(1, -(-sc.stored_bytes // part_bytes)):
        raise FormatError(f"{obj} is damaged: {parts} parts of {part_bytes} bytes for "
                          f"{sc.stored_bytes} stored bytes")  # fmt: skip
    return CommitRecord(m[1].decode(), parts, part_bytes, sc)
