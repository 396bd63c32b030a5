"""The read pass's reads: ``pread`` into memory the process owns, hash those very bytes.

DESIGN "Delivered means validated": a restore hashes the bytes it delivers, in the memory it
delivers them from (a staging buffer, or the destination itself), and never reads a file
mapping; a failed or short read is a typed error here, never a signal later (spec F-SC-3).

Reading and hashing run on a small thread pool in groups of whole pages (``pread`` and BLAKE3
both release the GIL), so on N cores the kernel copies one group while the others are hashed.
Ahead of each chunk the read pass asks the kernel for the :data:`AHEAD_CHUNKS` after it
(:func:`read_ahead`), so a cold segment's disk reads run while the chunk before is hashed and
the reads here mostly copy from the page cache.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np
import numpy.typing as npt

import numba_kernels
from stratastore.io.system import after_fork_in_child, cpu_count
from stratastore.levels.backend import OpenSegment

__all__ = ["AHEAD_CHUNKS", "read_ahead", "read_hashed", "read_plain", "read_scattered_hashed"]

_GROUP_BYTES = 4 << 20  #: bytes read and hashed by one task (whole pages, at least one)
#: chunks past the one being read that the read pass asks the kernel for (page cache only)
AHEAD_CHUNKS = 2
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
    stored payload: ask the kernel for the :data:`AHEAD_CHUNKS` chunks after it (none past
    ``end``), and at the first chunk (``offset`` 0) for that chunk too. Each byte is asked for
    once (asking costs a page-cache lookup a page, resident or not). A hint, never raises."""
    a = offset + AHEAD_CHUNKS * chunk if offset else 0
    b = min(end, offset + (1 + AHEAD_CHUNKS) * chunk)
    if a < b:
        seg.advise(a, b - a)


def read_hashed(
    seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int
) -> npt.NDArray[np.uint8]:
    """Fill ``buf`` with the segment's payload from byte ``offset`` (a page boundary) and return
    the ``(pages, 32)`` BLAKE3 digests of the ``page_bytes`` pages of ``buf`` as it now holds
    them (the last may be short). Raises the read's typed error
    (:class:`~stratastore.io.errors.StrataIOError`, :class:`~stratastore.io.errors.ShortRead`)
    only once no read into ``buf`` is still running."""
    n_pages = -(-buf.size // page_bytes)
    out = np.empty((n_pages, numba_kernels.DIGEST_BYTES), dtype=np.uint8)
    per = max(1, _GROUP_BYTES // page_bytes)
    key = seg.sidecar.hasher.key

    def run(lo: int, hi: int) -> None:
        a, b = lo * page_bytes, min(hi * page_bytes, buf.size)
        seg.read_into(buf[a:b], offset + a)
        for i in range(lo, hi):
            page = buf[i * page_bytes : min((i + 1) * page_bytes, buf.size)]
            out[i] = np.frombuffer(numba_kernels.hash_page(page.data, key), np.uint8)

    _run_groups(run, n_pages, per)
    return out


def read_plain(seg: OpenSegment, buf: npt.NDArray[np.uint8], offset: int, page_bytes: int) -> None:
    """Fill ``buf`` with the segment's payload from byte ``offset``, hashing nothing: for a
    reader that validates the bytes elsewhere (the device path hashes them on the GPU,
    :mod:`.device`). Errors as :func:`read_hashed`, raised once no read is still running."""

    def run(lo: int, hi: int) -> None:
        a, b = lo * page_bytes, min(hi * page_bytes, buf.size)
        seg.read_into(buf[a:b], offset + a)

    _run_groups(run, -(-buf.size // page_bytes), max(1, _GROUP_BYTES // page_bytes))


def read_scattered_hashed(
    seg: OpenSegment, pages: list[list[memoryview]], page_bytes: int, first: int = 0
) -> npt.NDArray[np.uint8]:
    """Scatter the segment's pages ``first..first+len(pages)-1`` into the caller's memory (page
    ``first + i`` into the buffers ``pages[i]``, in turn: a destination's own layout) and return the
    ``(pages, 32)`` BLAKE3 digests of each page as those buffers now hold it. Errors as
    :func:`read_hashed`, raised once no read is still running."""
    out = np.empty((len(pages), numba_kernels.DIGEST_BYTES), dtype=np.uint8)
    hasher = seg.sidecar.hasher

    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            seg.readv_into(pages[i], (first + i) * page_bytes)
            h = hasher.new()  # the reference hash of the page kernels, fed piece by piece
            for piece in pages[i]:
                h.update(piece)
            out[i] = np.frombuffer(h.digest(), np.uint8)

    _run_groups(run, len(pages), max(1, _GROUP_BYTES // page_bytes))
    return out


def _run_groups(run: Callable[[int, int], None], n: int, per: int) -> None:
    """``run(lo, hi)`` over ``[0, n)`` in groups of ``per`` on the pool (inline for one
    group); returns, or raises the first group's error, once every group has ended."""
    groups = [(lo, min(lo + per, n)) for lo in range(0, n, per)]
    if len(groups) <= 1:
        for lo, hi in groups:
            run(lo, hi)
        return
    futures: list[Future[None]] = [_get_pool().submit(run, lo, hi) for lo, hi in groups]
    try:
        wait(futures)  # every read has ended before an error is raised (no late write into buf)
    except BaseException:  # interrupted (Ctrl-C): no read may land after this returns
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()  # waits for a running group to end; its error is not ours now
        raise
    for f in futures:
        f.result()
