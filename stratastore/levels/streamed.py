"""A put streamed from a :class:`~.sealing.PageSource`: its pages gathered, hashed and written
in one pass over bounded chunks (spec F-SEG-4, F-SC-3).

Worker threads gather each chunk of whole pages into a staging buffer and hash its pages there,
:data:`DEPTH` chunks ahead, while the caller writes the chunk before them from the same buffer:
the bytes hashed are the bytes written, the payload is never copied whole, and the staging in
flight is :data:`DEPTH` chunks. What makes a durable park from the engine's own layout cost
about what the write and fsync of its bytes cost (docs/performance.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

import numba_kernels
from numba_kernels import DIGEST_BYTES
from stratastore.format import Codec
from stratastore.io.system import after_fork_in_child, cpu_count
from stratastore.levels.sealing import Encoded, PageSource
from stratastore.levels.staging import STAGING

__all__ = ["CHUNK", "DEPTH", "streamed"]

CHUNK = 16 << 20  #: bytes a level writes at a time (a streamed put gathers as many)
DEPTH = 3  #: chunks in flight: the one being written, the next ones gathered and hashed
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(cpu_count(), DEPTH))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="strata-gather")
        return _pool


def _forget_pool() -> None:
    """A forked child has none of the parent's threads: it starts a pool of its own."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


after_fork_in_child(_forget_pool)


def streamed(
    src: PageSource,
    page_bytes: int,
    chunk: int,
    given: npt.NDArray[np.uint8] | None,
    key: bytes | None = None,
) -> Encoded:
    """``src`` encoded RAW as a stream of chunks of whole pages (about ``chunk`` bytes each):
    each chunk handed out is valid until the next one is asked for, and ``hashes()`` (called
    once every chunk was taken) returns the digests of the bytes handed out; ``given`` digests
    are returned instead, nothing hashed; ``key``: pages hashed keyed by it (spec
    F-KEYED). An error of the gathering is raised by the chunk it
    was for; a stream left early waits for its workers before its staging goes back."""
    per = max(1, chunk // page_bytes) * page_bytes
    spans = [(a, min(a + per, src.nbytes)) for a in range(0, src.nbytes, per)]
    digests: list[npt.NDArray[np.uint8]] = [np.empty((0, DIGEST_BYTES), np.uint8)] * len(spans)
    taken = False  #: every chunk was handed out

    def stage(i: int, buf: npt.NDArray[np.uint8]) -> None:
        a, b = spans[i]
        out = buf[: b - a]
        src.gather_into(a, out)
        if given is None:
            n = -(-(b - a) // page_bytes)
            d = np.empty((n, DIGEST_BYTES), np.uint8)
            for j in range(n):
                page = out[j * page_bytes : (j + 1) * page_bytes]
                d[j] = np.frombuffer(numba_kernels.hash_page(page.data, key), np.uint8)
            digests[i] = d

    def chunks() -> Iterator[memoryview]:
        nonlocal taken
        bufs = [STAGING.take(per) for _ in range(min(DEPTH, len(spans)))]
        running: dict[int, Future[None]] = {}
        try:
            for i in range(len(bufs)):
                running[i] = _get_pool().submit(stage, i, bufs[i])
            for i, (a, b) in enumerate(spans):
                running.pop(i).result()
                yield bufs[i % DEPTH][: b - a].data
                if i + DEPTH < len(spans):  # chunk i is written: its buffer takes i + DEPTH
                    running[i + DEPTH] = _get_pool().submit(stage, i + DEPTH, bufs[i % DEPTH])
            taken = True
        finally:
            for f in running.values():
                f.cancel()
            for f in running.values():
                if not f.cancelled():
                    f.exception()  # waits: no gather may land in a buffer given back
            for buf in bufs:
                STAGING.give(buf)

    def hashes() -> npt.NDArray[np.uint8]:
        if given is not None:
            return given
        if not taken:
            raise RuntimeError("a streamed payload's digests were asked for before its chunks")
        return np.concatenate(digests)

    return Encoded(Codec.RAW, chunks(), (), src.nbytes, hashes)
