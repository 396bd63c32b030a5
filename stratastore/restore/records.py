"""What a two-pass restore reads and reports (:mod:`.two_pass`, :mod:`.delivery`).

A restore reads a prefix given as consecutive :class:`Piece` s (one segment each, from token
0). Its read pass hands out validated :class:`Chunk` s in token order, then at most one
:class:`Damage` where it stopped (spec F-SC-3: a page whose BLAKE3 digest differs from its
sidecar's, or a segment missing, short, unreadable or truncated under the read); the apply pass
settles the :class:`Outcome`. A damaged image with the ladder turned off raises
:class:`RestoreFailed` and delivers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stratastore.errors import StrataError
from stratastore.format import ChecksumMismatch, FormatError
from stratastore.io.errors import StrataIOError
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.staging import StagingPool

__all__ = [
    "DAMAGE",
    "DEFAULT_CHUNK",
    "Chunk",
    "Damage",
    "Outcome",
    "Piece",
    "RestoreFailed",
    "corrupt",
]

DEFAULT_CHUNK = 16 << 20
#: what a read finds in a damaged image: the ladder stops there (anything else is raised)
DAMAGE = (FormatError, ChecksumMismatch, StrataIOError, SegmentNotFound)


def corrupt(e: BaseException) -> bool:
    """Whether a read's error says the stored bytes are wrong (not an I/O error, not a gap)."""
    return isinstance(e, (FormatError, ChecksumMismatch))


class RestoreFailed(StrataError):
    """A damaged image with the ladder turned off: nothing was delivered to the caller."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One segment of a prefix: tokens ``[start, end)``, found in ``store`` (None: missing)."""

    start: int
    end: int
    key: bytes
    store: SegmentBackend | None


@dataclass
class Outcome:
    tokens: int  #: tokens now in the destination, all validated
    wanted: int
    first_bad: int | None = None  #: token of the first damaged page (None: no damage)
    reason: str | None = None
    damaged: list[bytes] = field(default_factory=list)  #: keys for fsck
    #: of ``damaged``, the keys whose stored bytes are wrong (a page failing its digest, a
    #: record that does not decode), not a read that failed or a segment gone
    corrupt: list[bytes] = field(default_factory=list)
    read_s: float = 0.0  #: seconds spent reading and validating (the read passes)
    apply_s: float = 0.0  #: seconds spent copying into the destination (the apply passes)

    @property
    def laddered(self) -> bool:
        return self.first_bad is not None


@dataclass
class Chunk:
    """Validated tokens ``[lo, hi)`` of one piece (``lo`` on a page of the piece; ``hi`` on a
    page or the piece's end): their bytes in ``data`` (memory the read pass owns: staging, whose
    pool buffer is ``staging``, or decompressed pages; it may run on past ``hi``), or, with
    ``data`` None, already in the destination: a direct read placed ``placed`` tokens from
    ``lo`` there (``placed >= hi - lo``: what it placed past ``hi`` failed or was not wanted,
    and is zeroed unless delivered)."""

    piece: Piece
    lo: int
    hi: int
    data: Any  #: host bytes (numpy), device staging, or None
    staging: Any = None
    placed: int = 0
    read_s: float = 0.0
    pool: StagingPool | None = None  #: where ``staging`` goes back (None: the host's STAGING)


@dataclass(frozen=True)
class Damage:
    """Where the read pass stopped: the first bad token, why, and the damaged segment."""

    at: int
    reason: str
    key: bytes
    corrupt: bool = False  #: the stored bytes are wrong (not a read that failed, not a gap)
