"""The model fingerprint: what makes K/V bytes of one model unusable by another (spec F-FP).

The fingerprint is a fixed 84-byte record embedded in every sidecar. Its digest is the first
link of every key's hash chain (spec F-KEY-1), so two models never share a key, and a reader
opened with another fingerprint refuses the files instead of restoring foreign bytes.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import SupportsIndex

import blake3

from stratastore.format.errors import FormatError, IncompatibleFingerprint

__all__ = [
    "FINGERPRINT",
    "DType",
    "KVLayout",
    "ModelFingerprint",
]

# model_digest, extra_digest, n_layers, n_kv_heads, head_dim, page_tokens, dtype, kv_layout, pad
FINGERPRINT = struct.Struct("<32s32sIIIIBB2x")
assert FINGERPRINT.size == 84

_FP_DOMAIN = b"strata-fp-v1\x00"

# Geometry bounds (spec F-FP-3): generous for any real model, small enough that a product of
# them cannot overflow or size a hostile allocation.
MAX_LAYERS = 4096
MAX_KV_HEADS = 4096
MAX_HEAD_DIM = 65536
MAX_PAGE_TOKENS = 1 << 20
MAX_PAGE_BYTES = 1 << 31


class DType(IntEnum):
    """Element type of the K/V cache (spec F-FP-2). Values are frozen."""

    FLOAT16 = 1
    BFLOAT16 = 2
    FLOAT32 = 3
    FLOAT8_E4M3 = 4
    FLOAT8_E5M2 = 5
    INT8 = 6

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.FLOAT32 else 1 if self.value >= 4 else 2


class KVLayout(IntEnum):
    """Order of the K/V elements inside one page (spec F-SEG-4). Values are frozen."""

    #: for each layer: K then V, each ``[page_tokens, n_kv_heads, head_dim]``
    LAYER_KV_TOKEN_HEAD_DIM = 1


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """Identity of the bytes a model produces (spec F-FP-1).

    ``model_id`` names the weights (for example ``"meta-llama/Llama-3.1-8B@<revision>"``);
    ``extra`` is any further engine-defined identity that changes the bytes (RoPE scaling,
    quantisation parameters). Both are stored only as BLAKE3 digests.
    """

    model_digest: bytes
    extra_digest: bytes
    n_layers: int
    n_kv_heads: int
    head_dim: int
    page_tokens: int
    dtype: DType
    kv_layout: KVLayout = KVLayout.LAYER_KV_TOKEN_HEAD_DIM

    @classmethod
    def create(
        cls,
        model_id: str,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        page_tokens: int,
        dtype: DType | str = DType.FLOAT16,
        extra: bytes = b"",
    ) -> ModelFingerprint:
        """Build and validate a fingerprint from a model's description. An argument of the
        wrong type (``extra="text"``, ``n_layers="32"``) is a :class:`FormatError` naming it
        and what it takes, like one out of range; a numpy integer counts as an integer."""
        if not isinstance(model_id, str):
            raise FormatError(
                f"ModelFingerprint.create: model_id={_arg(model_id)} must be a "
                'str naming the weights ("org/model@revision")'
            )
        if not isinstance(extra, (bytes, bytearray, memoryview)):
            fix = f"; pass {_arg(extra)}.encode()" if isinstance(extra, str) else ""
            raise FormatError(
                f"ModelFingerprint.create: extra={_arg(extra)} must be bytes (the "
                f'engine\'s further identity, e.g. b"rope=yarn"){fix}'
            )
        if isinstance(dtype, str):
            try:
                dtype = DType[dtype.upper()]
            except KeyError:
                allowed = ", ".join(d.name.lower() for d in DType)
                raise FormatError(f"dtype {dtype!r} is not known; use one of {allowed}") from None
        elif not isinstance(dtype, DType):
            allowed = ", ".join(d.name.lower() for d in DType)
            raise FormatError(
                f"ModelFingerprint.create: dtype={_arg(dtype)} must be a DType or "
                f"the name of one ({allowed})"
            )
        fp = cls(
            model_digest=blake3.blake3(model_id.encode()).digest(),
            extra_digest=blake3.blake3(extra).digest(),
            n_layers=_count("n_layers", n_layers),
            n_kv_heads=_count("n_kv_heads", n_kv_heads),
            head_dim=_count("head_dim", head_dim),
            page_tokens=_count("page_tokens", page_tokens),
            dtype=dtype,
        )
        fp.validate()
        return fp

    def validate(self) -> None:
        """Raise :class:`FormatError` unless every field is in range (spec F-FP-3)."""
        checks = (
            ("n_layers", self.n_layers, MAX_LAYERS),
            ("n_kv_heads", self.n_kv_heads, MAX_KV_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            ("page_tokens", self.page_tokens, MAX_PAGE_TOKENS),
        )
        for name, value, bound in checks:
            if not 1 <= value <= bound:
                raise FormatError(f"model fingerprint: {name}={value} is outside 1..{bound}")
        if len(self.model_digest) != 32 or len(self.extra_digest) != 32:
            raise FormatError("model fingerprint: digests must be 32 bytes")
        if self.page_bytes > MAX_PAGE_BYTES:
            raise FormatError(
                f"model fingerprint: a page of {self.page_tokens} tokens is {self.page_bytes} "
                f"bytes, over the {MAX_PAGE_BYTES}-byte limit; use fewer page_tokens"
            )

    @property
    def token_bytes(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one full K/V page (spec F-SEG-3)."""
        return self.page_tokens * self.token_bytes

    def pack(self) -> bytes:
        return FINGERPRINT.pack(
            self.model_digest,
            self.extra_digest,
            self.n_layers,
            self.n_kv_heads,
            self.head_dim,
            self.page_tokens,
            int(self.dtype),
            int(self.kv_layout),
        )

    @classmethod
    def unpack(cls, raw: bytes) -> ModelFingerprint:
        """Parse and validate an 84-byte record; raise :class:`FormatError` on any bad field."""
        if len(raw) != FINGERPRINT.size:
            raise FormatError(f"model fingerprint: {len(raw)} bytes, expected {FINGERPRINT.size}")
        md, xd, layers, heads, dim, ptok, dtype, layout = FINGERPRINT.unpack(raw)
        try:
            dt, lay = DType(dtype), KVLayout(layout)
        except ValueError:
            raise FormatError(
                f"model fingerprint: unknown dtype code {dtype} or layout code {layout}"
            ) from None
        fp = cls(md, xd, layers, heads, dim, ptok, dt, lay)
        fp.validate()
        return fp

    def digest(self) -> bytes:
        """The 32-byte identity used as the root of every key chain (spec F-KEY-1)."""
        return blake3.blake3(_FP_DOMAIN + self.pack()).digest()

    def describe(self) -> str:
        return (
            f"model {self.model_digest.hex()[:12]} ({self.n_layers} layers x "
            f"{self.n_kv_heads} kv heads x {self.head_dim} dims, {self.dtype.name.lower()}, "
            f"{self.page_tokens} tokens/page)"
        )

    def differences(self, other: ModelFingerprint) -> list[str]:
        """What tells ``other`` from this fingerprint: each differing field as ``"name:
        other's vs this"`` (a digest as its first 12 hex digits), in field order."""
        names = {"model_digest": "model id digest", "extra_digest": "architecture digest"}
        out = []
        for f in (
            "model_digest",
            "extra_digest",
            "n_layers",
            "n_kv_heads",
            "head_dim",
            "page_tokens",
            "dtype",
            "kv_layout",
        ):
            a, b = getattr(other, f), getattr(self, f)
            if a != b:
                out.append(f"{names.get(f, f)}: {_shown(a)} vs {_shown(b)}")
        return out

    def require_same(self, other: ModelFingerprint, obj: str) -> None:
        """Raise :class:`IncompatibleFingerprint` naming ``obj`` unless ``other == self``; the
        message names the fields that differ (two configs of one model id describe alike)."""
        if other != self:
            raise IncompatibleFingerprint(
                f"{obj} was written for {other.describe()}, but this store is opened for "
                f"{self.describe()} (written vs this: {'; '.join(self.differences(other))}); "
                "open it with the model that wrote it, or use another "
                "directory for this model"
            )


def _arg(value: object) -> str:
    """An argument as a message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _count(name: str, value: object) -> int:
    """A geometry argument of :meth:`ModelFingerprint.create` as an int (a numpy integer is
    one; a bool, a float or a string is not): the range is :meth:`~ModelFingerprint.validate`'s."""
    if isinstance(value, SupportsIndex) and not isinstance(value, bool):
        return operator.index(value)
    raise FormatError(
        f"ModelFingerprint.create: {name}={_arg(value)} must be an integer "
        f"({type(value).__name__} given)"
    )


def _shown(value: object) -> str:
    """A fingerprint field for a message: a digest's first 12 hex digits, an enum's name."""
    if isinstance(value, bytes):
        return value.hex()[:12]
    if isinstance(value, (DType, KVLayout)):
        return value.name.lower()
    return str(value)
