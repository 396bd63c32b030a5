"""The two-pass streaming restore and the prefix restore ladder: the job and its read pass.

A restore walks its prefix in **chunks** of at most ``chunk_bytes`` (16 MiB by default, whole
pages of one segment; a compressed segment is decoded whole, one chunk), and each chunk goes
through the two passes:

- **read pass**: ``pread`` the chunk into memory this process owns (a staging buffer from the
  bounded pool, decompressed pages, or, for a destination with direct reads
  (:class:`~.capabilities.ScatterReads`: page views and ``zero``), the destination's own
  memory; for one on a device (:class:`~.capabilities.OnDevice`), device staging) and hash
  every page there against its sidecar (spec F-SC-3). It stops at the
  first page that fails, or at a segment that is missing, short, unreadable or truncated under
  the read (a typed error, never a SIGBUS: files are never mapped);
- **apply pass**: copy the chunk's validated pages into the destination from that same memory
  (DESIGN "Delivered means validated": the bytes hashed are the bytes delivered, so a file
  changed after its read cannot reach the caller).

:func:`~.agenda.restore_batch` runs the read pass of the next chunks on a worker thread while
the caller's thread applies the current one, so a cold restore reads, hashes and copies at once,
and memory is the destination plus a bounded number of chunks.

**Ladder**: when the read pass found damage at token ``t``, the restore does not fail; it
delivers the deepest resume point at or below ``t`` (``resume_at(t)``: the deepest checkpoint for
models with running state, the deepest whole page for attention-only ones), reports how far it
got and why, and names the damaged segments for fsck. ``resume_at`` is non-decreasing, so once
the pages up to ``v`` are validated, ``resume_at(v)`` tokens are delivered whatever comes later:
a destination that cannot ``zero`` gets a chunk as soon as it lies below that point, and
holds it (staged) until then. A destination that can (every one of :mod:`.destinations`) gets
each chunk as it validates; what turns out to lie past the prefix the restore reports (a ladder
stop, or damage with ``ladder=False``, which raises :class:`RestoreFailed` and delivers
nothing) is zeroed before the call returns. A read error inside a segment stops at the chunk it
hit. Every applied page was validated: the caller never gets a byte that failed.

This module is the job and its read pass; the records it hands out (:class:`Piece`,
:class:`Chunk`, :class:`Damage`, :class:`Outcome`) are in :mod:`.records`, the apply pass
(:class:`Delivery`) in :mod:`.delivery`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

import numba_kernels
from stratastore.errors import StrataError
from stratastore.format import Codec, Kind, ModelFingerprint
from stratastore.levels.backend import OpenSegment, SegmentBackend
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.reader import open_checked
from stratastore.levels.staging import STAGING, StagingPool
from stratastore.restore.capabilities import (
    Destination,
    ScatterReads,
    check_page_views,
    check_region,
    lives_on_device,
    scatter_reads,
)
from stratastore.restore.delivery import Delivery
from stratastore.restore.device import device_staging, stage_and_validate
from stratastore.restore.reads import (
    READS_AHEAD,
    Reading,
    read_ahead,
    read_plain,
    start_hashed,
    start_scattered,
)
from stratastore.restore.records import (
    DAMAGE,
    DEFAULT_CHUNK,
    Chunk,
    Damage,
    Outcome,
    Piece,
    RestoreFailed,
    corrupt,
)

__all__ = [
    "Chunk",
    "Damage",
    "Delivery",
    "Job",
    "Outcome",
    "Piece",
    "RestoreFailed",
    "two_pass_restore",
]


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
    """Restore tokens ``[0, wanted)`` from ``pieces`` (consecutive, from token 0) into ``dest``,
    streaming chunk by chunk (see the module docstring). Raises what the restore raised."""
    from stratastore.restore.agenda import (
        restore_batch,  # the agenda runs the passes of every restore
    )

    got = restore_batch([Job(pieces, wanted, dest, fp, resume_at, ladder, chunk_bytes)])[0]
    if isinstance(got, Exception):
        raise got
    return got


@dataclass(frozen=True)
class Job:
    """One restore: the arguments of :func:`two_pass_restore`. :meth:`chunks` is its read pass,
    chunk by chunk; a :class:`Delivery` applies what it validated (the agenda runs the two on
    different threads); :meth:`read` and :meth:`apply` run them one after the other, the whole
    prefix validated before anything is applied."""

    pieces: Sequence[Piece]
    wanted: int
    dest: Destination
    fp: ModelFingerprint
    resume_at: Callable[[int], int]
    ladder: bool = True
    chunk_bytes: int = DEFAULT_CHUNK
    #: where a segment lives now: a segment another process moved down (or whose level the
    #: job was built with no longer holds it) is looked for again once before it counts as
    #: missing (a segment moved between levels is not damage)
    locate: Callable[[bytes], SegmentBackend | None] | None = None

    def check_capacity(self) -> None:
        if self.wanted > self.dest.capacity():
            raise StrataError(
                f"restore: the destination holds {self.dest.capacity():,} tokens, "
                f"{self.wanted:,} are wanted"
            )

    def prefetch(self) -> None:
        """Hand the segment files this job reads to the kernel's read-ahead."""
        for p in self.pieces:
            if p.store is not None and p.start < self.wanted:
                p.store.prefetch(p.key)

    def nbytes(self) -> int:
        return self.wanted * self.fp.token_bytes

    # -- the read pass ------------------------------------------------------------------------
    def chunks(self) -> Generator[Chunk | Damage, None, None]:
        """The read pass, in token order: each :class:`Chunk` of ``[0, wanted)`` read into
        memory this process owns and validated there (spec F-SC-3), then at most one
        :class:`Damage` where it stopped: a bad page, a segment missing, short, unreadable or
        truncated under the read. Writes no caller buffer, except a ``read_direct``
        destination (its chunks say what they placed). A chunk handed out belongs to the
        taker (its staging goes back through :meth:`Delivery.take` or :func:`release`)."""
        for piece in self.pieces:
            if piece.start >= self.wanted:
                return
            need = min(piece.end, self.wanted) - piece.start
            try:
                yield from self._moved(piece, need)
            except _Stop as stop:
                yield stop.damage
                return
            except DAMAGE as e:  # before any chunk of the piece was handed out
                yield Damage(piece.start, str(e), piece.key, corrupt(e))
                return

    def _moved(self, piece: Piece, need: int) -> Iterator[Chunk]:
        """:meth:`_piece`, looking once more (``locate``) for a segment not where the job found
        it: ``SegmentNotFound`` is raised when opening, before any chunk is handed out."""
        try:
            if piece.store is None:
                raise SegmentNotFound(f"segment {piece.key.hex()[:16]} is in no level")
            yield from self._piece(piece, need)
        except SegmentNotFound:
            store = self.locate(piece.key) if self.locate is not None else None
            if store is None or store is piece.store:
                raise
            yield from self._piece(replace(piece, store=store), need)

    def direct(self) -> ScatterReads | None:
        """The destination, when the read pass may read straight into it (its capabilities:
        :func:`~.capabilities.scatter_reads`; asked once a job)."""
        return self._capabilities[0]

    @cached_property
    def _capabilities(
        self,
    ) -> tuple[ScatterReads | None, Callable[[int, int], object] | None, bool]:
        """What the destination can do, asked once: direct reads, a stored ``region`` for
        them (:class:`~.capabilities.StoredRegion`), and whether it lives on a device (the
        device path wins)."""
        direct = scatter_reads(self.dest)
        region = getattr(direct, "region", None)
        return direct, region if callable(region) else None, lives_on_device(self.dest)

    def _piece(self, piece: Piece, need: int) -> Iterator[Chunk]:
        """The validated chunks of ``piece`` covering ``need`` tokens; :class:`_Stop` at its
        first bad page, after the chunk of the pages before it. The segment is opened by
        :func:`~stratastore.levels.reader.open_checked`: an answer that is not the piece's
        segment (another key, model or token range) is damage before any byte is read."""
        assert piece.store is not None
        pt = self.fp.page_tokens
        pages = -(-need // pt)
        # the answer checked above the seam: its key, model, kind and tokens (F-READ-1)
        opened = open_checked(
            piece.store, piece.key, self.fp, kind=Kind.KV, tokens=(piece.start, piece.end)
        )
        with opened as seg:
            sc = seg.sidecar
            expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)[:pages]
            nbytes = min(pages * sc.page_bytes, sc.payload_bytes)
            on_device = self._capabilities[2]
            if on_device:
                yield from self._device(seg, piece, pages, nbytes, expected)
            elif sc.codec is not Codec.RAW:  # decompressed into new memory, hashed there
                t0 = time.perf_counter()
                data = seg.pages(pages)
                actual = numba_kernels.page_hashes(data[:nbytes], sc.page_bytes, key=sc.hasher.key)
                yield from self._checked(
                    piece, 0, len(actual), _first_bad(actual, expected), data, None, 0, t0
                )
            else:
                yield from self._raw(seg, piece, need, pages, nbytes, expected)

    def _raw(
        self,
        seg: OpenSegment,
        piece: Piece,
        need: int,
        pages: int,
        nbytes: int,
        expected: npt.NDArray[np.uint8],
    ) -> Iterator[Chunk]:
        """The read pass over a RAW segment, a chunk at a time. Into a direct destination the
        reads of :data:`READS_AHEAD` chunks are in flight past the one the read pass checks
        (their page views built on this thread meanwhile), so the pool's threads never wait
        for it between chunks; through staging one chunk is read at a time (the hand-off queue
        bounds the staging held). A chunk read but not handed out (damage before it, an
        error, an interrupt) is waited for, its staging given back and what it placed
        zeroed before this ends."""
        sc, pt = seg.sidecar, self.fp.page_tokens
        per = max(1, self.chunk_bytes // sc.page_bytes)  # pages a chunk reads
        placed = need if piece.start + need == piece.end else need // pt * pt
        ahead = READS_AHEAD if self._capabilities[0] is not None else 0
        flight: deque[_Flight] = deque()
        since = time.perf_counter()  # a chunk's read_s: from when the last one was taken
        try:
            for p0 in [*range(0, pages, per), pages]:  # the last: land what is in flight
                if p0 < pages:
                    read_ahead(seg, p0 * sc.page_bytes, per * sc.page_bytes, nbytes)
                    flight.append(self._start(seg, piece, p0, min(p0 + per, pages), placed, nbytes))
                while len(flight) > (ahead if p0 < pages else 0):
                    f = flight[0]  # it leaves the queue as it is handed out: until then an
                    actual = self._land(f, piece)  # interrupt or an error drops it below
                    bad = _first_bad(actual, expected[f.p0 : f.p1])
                    direct = self._capabilities[0]
                    if direct is not None and 0 <= bad * pt < f.placed:  # damage, or unfit?
                        self._fits(direct, piece, f.p0, f.p0 + bad, f.placed)
                    t0 = max(since, f.t0)
                    flight.popleft()
                    yield from self._checked(
                        piece, f.p0, f.p1 - f.p0, bad, f.data, f.staging, f.placed, t0
                    )
                    since = time.perf_counter()  # not the time the taker held this generator
        finally:
            while flight:
                self._drop(flight.popleft(), piece)

    def _start(
        self, seg: OpenSegment, piece: Piece, p0: int, p1: int, placed: int, nbytes: int
    ) -> _Flight:
        """Start reading and hashing pages ``[p0, p1)`` of ``piece``: straight into a direct
        destination (:meth:`_start_direct`), else into staging."""
        direct, t0 = self._capabilities[0], time.perf_counter()
        if direct is not None:
            return self._start_direct(seg, piece, p0, p1, placed, nbytes, direct, t0)
        pb = seg.sidecar.page_bytes
        a, b = p0 * pb, min(p1 * pb, nbytes)
        staging = STAGING.take(b - a)
        try:
            reading = start_hashed(seg, staging[: b - a], a, pb)
        except BaseException:
            STAGING.give(staging)
            raise
        return _Flight(p0, p1, t0, reading, staging[: b - a], staging)

    def _checked(
        self,
        piece: Piece,
        p0: int,
        n_pages: int,
        bad: int,
        data: Any,
        staging: Any,
        placed: int,
        t0: float,
        pool: StagingPool | None = None,
    ) -> Iterator[Chunk]:
        """The chunk of the ``n_pages`` pages ``p0..`` of ``piece``, whose first bad page is
        ``bad`` (-1: none): cut before it, then :class:`_Stop` there."""
        pt = self.fp.page_tokens
        lo = piece.start + p0 * pt
        hi = min(piece.start + (p0 + n_pages) * pt, piece.end)
        if data is None:
            hi = min(hi, lo + placed)  # a direct read places whole wanted pages only
        if bad >= 0:
            hi = min(hi, lo + bad * pt)
        yield Chunk(piece, lo, hi, data, staging, placed, time.perf_counter() - t0, pool)
        if bad >= 0:
            raise _Stop(
                Damage(
                    hi,
                    f"page {p0 + bad} of segment {piece.key.hex()[:16]} failed BLAKE3 validation",
                    piece.key,
                    True,
                )
            )

    def _device(
        self,
        seg: OpenSegment,
        piece: Piece,
        pages: int,
        nbytes: int,
        expected: npt.NDArray[np.uint8],
    ) -> Iterator[Chunk]:
        """The read pass into a device destination (:mod:`.device`): each chunk's pages read
        into pinned host staging (a compressed segment: decoded whole, one chunk), copied to
        device staging, hashed and checked there; the chunk's data is that device staging."""
        sc, pt = seg.sidecar, self.fp.page_tokens
        pinned, device = device_staging("pinned"), device_staging("device")
        raw = sc.codec is Codec.RAW
        per = max(1, self.chunk_bytes // sc.page_bytes) if raw else pages
        for p0 in range(0, pages, per):
            p1 = min(p0 + per, pages)
            a, b = p0 * sc.page_bytes, min(p1 * sc.page_bytes, nbytes)
            t0 = time.perf_counter()
            if raw:
                read_ahead(seg, a, per * sc.page_bytes, nbytes)
            host, staging = None, device.take(b - a)
            try:
                if raw:
                    host = pinned.take(b - a)
                    read_plain(seg, host[: b - a], a, sc.page_bytes)
                    data = host[: b - a]
                else:
                    data = seg.pages(pages)[:nbytes]
                bad = stage_and_validate(
                    data, staging[: b - a], expected[p0:p1], sc.page_bytes, sc.hasher.key
                )
            except BaseException as e:
                device.give(staging)
                if p0 and isinstance(e, DAMAGE):  # earlier chunks were handed out
                    raise _Stop(Damage(piece.start + p0 * pt, str(e), piece.key, corrupt(e))) from e
                raise
            finally:
                if host is not None:
                    pinned.give(host)
            yield from self._checked(
                piece, p0, p1 - p0, bad, staging[: b - a], staging, 0, t0, device
            )

    def _start_direct(
        self,
        seg: OpenSegment,
        piece: Piece,
        p0: int,
        p1: int,
        placed: int,
        nbytes: int,
        dest: ScatterReads,
        t0: float,
    ) -> _Flight:
        """Start reading pages ``[p0, p1)`` of ``piece`` straight into ``dest`` (its stored
        ``region`` in one read a group, or scattered into its ``page_views``, one ``preadv`` a
        page) and hashing them there: those of its first ``placed`` tokens (every wanted page,
        the segment's short last page included); a page cut by what is wanted goes through a
        one-page staging buffer, hashed and never delivered. A region of the wrong size raises
        :class:`~.capabilities.DestinationRefused` before anything is read."""
        pt, pb, tb = self.fp.page_tokens, seg.sidecar.page_bytes, self.fp.token_bytes
        a, b = p0 * pt, max(p0 * pt, min(p1 * pt, placed))  # tokens of the piece placed
        start, region = piece.start, self._capabilities[1]
        f = _Flight(p0, p1, t0, None, None, None, start + a)
        end = min(p1 * pb, nbytes)
        try:
            if b > a and region is not None:
                into = check_region(dest, region(start + a, b - a), start + a, b - a, self.fp)
                f.placed = b - a  # before any read lands: an interrupt zeroes what it placed
                f.reading = start_hashed(seg, into, a * tb, pb)
            elif b > a:
                f.views = [
                    dest.page_views(t, min(pt, start + b - t))
                    for t in range(start + a, start + b, pt)
                ]
                f.placed = b - a
                f.reading = start_scattered(seg, f.views, pb, p0)
            if b * tb < end:
                f.tail_staging = STAGING.take(end - b * tb)
                f.tail = start_hashed(seg, f.tail_staging[: end - b * tb], b * tb, pb)
        except BaseException:
            self._drop(f, piece)
            raise
        return f

    def _land(self, f: _Flight, piece: Piece) -> npt.NDArray[np.uint8]:
        """The digests of the chunk in flight ``f``, once its reads ended. A failed read gives
        its staging back and zeroes what it placed first (views that were not the page's
        raise :class:`~.capabilities.DestinationRefused` instead: the segment is not
        damaged); a damaged segment past the piece's first chunk stops the ladder there."""
        try:
            digests = [r.result() for r in (f.reading, f.tail) if r is not None]
        except BaseException as e:
            views, lo, end = f.views or [], f.lo, f.lo + f.placed
            self._drop(f, piece)
            pt, direct = self.fp.page_tokens, self._capabilities[0]
            for i, page in enumerate(views):  # a read that failed on views not the page's
                t = lo + i * pt
                assert direct is not None
                try:
                    check_page_views(direct, t, min(pt, end - t), self.fp, views=page)
                except StrataError as unfit:
                    raise unfit from e
            if f.p0 and isinstance(e, DAMAGE):  # earlier chunks were handed out
                at = piece.start + f.p0 * self.fp.page_tokens
                raise _Stop(Damage(at, str(e), piece.key, corrupt(e))) from e
            raise
        if f.tail_staging is not None:
            STAGING.give(f.tail_staging)
            f.tail_staging = None
        return digests[0] if len(digests) == 1 else np.concatenate(digests)

    def _drop(self, f: _Flight, piece: Piece) -> None:
        """Abandon the chunk in flight ``f``: wait for its reads, give its staging back and zero
        what it placed in the destination (never handed out, so never delivered). Safe to call
        twice. Each reading's groups have ended when its ``drop`` returns or raises (an
        interrupt while it waits: :func:`~.reads._settle` waits on before raising), so what
        follows runs after both, and the first interrupt is raised after it."""
        readings = [r for r in (f.reading, f.tail) if r is not None]
        for r in readings:
            r.cancel()
        error: BaseException | None = None
        for r in readings:
            try:
                r.drop()
            except BaseException as e:
                error = error or e
        for buf in (f.staging, f.tail_staging):
            if buf is not None:
                STAGING.give(buf)
        f.staging = f.tail_staging = f.data = None
        direct = self._capabilities[0]
        if direct is not None and f.placed:
            direct.zero(f.lo, f.placed)
        f.placed = 0
        if error is not None:
            raise error

    def _fits(self, dest: ScatterReads, piece: Piece, p0: int, page: int, placed: int) -> None:
        """Before page ``page`` of ``piece`` (read straight into ``dest`` from page ``p0``) is
        reported as failing its digest: :class:`~.capabilities.DestinationRefused` when the
        views ``dest`` gives for it are not the page (their bytes were not the stored page's,
        so the segment is not damaged), after zeroing the ``placed`` tokens from ``p0``."""
        pt = self.fp.page_tokens
        t = piece.start + page * pt
        try:
            if self._capabilities[1] is None:  # a region was checked before the read
                check_page_views(dest, t, min(pt, piece.end - t), self.fp)
        except StrataError:
            dest.zero(piece.start + p0 * pt, placed)
            raise

    # -- the two passes one after the other -----------------------------------------------------
    def read(self) -> Delivery:
        """The whole read pass, every chunk held (nothing applied): what :meth:`apply` takes."""
        d = Delivery(self, eager=False)
        try:
            for item in self.chunks():
                d.take(item)
        except BaseException:
            d.abort()  # an unexpected failure delivers nothing
            raise
        return d

    def apply(self, validated: Delivery) -> Outcome:
        """The apply pass of what :meth:`read` validated (see :meth:`Delivery.finish`)."""
        return validated.finish()

    def write(self, chunk: Chunk, n: int) -> None:
        """Copy the first ``n`` validated tokens of ``chunk`` into the destination, at most
        ``chunk_bytes`` a call."""
        pt, tb = self.fp.page_tokens, self.fp.token_bytes
        assert chunk.data is not None
        step = max(pt, self.chunk_bytes // (pt * tb) * pt)
        for off in range(0, n, step):
            m = min(step, n - off)
            self.dest.write_pages(chunk.lo + off, m, chunk.data[off * tb : (off + m) * tb], pt)


@dataclass(eq=False)
class _Flight:
    """A chunk of a RAW segment being read (:meth:`Job._raw`): pages ``[p0, p1)`` of its piece,
    started at ``t0``; ``reading`` into ``data`` (staging: ``staging``) or straight into the
    destination, where it places ``placed`` tokens from token ``lo`` (through ``views``, when
    scattered), and the page cut by what is wanted read into ``tail_staging``."""

    p0: int
    p1: int
    t0: float
    reading: Reading | None
    data: Any
    staging: Any
    lo: int = 0
    placed: int = 0
    views: list[list[memoryview]] | None = None
    tail: Reading | None = None
    tail_staging: Any = None


def _first_bad(actual: npt.NDArray[np.uint8], expected: npt.NDArray[np.uint8]) -> int:
    """The first page whose digest differs, or -1 (the host path's check)."""
    bad = np.flatnonzero((actual != expected).any(axis=1))
    return int(bad[0]) if bad.size else -1


class _Stop(Exception):
    """Raised inside the read pass at a bad page, after the chunk before it was handed out."""

    def __init__(self, damage: Damage) -> None:
        super().__init__(damage.reason)
        self.damage = damage
