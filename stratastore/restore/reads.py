"""The read pass's reads: ``pread`` into memory the process owns, hash those very bytes.

DESIGN "Delivered means validated": a restore hashes the bytes it delivers, in the memory it
delivers them from (a staging buffer, or the destination itself), and never reads a file
mapping; a failed or short read is a typed error here, never a signal later (spec F-SC-3).

Reading and hashing run on a thread pool, one thread a CPU, in groups of whole pages: a group
is read and then hashed by one thread (``pread`` and BLAKE3 both release the GIL), so the bytes
are hashed while they are still in that core's cache, and on a cold segment one thread waits
for the disk while the other hashes. A read is started (:func:`start_hashed`,
:func:`start_scattered`, :func:`start_plain`) and collected later (:class:`Reading`), so the
read pass builds the next chunk's reads while the pool works on the last one's. Ahead of each
chunk the read pass asks for the :data:`AHEAD_CHUNKS` after it (:func:`read_ahead`), so a cold
segment's disk reads run while the chunks before are hashed; the asking is done on a thread of
its own and skips what is resident (:mod:`stratastore.io.read_ahead`: a ``WILLNEED`` hint
blocks the thread that makes it on a busy device, docs/performance.md "Validated reads at the
disk's rate").
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np
import numpy.typing as npt

import numba_kernels
from stratastore.io.system import after_fork_in_child, cpu_count
from stratastore.levels.backend import OpenSegment

__all__ = [
    "AHEAD_CHUNKS",
    "READS_AHEAD",
    "Reading",
    "read_ahead",
    "read_hashed",
    "read_plain",
    "read_scattered_hashed",
    "start_hashed",
    "start_plain",
    "start_scattered",
]

#: chunks past the one being read that the read pass asks to be read ahead (page cache only)
AHEAD_CHUNKS = 4
_GROUP_BYTES = 4 << 20  #: bytes read and hashed by one task (whole pages, at least one)
#: bytes a task reads before it hashes them (whole pages, at least one): within a core's cache
_CACHED_BYTES = 1 << 20
#: chunks whose reads are in flight past the one the read pass checks (direct reads: no
#: staging held), so the pool's threads have the next chunk's groups when one chunk's end
READS_AHEAD = 1
_pool: ThreadPoolExecutor | None = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        workers = max(1, min(cpu_count(), 8))
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="strata-read")
    return _pool


def _forget_pool() -> None:
    """A forked child has none of the parent's threads: it starts a pool of its own."""
    global _pool
    _pool = None


after_fork_in_child(_forget_pool)


def read_ahead(seg: OpenSegment, offset: int, chunk: int, end: int) -> None:
    """Before the read pass reads the chunk of ``chunk`` bytes at ``offset`` of the segment's
    stored payload: ask for the :data:`AHEAD_CHUNKS` chunks after it to be read ahead (none
    past ``end``), and at the first chunk (``offset`` 0) for that chunk too, so each byte is
    asked for once. A hint, never raises, never waits (:meth:`OpenSegment.advise`)."""
    a = offset + AHEAD_CHUNKS * chunk if offset else 0
    b = min(end, offset + (1 + AHEAD_CHUNKS) * chunk)
    if a < b:
        seg.advise(a, b - a)


class Reading:
    """A read and its hashing submitted to the pool in groups of whole pages (:func:`start_hashed`,
    :func:`start_scattered`, :func:`start_plain`): the caller goes on (builds the next chunk's
    reads) while the pool's threads read and hash, and collects the result later, once."""

    def __init__(self, futures: list[Future[None]], digests: npt.NDArray[np.uint8]) -> None:
        self._futures = futures
        self._digests = digests

    def result(self) -> npt.NDArray[np.uint8]:
        """Wait for every group; the ``(pages, 32)`` digests of the pages as the memory read
        into now holds them (none for a plain read), or the first group's error, raised only
        once no read into that memory is still running (an interrupt too)."""
        _settle(self._futures)
        for f in self._futures:
            f.result()
        return self._digests

    def cancel(self) -> None:
        """Groups not started never start (those running go on: :meth:`drop` waits for them)."""
        for f in self._futures:
            f.cancel()

    def drop(self) -> None:
        """Abandon the read: groups not started never start, and this returns once the running
        ones ended (their errors ignored), so the memory read into may be given back or zeroed."""
        self.cancel()
        _settle(self._futures)


