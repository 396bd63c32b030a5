"""LMCache chunks as stratastore segments, with no I/O and no torch or lmcache import: the
stored key of an LMCache chunk key, the byte layout of a chunk, the plugin's counters.

**Stored key** (stable across processes and machines; never Python's ``hash()``)::

    chunk id   = BLAKE3("strata-lmcache-key-v1\\0" || model_name || u64 world_size
                        || i64 worker_id || chunk_hash || dtype || i64 layer_id
                        || u32 tag count || (tag name || tag value) per tag)
    stored key = state_key(chunk id)                                (spec F-KEY-5)

where a string is ``u32 length || UTF-8``; ``chunk_hash`` is ``u8 0 || string(decimal)`` for
an int (LMCache's builtin or vLLM's hash) and ``u8 1 || u32 length || bytes`` for bytes;
``dtype`` is ``str(torch.dtype)``; ``layer_id`` is -1 for a whole-chunk key (a
``LayerCacheEngineKey`` carries its own); tags are in the key's order (LMCache compares them
in order) and a tag value is ``str(value)``. The chunk hash itself is LMCache's: without vLLM it
comes from Python's ``hash()``, so engines in different processes agree on it only with one
``PYTHONHASHSEED`` (or vLLM's ``sha256_cbor`` hashes).

**A chunk** is one running-state segment (kind STATE: opaque bytes in pages of 1 MiB, each
BLAKE3-hashed in its sidecar, spec F-SC) whose payload is the chunk's memory object byte for
byte. What those bytes mean, the **layout** (LMCache's memory format, one shape and dtype per
KV group with the token dimension marked), is the directory's: recorded once, durably, at the
first put, as a STATE segment of its own at :data:`LAYOUT_ID` (:meth:`ChunkLayout.encode`),
and a chunk's token count is its payload bytes over :attr:`ChunkLayout.bytes_per_token`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields

import blake3

from stratastore.format import FormatError

__all__ = [
    "LAYOUT_ID",
    "ChunkLayout",
    "KeyFields",
    "PluginCounters",
    "chunk_id",
]

_KEY_DOMAIN = b"strata-lmcache-key-v1\x00"
_LAYOUT_DOMAIN = b"strata-lmcache-layout-v1\x00"
_LAYOUT_VERSION = 1
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
assert (_U32.size, _U64.size, _I64.size) == (4, 8, 8)

#: the id of the directory's layout record (no chunk key maps to it: another domain)
LAYOUT_ID = blake3.blake3(_LAYOUT_DOMAIN).digest()


@dataclass(frozen=True, slots=True)
class KeyFields:
    """The fields of an LMCache ``CacheEngineKey`` (or ``LayerCacheEngineKey``) that identify
    a chunk: what :func:`chunk_id` hashes."""

    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int | bytes
    dtype: str  #: ``str(torch.dtype)``, e.g. ``"torch.float16"``
    layer_id: int = -1  #: -1: a whole-chunk key
    tags: tuple[tuple[str, str], ...] = ()


def _string(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return _U32.pack(len(raw)) + raw


def chunk_id(k: KeyFields) -> bytes:
    """The 32-byte id of the chunk ``k`` (the module docstring's derivation); it is stored as
    the segment ``state_key(chunk id)``. :class:`~stratastore.format.FormatError` for a field
    out of range."""
    if not 0 <= k.world_size < 2**64 or not -(2**63) <= k.worker_id < 2**63:
        raise FormatError(
            f"LMCache key of {k.model_name!r}: world_size {k.world_size} or "
            f"worker_id {k.worker_id} is out of range"
        )
    if not -(2**63) <= k.layer_id < 2**63:
        raise FormatError(f"LMCache key of {k.model_name!r}: layer_id {k.layer_id} is out of range")
    h = blake3.blake3(_KEY_DOMAIN)
    h.update(_string(k.model_name))
    h.update(_U64.pack(k.world_size))
    h.update(_I64.pack(k.worker_id))
    if isinstance(k.chunk_hash, bytes):
        h.update(b"\x01" + _U32.pack(len(k.chunk_hash)) + k.chunk_hash)
    else:
        h.update(b"\x00" + _string(str(int(k.chunk_hash))))
    h.update(_string(k.dtype))
    h.update(_I64.pack(k.layer_id))
    h.update(_U32.pack(len(k.tags)))
    for name, value in k.tags:
        h.update(_string(name) + _string(value))
    return h.digest()


@dataclass(frozen=True, slots=True)
class ChunkLayout:
    """What the bytes of every chunk in a directory mean: LMCache's memory format (``fmt``, a
    ``MemoryFormat`` name), and per KV group its dtype (``str(torch.dtype)``), item size and
    shape with the token dimension (``token_dim``) set to 0."""

    fmt: str
    token_dim: int
    dtypes: tuple[str, ...]
    itemsizes: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(
        cls,
        fmt: str,
        token_dim: int,
        dtypes: Sequence[str],
        itemsizes: Sequence[int],
        shapes: Sequence[Sequence[int]],
    ) -> tuple[ChunkLayout, int]:
        """The layout of a memory object with these groups, and its token count; a
        :class:`~stratastore.format.FormatError` when the groups disagree on it, or a shape
        has no dimension ``token_dim``."""
        if not shapes or len({len(shapes), len(dtypes), len(itemsizes)}) != 1:
            raise FormatError(f"a chunk of {len(shapes)} shapes and {len(dtypes)} dtypes")
        if any(not 0 <= token_dim < len(s) for s in shapes):
            raise FormatError(
                f"format {fmt}: token dimension {token_dim} is outside the shapes "
                f"{[list(s) for s in shapes]}"
            )
        counts = {int(s[token_dim]) for s in shapes}
        if len(counts) != 1 or min(counts) < 1:
            raise FormatError(
                f"format {fmt}: the groups' shapes {[list(s) for s in shapes]} "
                "disagree on the token count"
            )
        marked = tuple(
            tuple(0 if i == token_dim else int(d) for i, d in enumerate(s)) for s in shapes
        )
        layout = cls(fmt, token_dim, tuple(dtypes), tuple(int(i) for i in itemsizes), marked)
        layout.check()
        return layout, counts.pop()

    def check(self) -> None:
        """:class:`~stratastore.format.FormatError` unless every field is in range."""
        groups = len(self.shapes)
        if not (1 <= groups <= 64 and len(self.dtypes) == groups == len(self.itemsizes)):
            raise FormatError(f"chunk layout: {groups} shapes, {len(self.dtypes)} dtypes")
        for s, size in zip(self.shapes, self.itemsizes, strict=True):
            if not 0 <= self.token_dim < len(s) <= 8 or not 1 <= size <= 16:
                raise FormatError(
                    f"chunk layout: shape {list(s)} (token dimension "
                    f"{self.token_dim}) or item size {size} is out of "
                    "range"
                )
            if any(not 1 <= d < 2**31 for i, d in enumerate(s) if i != self.token_dim):
                raise FormatError(f"chunk layout: shape {list(s)} has a dimension out of range")

    @property
    def bytes_per_token(self) -> int:
        total = 0
        for s, size in zip(self.shapes, self.itemsizes, strict=True):
            per = size
            for i, d in enumerate(s):
                per *= 1 if i == self.token_dim else d
            total += per
        return total

    def shapes_for(self, tokens: int) -> list[tuple[int, ...]]:
        """Each group's shape for a chunk of ``tokens`` tokens."""
        return [
            tuple(tokens if i == self.token_dim else d for i, d in enumerate(s))
            for s in self.shapes
        ]

    def tokens_for(self, payload_bytes: int) -> int | None:
        """The token count of a chunk of ``payload_bytes``; None when it is no whole count."""
        n, rest = divmod(payload_bytes, self.bytes_per_token)
        return n if n >= 1 and not rest else None

    def encode(self) -> bytes:
        """The layout record's payload: UTF-8 JSON, keys sorted (one text per layout)."""
        doc = {
            "version": _LAYOUT_VERSION,
            "fmt": self.fmt,
            "token_dim": self.token_dim,
            "dtypes": list(self.dtypes),
            "itemsizes": list(self.itemsizes),
            "shapes": [list(s) for s in self.shapes],
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, name: str) -> ChunkLayout:
        """The layout a record holds; :class:`~stratastore.format.FormatError` naming
        ``name`` for anything else."""
        try:
            doc = json.loads(raw.decode())
            if doc["version"] != _LAYOUT_VERSION:
                raise FormatError(
                    f"{name}: chunk layout version {doc['version']} is not "
                    f"{_LAYOUT_VERSION}; use a stratastore that reads "
                    "it"
                )
            layout = cls(
                str(doc["fmt"]),
                int(doc["token_dim"]),
                tuple(str(d) for d in doc["dtypes"]),
                tuple(int(i) for i in doc["itemsizes"]),
                tuple(tuple(int(d) for d in s) for s in doc["shapes"]),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{name}: not a chunk layout record ({e})") from None
        layout.check()
        return layout


@dataclass
class PluginCounters:
    """What the plugin counts (one definition: :meth:`as_dict` and the Prometheus text are
    generated from these fields)."""

    puts: int = 0  #: chunks committed (durable)
    put_bytes: int = 0  #: their payload bytes
    puts_deduped: int = 0  #: puts of a chunk already stored or in flight (nothing written)
    puts_refused: int = 0  #: puts not stored: over the budget with nothing evictable, layout
    put_errors: int = 0  #: puts whose write failed (reported by ``flush``)
    hits: int = 0  #: chunks delivered (validated)
    hit_bytes: int = 0
    misses: int = 0  #: gets of a chunk not stored (or removed meanwhile)
    damaged: int = 0  #: chunks whose files failed validation: a miss, logged, and removed
    read_errors: int = 0  #: gets that failed otherwise (I/O error, closing): a miss, kept
    alloc_failures: int = 0  #: gets LMCache's allocator had no memory for (a miss)
    removes: int = 0  #: chunks removed by LMCache (``remove``, ``clear``)
    evictions: int = 0  #: chunks evicted, oldest first, to stay within the budget

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
