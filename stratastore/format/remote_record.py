"""The names and the commit record of the shared remote level's keys (spec F-REM-1, F-REM-2).
Pure: no I/O.

Every key of a store starts with its namespace ``strata/<name>/<fp>/`` (:class:`RemoteNames`);
the braces in a segment's names are Redis hash tags (one cluster slot a segment).

A commit record is an ASCII head followed by the segment's sidecar (F-SC), byte for byte::

    SRC1:<nonce>:<parts>:<part bytes>:<sidecar>

``<nonce>`` is 32 lowercase hex digits naming the write; ``<parts>`` and ``<part bytes>`` are
decimal integers of 1 to 10 digits without sign or leading zeros, so neither is ever ``0``: a
part count of ``0`` is a malformed head, refused before the sidecar is read, not a wrong count
(F-REM-2). The stored payload is ``<parts>`` values of
``<part bytes>`` each, the last one shorter: ``parts == ceil(stored_bytes / part_bytes)``, and
``<part bytes>`` is within :data:`MIN_PART_BYTES`..:data:`MAX_PART_BYTES`. The record is
checked in the order of F-READ-1: its size bound, the magic, the head's fields, then the
sidecar (its own order), then the parts against the sidecar's stored bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stratastore.format.errors import FormatError
from stratastore.format.level_key import LevelKeys
from stratastore.format.sidecar import MAX_SIDECAR_BYTES, Sidecar, decode_sidecar, encode_sidecar

__all__ = [
    "MAX_COMMIT_RECORD_BYTES",
    "MAX_PART_BYTES",
    "MIN_PART_BYTES",
    "REMOTE_MAGIC",
    "CommitRecord",
    "RemoteNames",
    "check_remote_name",
    "decode_commit_record",
    "parse_remote_name",
]

REMOTE_MAGIC = b"SRC1"
MAX_PART_BYTES = 512 << 20  #: the largest part a writer may write (F-REM-2)
#: the smallest part size (F-REM-2): bounds a record's parts by its stored bytes / 4 KiB
MIN_PART_BYTES = 4096
#: the head: magic, nonce, parts, part bytes (decimal, no sign, no leading zero: never "0")
_HEAD = re.compile(rb"SRC1:([0-9a-f]{32}):([1-9][0-9]{0,9}):([1-9][0-9]{0,9}):")
_MAX_HEAD = 4 + 1 + 32 + 1 + 10 + 1 + 10 + 1
MAX_COMMIT_RECORD_BYTES = _MAX_HEAD + MAX_SIDECAR_BYTES  #: no valid commit record is longer
_NAME = re.compile(r"[a-z0-9_.-]{1,64}")
#: the two names of a segment under a namespace: its commit record and its parts
_RECORD_NAME = re.compile(r"s/\{([0-9a-f]{64})\}")
_PART_NAME = re.compile(r"p/\{([0-9a-f]{64})\}/([0-9a-f]{32})/(0|[1-9][0-9]{0,9})")
NS_FP_DIGITS = 32  #: hex digits of the fingerprint's digest in a namespace


def check_remote_name(name: str) -> str:
    """``name`` if it is a store name of F-REM-1 (1..64 of ``a-z0-9_-.``), else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a remote store name is 1..64 of a-z 0-9 _ - . (not {name!r})")
    return name


def parse_remote_name(rest: str) -> tuple[bytes, str | None, int] | None:
    """A name under a namespace (``rest``: what follows ``strata/<name>/<fp>/``) that is a
    segment's: ``(K, None, 0)`` for its commit record ``s/{K}``, ``(K, nonce, i)`` for a part
    ``p/{K}/<nonce>/<i>``; None for any other name (F-REM-1: nothing else is a segment's)."""
    if m := _RECORD_NAME.fullmatch(rest):
        return bytes.fromhex(m[1]), None, 0
    if m := _PART_NAME.fullmatch(rest):
        return bytes.fromhex(m[1]), m[2], int(m[3])
    return None


