"""The two-pass streaming restore and the prefix restore ladder (seed 000, issue 5).

**Read pass**: read each segment of the prefix in order into memory this process owns (a
reusable staging buffer, decompressed pages, or, for a ``read_direct`` destination, the
destination's own memory) and hash every page it needs there against its sidecar (spec F-SC-3). It
stops at the first page that fails, or at a segment that is missing, short, unreadable, or
truncated under the read (a typed error, never a SIGBUS: files are never mapped). **Apply
pass**: copy the validated pages into the destination in bounded chunks (``chunk_bytes``, 16 MiB
by default) from that same memory (DESIGN "Delivered means validated": the bytes hashed are the
bytes delivered, so a file changed between the passes cannot reach the caller).

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
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

import numba_kernels

from ..errors import StrataError
from ..format import ChecksumMismatch, Codec, FormatError, ModelFingerprint
from ..io.errors import StrataIOError
from ..levels.backend import OpenSegment, SegmentBackend
from ..store import SegmentNotFound
from ..store.staging import STAGING
from .destinations import Destination, FlatKV, _PerToken
from .reads import read_hashed, read_scattered_hashed

__all__ = ["Job", "Outcome", "Piece", "Ready", "RestoreFailed", "Validated", "two_pass_restore"]

DEFAULT_CHUNK = 16 << 20


class RestoreFailed(StrataError):
    """A damaged image with the ladder turned off: nothing was written to the caller."""


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
class Ready:
    """One piece's validated pages, from the piece's first token: in ``data`` (memory the read
    pass owns: staging or decompressed pages; ``staging`` is the pool buffer to give back), or,
    with ``data`` None, already in the destination (a direct read of ``placed`` tokens)."""

    piece: Piece
    data: npt.NDArray[np.uint8] | None
    staging: npt.NDArray[np.uint8] | None = None
    placed: int = 0


@dataclass
class Validated:
    """What a read pass hands its apply pass: the outcome so far and the validated pages of
    each piece, in token order (see :class:`Ready`)."""

    out: Outcome
    ready: list[Ready]


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
    #: where a segment lives now: a segment another process moved down (or whose level the
    #: job was built with no longer holds it) is looked for again once before it counts as
    #: missing (issue 12: a move is not damage)
    locate: Callable[[bytes], SegmentBackend | None] | None = None

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
        """The read pass: read every page of ``[0, wanted)`` into memory this process owns and
        validate it there against its sidecar (spec F-SC-3). Stops at the first bad page, or at
        a segment that is missing, short, unreadable or truncated under the read. Writes no
        caller buffer, except a ``read_direct`` destination (the bytes land in place; the apply
        pass zeroes what it does not deliver)."""
        pt = self.fp.page_tokens
        v = Validated(Outcome(0, self.wanted), [])
        out = v.out
        t0 = time.perf_counter()
        try:
            for piece in self.pieces:
                if piece.start >= self.wanted:
                    break
                need = min(piece.end, self.wanted) - piece.start
                try:
                    bad = self._read_moved(piece, need, v)
                except (FormatError, ChecksumMismatch, StrataIOError, SegmentNotFound) as e:
                    out.first_bad, out.reason = piece.start, str(e)
                    out.damaged.append(piece.key)
                    break
                if bad is not None:
                    out.first_bad = piece.start + bad * pt
                    out.reason = (f"page {bad} of segment {piece.key.hex()[:16]} failed BLAKE3 "
                                  "validation")  # fmt: skip
                    out.damaged.append(piece.key)
                    break
        except BaseException:
            self.discard(v)  # an unexpected failure delivers nothing
            raise
        out.read_s = time.perf_counter() - t0
        return v

    def _read_moved(self, piece: Piece, need: int, v: Validated) -> int | None:
        """:meth:`_read_piece`, looking once more (``locate``) for a segment not where the job
        found it: ``SegmentNotFound`` is raised when opening, before anything is read."""
        try:
            if piece.store is None:
                raise SegmentNotFound(f"segment {piece.key.hex()[:16]} is in no level")
            return self._read_piece(piece, need, v)
        except SegmentNotFound:
            store = self.locate(piece.key) if self.locate is not None else None
            if store is None or store is piece.store:
                raise
            return self._read_piece(replace(piece, store=store), need, v)

    def _direct(self) -> FlatKV | _PerToken | None:
        """The destination, when the read pass may read straight into it (``read_direct``)."""
        d = self.dest
        return d if isinstance(d, FlatKV | _PerToken) and d.read_direct else None

    def _read_piece(self, piece: Piece, need: int, v: Validated) -> int | None:
        """Read and hash the pages of ``piece`` covering ``need`` tokens, appending their
        :class:`Ready` to ``v``; the first bad page (None: all match)."""
        assert piece.store is not None
        pt = self.fp.page_tokens
        pages = -(-need // pt)
        with piece.store.open_reader(piece.key) as seg:
            sc = seg.sidecar
            if sc.token_start != piece.start or sc.n_tokens != piece.end - piece.start:
                raise FormatError(
                    f"segment {piece.key.hex()[:16]} holds tokens [{sc.token_start}, "
                    f"{sc.token_end}), its manifest says [{piece.start}, {piece.end})"
                )
            expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)[:pages]
            nbytes = min(pages * sc.page_bytes, sc.payload_bytes)
            direct = self._direct()
            if sc.codec is not Codec.RAW:
                data = seg.pages(pages)  # decompressed into new memory, hashed there
                actual = numba_kernels.page_hashes(data[:nbytes], sc.page_bytes)
                v.ready.append(Ready(piece, data))
            elif direct is not None:
                actual = self._read_direct(seg, piece, need, nbytes, direct, v)
            else:
                staging = STAGING.take(nbytes)
                v.ready.append(Ready(piece, staging[:nbytes], staging))
                actual = read_hashed(seg, staging[:nbytes], 0, sc.page_bytes)
        bad = np.flatnonzero((actual != expected).any(axis=1))
        return int(bad[0]) if bad.size else None

    def _read_direct(self, seg: OpenSegment, piece: Piece, need: int, nbytes: int,
                     dest: FlatKV | _PerToken, v: Validated) -> npt.NDArray[np.uint8]:  # fmt: skip
        """Read the pages the apply pass may deliver straight into ``dest`` (every page up to
        ``need``, the segment's short last page included: one region of a :class:`FlatKV`, or
        scattered into per-layer rows) and hash them there; a page cut by ``need`` goes through
        a one-page staging buffer, hashed and never delivered. Their digests."""
        pt, pb = self.fp.page_tokens, seg.sidecar.page_bytes
        start, placed = piece.start, need if piece.start + need == piece.end else need // pt * pt
        v.ready.append(Ready(piece, None, None, placed))  # zeroed by apply unless delivered
        if isinstance(dest, FlatKV):
            digests = [read_hashed(seg, dest.region(start, placed), 0, pb)]
        else:
            views = [dest.page_views(t, min(pt, start + placed - t))
                     for t in range(start, start + placed, pt)]  # fmt: skip
            digests = [read_scattered_hashed(seg, views, pb)]
        done = placed * self.fp.token_bytes
        if done < nbytes:
            tail = STAGING.take(nbytes - done)
            try:
                digests.append(read_hashed(seg, tail[: nbytes - done], done, pb))
            finally:
                STAGING.give(tail)
        return np.concatenate(digests)

    def apply(self, validated: Validated) -> Outcome:
        """The apply pass: copy the validated pages into ``dest`` in chunks of ``chunk_bytes``:
        all of them, or, after damage, those below ``resume_at(first_bad)`` (the ladder;
        ``ladder=False`` raises :class:`RestoreFailed` instead and delivers nothing). Bytes a
        direct read placed past what is delivered are zeroed."""
        out = validated.out
        t1 = time.perf_counter()
        try:
            limit = out.wanted
            if out.first_bad is not None:
                if not self.ladder:
                    raise RestoreFailed(
                        f"restore stopped at token {out.first_bad:,}: {out.reason}; nothing was "
                        "copied (turn the ladder on to restore the valid prefix)"
                    )
                limit = min(self.resume_at(out.first_bad), out.first_bad)
            self._copy(validated, limit)
        finally:
            self.discard(validated)
        out.apply_s = time.perf_counter() - t1
        return out

    def _copy(self, validated: Validated, limit: int) -> None:
        out, pt, tb = validated.out, self.fp.page_tokens, self.fp.token_bytes
        chunk_tokens = max(pt, self.chunk_bytes // (pt * tb) * pt)
        for r in validated.ready:
            piece = r.piece
            if piece.start >= limit:
                break
            n = min(piece.end, limit) - piece.start
            if piece.start + n < piece.end and n % pt:
                n -= n % pt  # stop on a whole page: a partial page is not laid out as a prefix
            data = r.data  # None: a direct read already placed these pages in the destination
            for off in range(0, n if data is not None else 0, chunk_tokens):
                m = min(chunk_tokens, n - off)
                assert data is not None
                self.dest.write_pages(piece.start + off, m, data[off * tb : (off + m) * tb], pt)
            out.tokens = piece.start + n

    def discard(self, validated: Validated) -> None:
        """Release what the read pass holds: give staging back, and zero the bytes a direct
        read placed in the destination past the tokens the outcome delivers (all of them for a
        job that is never applied, or that failed)."""
        keep = validated.out.tokens
        direct = self._direct()
        for r in validated.ready:
            if r.staging is not None:
                STAGING.give(r.staging)
                r.staging = r.data = None
            if direct is not None and r.placed:
                lo = max(r.piece.start, keep)
                if lo < r.piece.start + r.placed:
                    direct.zero(lo, r.piece.start + r.placed - lo)
                r.placed = 0
