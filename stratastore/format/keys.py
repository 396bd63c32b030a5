"""Key derivation: the token-prefix hash chain (spec F-KEY).

``key(segment) = BLAKE3(domain || parent || u64 token_count || u32 token ids || u32 media_count
|| (u32 offset, 32-byte hash) per media item)``, where ``parent`` is the previous segment's key or,
for the first segment, the model fingerprint's digest. Equal token prefixes (with equal media at
equal positions, under one model) get equal keys in every conversation, which is what lets
conversations share stored prefixes (spec F-KEY-2).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import blake3
import numpy as np
import numpy.typing as npt

from stratastore.format.errors import FormatError

__all__ = [
    "KEY_BYTES",
    "MediaRef",
    "SegmentKey",
    "chain_keys",
    "key_chain",
    "segment_key",
    "segment_media",
    "state_key",
]

KEY_BYTES = 32
_KEY_DOMAIN = b"strata-key-v1\x00"
_STATE_DOMAIN = b"strata-state-v1\x00"
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_MEDIA = struct.Struct("<I32s")
assert _MEDIA.size == 36

#: A picture (or other media) at ``offset`` tokens into the segment, identified by its digest.
MediaRef = tuple[int, bytes]


def _token_bytes(tokens: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise FormatError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= 2**32):
        raise FormatError("token ids must be integers in 0..2**32-1 (spec F-KEY-3)")
    return arr.astype("<u4", copy=False).tobytes()


def segment_key(
    parent: bytes,
    tokens: Sequence[int] | npt.NDArray[np.integer],
    media: Sequence[MediaRef] = (),
) -> bytes:
    """Key of the segment holding ``tokens`` after the prefix whose key is ``parent``."""
    if len(parent) != KEY_BYTES:
        raise FormatError(f"parent key must be {KEY_BYTES} bytes, got {len(parent)}")
    tok = _token_bytes(tokens)
    n = len(tok) // 4
    h = blake3.blake3(_KEY_DOMAIN)
    h.update(parent)
    h.update(_U64.pack(n))
    h.update(tok)
    h.update(_U32.pack(len(media)))
    last = -1
    for offset, digest in media:
        if not 0 <= offset < max(n, 1) or offset < last or len(digest) != 32:
            raise FormatError(
                "media refs must be (offset within the segment, 32-byte digest) in ascending "
                "offset order (spec F-KEY-4)"
            )
        last = offset
        h.update(_MEDIA.pack(offset, digest))
    return h.digest()


def chain_keys(
    root: bytes,
    tokens: Sequence[int] | npt.NDArray[np.integer],
    cuts: Sequence[int],
) -> list[bytes]:
    """Keys of consecutive segments of ``tokens`` cut at the ascending positions ``cuts``.

    ``root`` is the fingerprint digest; ``cuts`` end each segment (the last must be
    ``len(tokens)``). Media-free convenience over :func:`segment_key`.
    """
    keys: list[bytes] = []
    parent, start = root, 0
    for end in cuts:
        if not start < end <= len(tokens):
            raise FormatError(f"segment cuts must ascend within the tokens, got {list(cuts)}")
        parent = segment_key(parent, tokens[start:end])
        keys.append(parent)
        start = end
    return keys


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """One K/V segment of a conversation as every writer and checker must see it (spec
    F-KEY-2, F-KEY-4, F-CHAIN-2): its token range, its parent's key, its media at offsets
    within the segment, and its key. A segment's sidecar carries exactly ``media`` and is
    filed under ``key``; a manifest lists ``(start, end, key)``."""

    start: int
    end: int
    parent: bytes
    media: tuple[MediaRef, ...]
    key: bytes


def segment_media(media: Iterable[tuple[int, bytes]], start: int, end: int) -> tuple[MediaRef, ...]:
    """The media items of the segment ``[start, end)`` at offsets within it (spec F-KEY-7): an
    item at absolute position ``p`` belongs to the segment with ``start <= p < end`` and has
    offset ``p - start``; ``media`` is ``(absolute position, digest)`` pairs in any order."""
    return tuple((p - start, d) for p, d in sorted(media) if start <= p < end)


def key_chain(
    root: bytes,
    tokens: Sequence[int] | npt.NDArray[np.integer],
    media: Iterable[tuple[int, bytes]],
    bounds: Iterable[tuple[int, int]],
) -> list[SegmentKey]:
    """The segments ``bounds`` (``(start, end)`` pairs tiling ``[0, len(tokens))`` in order) of
    a conversation with ``tokens`` and ``media`` (absolute positions), keyed by the hash chain
    from ``root``, the fingerprint digest (spec F-KEY-1, F-KEY-2, F-KEY-7).

    This is the one derivation of segment keys and their media: the writer files each segment
    under its ``key`` with its ``media`` in the sidecar, and a reader checks a manifest's keys
    against it (spec F-CHAIN-2). Raises :class:`FormatError` when ``bounds`` do not tile the
    tokens or an input is out of range (F-KEY-3, F-KEY-4).
    """
    items = sorted(media)
    if items and not 0 <= items[0][0] <= items[-1][0] < len(tokens):
        raise FormatError(
            f"media positions must lie within the {len(tokens)} tokens (spec F-KEY-4)"
        )
    out: list[SegmentKey] = []
    parent, pos = root, 0
    for start, end in bounds:
        if start != pos or not start < end <= len(tokens):
            raise FormatError(
                f"segment bounds must tile the {len(tokens)} tokens from 0 in order, got "
                f"[{start}, {end}) after {pos}"
            )
        seg_media = segment_media(items, start, end)
        key = segment_key(parent, tokens[start:end], seg_media)
        out.append(SegmentKey(start, end, parent, seg_media, key))
        parent, pos = key, end
    return out


def state_key(checkpoint_key: bytes) -> bytes:
    """Key of the running-state blob stored at a checkpoint (spec F-KEY-5)."""
    if len(checkpoint_key) != KEY_BYTES:
        raise FormatError(f"checkpoint key must be {KEY_BYTES} bytes, got {len(checkpoint_key)}")
    return blake3.blake3(_STATE_DOMAIN + checkpoint_key).digest()
