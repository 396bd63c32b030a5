"""The two-pass streaming restore and the prefix restore ladder (seed 000, issue 5).

**Read pass**: map each segment of the prefix in order and hash every page it needs against its
sidecar (spec F-SC-3), writing nothing to the caller. It stops at the first page that fails, or
at a segment that is missing, short or unreadable. **Apply pass**: copy the validated pages into
the destination in bounded chunks (``chunk_bytes``, 16 MiB by default), from the same mappings
the read pass validated (segments are immutable, spec F-DUR-7).

**Ladder**: when the read pass found damage at token ``t``, the restore does not fail; it applies
the deepest resume point at or below ``t`` (``resume_at(t)``: the deepest checkpoint for models
with running state, the deepest whole page for attention-only ones), reports how far it got and
why, and names the damaged segments for fsck. With ``ladder=False`` damage raises
:class:`RestoreFailed`. Every applied page was validated: the caller never gets a byte that
failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

import numba_kernels

from ..errors import StrataError
from ..format import ChecksumMismatch, FormatError, ModelFingerprint
from ..io.errors import StrataIOError
from ..store import SegmentNotFound, SegmentStore
from .destinations import Destination

__all__ = ["Job", "Outcome", "Piece", "RestoreFailed", "Validated", "two_pass_restore"]

DEFAULT_CHUNK = 16 << 20


class RestoreFailed(StrataError):
    """A damaged image with the ladder turned off: nothing was written to the caller."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One segment of a prefix: tokens ``[start, end)``, found in ``store`` (None: missing)."""

    start: int
    end: int
    key: bytes
    store: SegmentStore | None


@dataclass
class Outcome:
    tokens: int  #: tokens now in the destination, all validated
    wanted: int
    first_bad: int | None = None  #: token of the first damaged page (None: no damage)
    reason: str | None = None
    damaged: list[bytes] = field(default_factory=list)  #: keys for fsck
    read_s: float = 0.0  #: seconds of the read (validation) pass
    apply_s: float = 0.0  #: seconds of the apply (copy) pass

    @property
    def laddered(self) -> bool:
        return self.first_bad is not None


def two_pass_restore(
    pieces: Sequence[Piece],
    wanted: int,
    dest: Destination,
    fp: ModelFingerprint,
    *,
    resume_at: Callable[[int], int],
    ladder: bool = True,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> Outcome:
    """Restore tokens ``[0, wanted)`` from ``pieces`` (consecutive, from token 0) into ``dest``."""
    job = Job(pieces, wanted, dest, fp, resume_at, ladder, chunk_bytes)
    job.check_capacity()
    return job.apply(job.read())


@dataclass
class Validated:
    """What a read pass hands its apply pass: the outcome so far and the validated payloads
    (mappings or decompressed arrays), in token order."""

    out: Outcome
    ready: list[tuple[Piece, npt.NDArray[np.uint8]]]


@dataclass(frozen=True)
class Job:
    """One restore: the arguments of :func:`two_pass_restore`, and its two passes (the batched
    agenda runs the passes of several jobs on different threads)."""

    pieces: Sequence[Piece]
    wanted: int
    dest: Destination
    fp: ModelFingerprint
    resume_at: Callable[[int], int]
    ladder: bool = True
    chunk_bytes: int = DEFAULT_CHUNK

    def check_capacity(self) -> None:
        if self.wanted > self.dest.capacity():
            raise StrataError(f"restore: the destination holds {self.dest.capacity():,} tokens, "
                              f"{self.wanted:,} are wanted")  # fmt: skip

    def prefetch(self) -> None:
        """Hand the segment files this job reads to the kernel's read-ahead."""
        for p in self.pieces:
            if p.store is not None and p.start < self.wanted:
                p.store.prefetch(p.key)

    def read(self) -> Validated:
        """The read pass: validate every page of ``[0, wanted)`` against its sidecar, touching
        no caller buffer. Stops at the first bad page, or at a missing, short or unreadable
        segment."""
        pt = self.fp.page_tokens
        out = Outcome(0, self.wanted)
        ready: list[tuple[Piece, npt.NDArray[np.uint8]]] = []
        t0 = time.perf_counter()
        for piece in self.pieces:
            if piece.start >= self.wanted:
                break
            need = min(piece.end, self.wanted) - piece.start
            try:
                if piece.store is None:
                    raise SegmentNotFound(f"segment {piece.key.hex()[:16]} is in no level")
                payload, bad = _validated(piece, need, self.fp)
            except (FormatError, ChecksumMismatch, StrataIOError, SegmentNotFound) as e:
                out.first_bad, out.reason = piece.start, str(e)
                out.damaged.append(piece.key)
                break
            ready.append((piece, payload))
            if bad is not None:
                out.first_bad = piece.start + bad * pt
                out.reason = (f"page {bad} of segment {piece.key.hex()[:16]} failed BLAKE3 "
                              "validation")  # fmt: skip
                out.damaged.append(piece.key)
                break
        out.read_s = time.perf_counter() - t0
        return Validated(out, ready)

    def apply(self, validated: Validated) -> Outcome:
        """The apply pass: copy the validated pages into ``dest`` in chunks of ``chunk_bytes``:
        all of them, or, after damage, those below ``resume_at(first_bad)`` (the ladder;
        ``ladder=False`` raises :class:`RestoreFailed` instead and writes nothing)."""
        out, pt, tb = validated.out, self.fp.page_tokens, self.fp.token_bytes
        t1 = time.perf_counter()
        limit = out.wanted
        if out.first_bad is not None:
            if not self.ladder:
                raise RestoreFailed(
                    f"restore stopped at token {out.first_bad:,}: {out.reason}; nothing was "
                    "copied (turn the ladder on to restore the valid prefix)"
                )
            limit = min(self.resume_at(out.first_bad), out.first_bad)
        chunk_tokens = max(pt, self.chunk_bytes // (pt * tb) * pt)
        for piece, payload in validated.ready:
            if piece.start >= limit:
                break
            n = min(piece.end, limit) - piece.start
            if piece.start + n < piece.end and n % pt:
                n -= n % pt  # stop on a whole page: a partial page is not laid out as a prefix
            for off in range(0, n, chunk_tokens):
                m = min(chunk_tokens, n - off)
                self.dest.write_pages(piece.start + off, m, payload[off * tb : (off + m) * tb],
                                      pt)  # fmt: skip
            out.tokens = piece.start + n
        out.apply_s = time.perf_counter() - t1
        return out


def _validated(piece: Piece, need: int, fp: ModelFingerprint
               ) -> tuple[npt.NDArray[np.uint8], int | None]:  # fmt: skip
    """The segment's pages (mapped, or decompressed) and the first bad page among the ones
    covering ``need`` tokens (None when they all match)."""
    assert piece.store is not None
    pages = -(-need // fp.page_tokens)
    sc, payload = piece.store.read_pages(piece.key, pages)
    if sc.token_end - sc.token_start != piece.end - piece.start or sc.token_start != piece.start:
        raise FormatError(
            f"segment {piece.key.hex()[:16]} holds tokens [{sc.token_start}, {sc.token_end}), "
            f"its manifest says [{piece.start}, {piece.end})"
        )
    nbytes = min(pages * sc.page_bytes, sc.payload_bytes)
    expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)[:pages]
    actual = numba_kernels.page_hashes(payload[:nbytes], sc.page_bytes)
    bad = np.flatnonzero((actual != expected).any(axis=1))
    return payload, (int(bad[0]) if bad.size else None)