@dataclass(frozen=True, slots=True)
class RemoteNames:
    """The Redis key names of store ``name`` for the model whose fingerprint digest is
    ``fp_digest`` (spec F-REM-1); ``K``, ``P`` are 32-byte keys, written in lowercase hex."""

    name: str
    fp_digest: bytes

    def __post_init__(self) -> None:
        check_remote_name(self.name)
        if len(self.fp_digest) != 32:
            raise ValueError("a fingerprint digest is 32 bytes")

    @property
    def ns(self) -> str:
        """``strata/<name>/<fp>/``: the prefix of every key of this store and model."""
        return f"strata/{self.name}/{self.fp_digest.hex()[:NS_FP_DIGITS]}/"

    def record(self, key: bytes) -> str:
        """``s/{K}``: the segment's commit record."""
        return f"{self.ns}s/{{{key.hex()}}}"

    def part(self, key: bytes, nonce: str, i: int) -> str:
        """``p/{K}/<nonce>/<i>``: part ``i`` of the write ``nonce`` of the segment."""
        return f"{self.ns}p/{{{key.hex()}}}/{nonce}/{i}"

    def kids(self, parent: bytes) -> str:
        """``kids/{P}``: hash, each K/V segment whose parent is ``P`` -> ``start:end``."""
        return f"{self.ns}kids/{{{parent.hex()}}}"

    @property
    def recs(self) -> str:
        """``recs``: hash, ``K`` -> the segment's F-IDX-1 index record."""
        return f"{self.ns}recs"

    @property
    def ages(self) -> str:
        """``ages``: sorted set, ``<sealed_at_ns, 20 digits>:K``, every score 0."""
        return f"{self.ns}ages"

    @property
    def used(self) -> str:
        """``used``: integer, the commit records' and payloads' bytes."""
        return f"{self.ns}used"


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
        if not MIN_PART_BYTES <= part_bytes <= MAX_PART_BYTES:
            raise ValueError(
                f"part_bytes {part_bytes} is outside {MIN_PART_BYTES}..{MAX_PART_BYTES}"
            )
        parts = -(-sidecar.stored_bytes // part_bytes)
        return cls(nonce, parts, part_bytes, sidecar)


def decode_commit_record(
    raw: bytes,
    obj: str = "commit record",
    *,
    keys: LevelKeys | None = None,
    unchecked: bool = False,
) -> CommitRecord:
    """Parse ``raw`` (spec F-REM-2); ``keys`` and ``unchecked`` are the sidecar's
    (:func:`decode_sidecar`: a keyed level's, spec F-KEYED). :class:`FormatError` for a
    record that is too long, has another magic or a malformed head, parts that do not cover
    the sidecar's stored bytes or parts over :data:`MAX_PART_BYTES`; the sidecar's own errors
    (F-READ-1) as :func:`decode_sidecar` raises them. The caller checks identity (the key,
    the model)."""
    if len(raw) > MAX_COMMIT_RECORD_BYTES:
        raise FormatError(f"{obj} is {len(raw):,} bytes, longer than any commit record")
    if not raw.startswith(REMOTE_MAGIC + b":"):
        raise FormatError(f"{obj} is not a stratastore commit record (magic {raw[:4]!r})")
    m = _HEAD.match(raw)
    if m is None:
        raise FormatError(f"{obj} has a malformed head (SRC1:<32 hex>:<parts>:<part bytes>:)")
    parts, part_bytes = int(m[2]), int(m[3])
    if not MIN_PART_BYTES <= part_bytes <= MAX_PART_BYTES:
        raise FormatError(
            f"{obj} names parts of {part_bytes:,} bytes, outside the "
            f"{MIN_PART_BYTES:,}..{MAX_PART_BYTES:,} allowed"
        )
    sc = decode_sidecar(raw[m.end() :], obj, keys=keys, unchecked=unchecked)
    if parts != -(-sc.stored_bytes // part_bytes):
        raise FormatError(
            f"{obj} is damaged: {parts} parts of {part_bytes} bytes for "
            f"{sc.stored_bytes} stored bytes"
        )
    return CommitRecord(m[1].decode(), parts, part_bytes, sc)
