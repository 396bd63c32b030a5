"""CPU paths of the page kernels: page hashing and validated copies (spec F-SC-3).

Hashing uses the ``blake3`` package (the reference implementation every kernel is tested
against). Pages are spread over a shared thread pool: both ``blake3`` and numpy copies release
the GIL, so on N cores N pages hash (and copy) at once. Every hashing function takes an
optional ``key``: the 32-byte key of a keyed level (BLAKE3's keyed mode, spec F-KEYED), which
is hashed here, on the CPU, only (the CUDA kernels hash plain BLAKE3).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import blake3
import numpy as np
import numpy.typing as npt

__all__ = [
    "DIGEST_BYTES",
    "hash_page",
    "page_hashes",
    "parallel_copy",
    "parallel_run",
    "start_page_hashes",
    "validated_copy",
]

DIGEST_BYTES = 32
#: pages are handed to workers in groups of about this many bytes (fewer tasks for tiny pages)
_TASK_BYTES = 4 << 20
_pool: ThreadPoolExecutor | None = None


def _workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="strata-page")
    return _pool


def _forget_pool() -> None:
    """A forked child has none of the parent's worker threads: start a fresh pool there."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def _as_bytes(buf: object) -> memoryview:
    view = memoryview(buf)  # type: ignore[arg-type]
    if not view.c_contiguous:
        raise ValueError("page buffers must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def hash_page(page: memoryview | bytes, key: bytes | None = None) -> bytes:
    """BLAKE3-256 of ``page``, keyed by ``key`` when given."""
    if key is None:
        return blake3.blake3(page).digest()
    return blake3.blake3(page, key=key).digest()


def _groups(n_pages: int, page_bytes: int) -> list[tuple[int, int]]:
    per = max(1, _TASK_BYTES // max(page_bytes, 1))
    return [(i, min(i + per, n_pages)) for i in range(0, n_pages, per)]


def page_hashes(buf: object, page_bytes: int, key: bytes | None = None) -> npt.NDArray[np.uint8]:
    """BLAKE3-256 (keyed by ``key`` when given) of each ``page_bytes`` page of ``buf`` (the
    last may be short) as an ``(n_pages, 32)`` uint8 array. An empty buffer has no pages."""
    return start_page_hashes(buf, page_bytes, key)()


def start_page_hashes(
    buf: object, page_bytes: int, key: bytes | None = None
) -> Callable[[], npt.NDArray[np.uint8]]:
    """Start hashing the pages of ``buf`` on the worker threads and return a function that
    waits for and returns the digests, so the caller can do other work (write the same bytes)
    meanwhile. ``buf`` must not change until the result is joined."""
    if page_bytes < 1:
        raise ValueError(f"page_bytes must be >= 1, got {page_bytes}")
    view = _as_bytes(buf)
    n = -(-len(view) // page_bytes)
    out = np.empty((n, DIGEST_BYTES), dtype=np.uint8)

    def run(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            page = view[i * page_bytes : (i + 1) * page_bytes]
            out[i] = np.frombuffer(hash_page(page, key), np.uint8)

    futures = [_get_pool().submit(run, lo, hi) for lo, hi in _groups(n, page_bytes)]

    def join() -> npt.NDArray[np.uint8]:
        for f in futures:
            f.result()
        return out

    return join


def parallel_copy(dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8]) -> None:
    """``dst[:] = src`` split over the worker threads (numpy copies release the GIL)."""
    n = src.size
    step = _TASK_BYTES
    if n <= 2 * step:
        dst[:n] = src
        return

    def run(a: int) -> None:
        dst[a : a + step] = src[a : a + step]

    for f in [_get_pool().submit(run, a) for a in range(0, n, step)]:
        f.result()


def parallel_run(tasks: list[Callable[[], None]], nbytes: int) -> None:
    """Run ``tasks`` (strided numpy copies: they release the GIL) on the worker threads, or in
    this thread when together they move less than two tasks' worth of ``nbytes``. Never call it
    from a task of this pool."""
    if nbytes <= 2 * _TASK_BYTES or len(tasks) < 2:
        for task in tasks:
            task()
        return
    for f in [_get_pool().submit(task) for task in tasks]:
        f.result()


def validated_copy(
    src: object,
    dst: object,
    page_bytes: int,
    expected: npt.NDArray[np.uint8],
    key: bytes | None = None,
) -> int:
    """Hash each page of ``src`` (keyed by ``key`` when given); copy it into ``dst`` only if it
    matches ``expected``.

    Returns the index of the first page whose digest differs, or -1 when all match. Every page
    before the first bad one is copied (the valid prefix); every byte written into ``dst``
    belongs to a page that validated; pages after the first bad one may or may not have been
    copied (they are never invalid).
    """
    s, d = _as_bytes(src), _as_bytes(dst)
    n = expected.shape[0]
    if len(s) > n * page_bytes or len(s) <= (n - 1) * page_bytes or len(d) < len(s):
        raise ValueError("source, destination and expected digests disagree in size")
    d_arr = np.frombuffer(d, dtype=np.uint8)
    s_arr = np.frombuffer(s, dtype=np.uint8)

    def run(lo: int, hi: int) -> int:
        for i in range(lo, hi):
            a, b = i * page_bytes, min((i + 1) * page_bytes, len(s))
            if hash_page(s[a:b], key) != expected[i].tobytes():
                return i
            d_arr[a:b] = s_arr[a:b]
        return -1

    groups = _groups(n, page_bytes)
    if len(groups) <= 1:
        results = [run(lo, hi) for lo, hi in groups]
    else:
        results = [f.result() for f in [_get_pool().submit(run, lo, hi) for lo, hi in groups]]
    bad = [r for r in results if r >= 0]
    return min(bad) if bad else -1
