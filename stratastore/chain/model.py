"""The checkpoint-chain model of a conversation.

A conversation is its token ids (with media at positions) and a chain of checkpoints at
ascending token lengths: the first is the *root* (the end of the system prompt), pinned; the last
is the *newest*. A checkpoint is a point the engine can resume from; for hybrid or recurrent
models it carries the running state saved there (``state_bytes`` > 0), for attention-only models
it carries none and every whole K/V page is a resume point as well (see ``prefix_index``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from stratastore.errors import ConfigError
from stratastore.format.keys import SegmentKey, key_chain

__all__ = [
    "Checkpoint",
    "Conversation",
    "InvalidRequest",
    "Tokens",
    "as_media",
    "as_tokens",
    "page_floor",
]

Tokens = npt.NDArray[np.uint32]


class InvalidRequest(ConfigError):
    """An argument of a lookup or restore (the prompt's token ids, its media, the requests of a
    batch) that cannot be used as given; nothing was read, written or taken."""


def as_tokens(
    tokens: Sequence[int] | npt.NDArray[np.integer],
    what: str = "prompt",
    error: type[ConfigError] = InvalidRequest,
) -> Tokens:
    """Token ids as a uint32 array, refusing anything but a one-dimensional sequence of integer
    ids in 0..2**32-1 (spec F-KEY-3) with ``error`` naming ``what``."""
    try:
        arr = np.asarray(tokens)
    except (TypeError, ValueError) as e:  # ragged nesting, objects numpy cannot hold
        raise error(f"{what}: token ids cannot be read as integers ({e})") from None
    if arr.ndim != 1:
        raise error(
            f"{what}: token ids must be one-dimensional, got shape {arr.shape} of "
            f"{type(tokens).__name__}; pass a list or 1-D array of ints"
        )
    if arr.size and arr.dtype.kind not in "iu":
        raise error(
            f"{what}: token ids must be integers in 0..2**32-1 (spec F-KEY-3); got "
            f"{arr.dtype} values"
        )
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 2**32):
        raise error(
            f"{what}: token ids must be integers in 0..2**32-1 (spec F-KEY-3); got ids "
            f"from {int(arr.min())} to {int(arr.max())}"
        )
    return np.ascontiguousarray(arr, dtype=np.uint32)


def as_media(
    media: object, n_tokens: int, what: str = "media", error: type[ConfigError] = InvalidRequest
) -> dict[int, bytes]:
    """``media`` (``None``, or a mapping of each picture's token position to its 32-byte
    digest, spec F-KEY-4) checked against a prompt of ``n_tokens``: a position that is not an
    integer within the tokens, or a digest that is not 32 bytes, raises ``error`` naming it (a
    wrong digest would silently match nothing)."""
    if media is None:
        return {}
    if not isinstance(media, Mapping):
        raise error(
            f"{what} must be a mapping of token position to 32-byte digest, not "
            f"{type(media).__name__}"
        )
    out: dict[int, bytes] = {}
    for pos, digest in media.items():
        if isinstance(pos, (bool, np.bool_)) or not isinstance(pos, (int, np.integer)):
            raise error(
                f"{what}: position {pos!r} is {type(pos).__name__}, not an integer token position"
            )
        if not 0 <= int(pos) < n_tokens:
            raise error(f"{what}: position {int(pos)} is not within the {n_tokens} tokens")
        raw = bytes(digest) if isinstance(digest, (bytes, bytearray, memoryview)) else None
        if raw is None or len(raw) != 32:
            size = "a" if raw is None else f"{len(raw)}-byte"
            raise error(
                f"{what}: the digest at {int(pos)} is {size} {type(digest).__name__}, "
                "not a 32-byte digest (spec F-KEY-4)"
            )
        out[int(pos)] = raw
    return out


@dataclass
class Checkpoint:
    """A resume point at ``length`` tokens."""

    length: int
    state_bytes: int = 0  #: running state saved here (0 for attention-only layouts)
    pinned: bool = False  #: never a retention victim and never truncated away (shared prefix)
    tail: bool = False  #: the engine's --prompt-cache-tail checkpoint: the first to go
    last_used: int = 0  #: LRU clock tick of its creation or its last resume


@dataclass
class Conversation:
    """One conversation: its tokens, media and checkpoint chain (ascending, root first)."""

    conv_id: str
    tokens: Tokens
    checkpoints: list[Checkpoint]
    media: dict[int, bytes] = field(default_factory=dict)  #: absolute position -> digest
    cuts: list[int] = field(default_factory=list)  #: segment starts (message openers), 0 first

    def __post_init__(self) -> None:
        lengths = [c.length for c in self.checkpoints]
        if not lengths or lengths != sorted(set(lengths)):
            raise ConfigError(f"conversation {self.conv_id}: checkpoints must ascend, root first")
        if lengths[0] < 0 or lengths[-1] > len(self.tokens):
            raise ConfigError(
                f"conversation {self.conv_id}: checkpoint at {lengths[-1]} is past its "
                f"{len(self.tokens)} tokens"
            )
        self.media = as_media(
            self.media, len(self.tokens), f"conversation {self.conv_id}: media", ConfigError
        )
        if not self.cuts:
            self.cuts = [0]
        if self.cuts[0] != 0 or self.cuts != sorted(set(self.cuts)):
            raise ConfigError(f"conversation {self.conv_id}: segment cuts must ascend from 0")

    @property
    def root(self) -> Checkpoint:
        return self.checkpoints[0]

    @property
    def newest(self) -> Checkpoint:
        return self.checkpoints[-1]

    def lengths(self) -> list[int]:
        return [c.length for c in self.checkpoints]

    def truncate_to(self, length: int) -> None:
        """Keep the prefix ``[0, length)`` and the checkpoints at or below it (the
        park-truncate landing: K/V past it, deeper checkpoints and their states go)."""
        if length not in self.lengths():
            raise ConfigError(f"conversation {self.conv_id}: no checkpoint at {length}")
        self.tokens = self.tokens[:length]
        self.checkpoints = [c for c in self.checkpoints if c.length <= length]
        self.media = {p: d for p, d in self.media.items() if p < length}
        self.cuts = [c for c in self.cuts if c < length] or [0]

    def page_floor(self, x: int, page_tokens: int) -> int:
        return page_floor(self.cuts, x, page_tokens)

    def boundaries(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each K/V segment: cut at ``cuts`` and at every checkpoint."""
        bounds = sorted({*self.cuts, *(c.length for c in self.checkpoints), len(self.tokens)})
        return list(itertools.pairwise(bounds))

    def segment_keys(self, root: bytes) -> list[SegmentKey]:
        """Each segment of :meth:`boundaries` with its parent key, its media (offsets within
        the segment) and its key, chained from ``root`` (the model fingerprint's digest): the
        one derivation (:func:`~stratastore.format.keys.key_chain`, spec F-KEY-2, F-KEY-7) that
        the disk writer files segments and sidecars under and that manifests are checked
        against (F-CHAIN-2). Equal prefixes, with equal media, cut alike get equal keys in
        every conversation."""
        return key_chain(root, self.tokens, self.media.items(), self.boundaries())

    def segments(self, root: bytes) -> list[tuple[int, int, bytes]]:
        """``(start, end, key)`` of each segment of :meth:`segment_keys`."""
        return [(s.start, s.end, s.key) for s in self.segment_keys(root)]

    def checkpoint_keys(self, root: bytes) -> dict[int, bytes]:
        """The token-prefix key at each checkpoint length (the root key at length 0)."""
        at = {end: key for _, end, key in self.segments(root)}
        at[0] = root
        return {c.length: at[c.length] for c in self.checkpoints}


def page_floor(cuts: Sequence[int], x: int, page_tokens: int) -> int:
    """The last whole-page boundary at or below ``x``: pages start at each segment cut (the
    K/V of a segment is stored in pages of ``page_tokens`` from the segment's start)."""
    start = cuts[bisect.bisect_right(cuts, x) - 1]
    return start + (x - start) // page_tokens * page_tokens