def start_hashed(
    seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int
) -> Reading:
    """Start filling ``buf`` with the segment's payload from byte ``offset`` (a page boundary)
    and hashing each ``page_bytes`` page of ``buf`` as it then holds it (the last may be
    short). The result's errors: the read's typed errors
    (:class:`~stratastore.io.errors.StrataIOError`, :class:`~stratastore.io.errors.ShortRead`)."""
    n_pages = -(-buf.size // page_bytes)
    out = np.empty((n_pages, numba_kernels.DIGEST_BYTES), dtype=np.uint8)
    key = seg.sidecar.hasher.key

    step = max(1, _CACHED_BYTES // page_bytes)  # pages read, then hashed, at a time

    def run(lo: int, hi: int) -> None:
        for r0 in range(lo, hi, step):
            r1 = min(r0 + step, hi)
            a, b = r0 * page_bytes, min(r1 * page_bytes, buf.size)
            seg.read_into(buf[a:b], offset + a)
            for i in range(r0, r1):
                page = buf[i * page_bytes : min((i + 1) * page_bytes, buf.size)]
                out[i] = np.frombuffer(numba_kernels.hash_page(page.data, key), np.uint8)

    return Reading(_submit(run, n_pages, max(1, _GROUP_BYTES // page_bytes)), out)


def start_plain(
    seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int
) -> Reading:
    """Start filling ``buf`` with the segment's payload from byte ``offset``, hashing nothing:
    for a reader that validates the bytes elsewhere (the device path hashes them on the GPU,
    :mod:`.device`). Errors as :func:`start_hashed`."""

    def run(lo: int, hi: int) -> None:
        a, b = lo * page_bytes, min(hi * page_bytes, buf.size)
        seg.read_into(buf[a:b], offset + a)

    n_pages = -(-buf.size // page_bytes)
    futures = _submit(run, n_pages, max(1, _GROUP_BYTES // page_bytes))
    return Reading(futures, np.empty((0, numba_kernels.DIGEST_BYTES), dtype=np.uint8))


def start_scattered(
    seg: OpenSegment, pages: list[list[memoryview]], page_bytes: int, first: int = 0
) -> Reading:
    """Start scattering the segment's pages ``first..first+len(pages)-1`` into the caller's
    memory (page ``first + i`` into the buffers ``pages[i]``, in turn: a destination's own
    layout) and hashing each page as those buffers then hold it. Errors as
    :func:`start_hashed`."""
    out = np.empty((len(pages), numba_kernels.DIGEST_BYTES), dtype=np.uint8)
    hasher = seg.sidecar.hasher

    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            seg.readv_into(pages[i], (first + i) * page_bytes)
            h = hasher.new()  # the reference hash of the page kernels, fed piece by piece
            for piece in pages[i]:
                h.update(piece)
            out[i] = np.frombuffer(h.digest(), np.uint8)

    return Reading(_submit(run, len(pages), max(1, _GROUP_BYTES // page_bytes)), out)


def read_hashed(
    seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int
) -> npt.NDArray[np.uint8]:
    """:func:`start_hashed`, waited for: the digests, or its error."""
    return start_hashed(seg, buf, offset, page_bytes).result()


def read_plain(seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int) -> None:
    """:func:`start_plain`, waited for."""
    start_plain(seg, buf, offset, page_bytes).result()


def read_scattered_hashed(
    seg: OpenSegment, pages: list[list[memoryview]], page_bytes: int, first: int = 0
) -> npt.NDArray[np.uint8]:
    """:func:`start_scattered`, waited for: the digests, or its error."""
    return start_scattered(seg, pages, page_bytes, first).result()


def _submit(run: Callable[[int, int], None], n: int, per: int) -> list[Future[None]]:
    """``run(lo, hi)`` over ``[0, n)`` in groups of ``per``, on the pool (inline for one
    group: a done future holding its result or error)."""
    groups = [(lo, min(lo + per, n)) for lo in range(0, n, per)]
    if len(groups) > 1:
        futures: list[Future[None]] = []
        try:
            for lo, hi in groups:
                futures.append(_get_pool().submit(run, lo, hi))
        except BaseException:  # interrupted between two: what was submitted ends first
            for started in futures:
                started.cancel()
            _settle(futures)
            raise
        return futures
    done: list[Future[None]] = []
    for lo, hi in groups:
        f: Future[None] = Future()
        try:
            run(lo, hi)
            f.set_result(None)
        except Exception as e:  # an interrupt is raised here, as any inline call's
            f.set_exception(e)
        done.append(f)
    return done


def _settle(futures: list[Future[None]]) -> None:
    """Return once every future has ended; interrupted (Ctrl-C) while waiting, cancel those
    not started and wait for the running ones first (no read may land after this raises)."""
    try:
        wait(futures)
    except BaseException:
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()  # waits for a running group to end; its error is not ours now
        raise
