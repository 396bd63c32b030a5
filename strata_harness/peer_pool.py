"""The engine-pool protocol of ``strata bench --peers``: every engine reads into, and parks from,
the K/V pool an inference engine allocates once and keeps.

- **The pool**: per layer ``[2, blocks, block_size, kv_heads, head_dim]`` fp16 (vLLM's paged
  layout; blocks of 16 tokens, a page of the store), a quarter more blocks than the
  conversation needs, allocated and touched before the clock; the conversation's blocks are
  a shuffled block table (a fixed seed), as an engine's allocator leaves them.
- **stratastore** restores straight into it, ``Store.restore(prompt, PagedKV(fp, pools,
  table))``, every page validated before it is delivered, and parks from it,
  ``Store.park(conv, PagedKV(...))`` + ``flush()`` (durable when it returns).
- **Each peer** reads with its best API (``np.load``, ``safe_open``, ``torch.load``, LMCache's
  ``retrieve``; the 50% prefix as in the fresh-tensor protocol) and copies what it read into the
  same pool through the block table: that copy is what an engine using it pays, on the clock. A
  peer's durable write gathers the conversation out of the pool into its own layout, saves it
  and fsyncs it.
- Results are compared bit for bit out of the pool (outside the clock); the peak RSS a read adds
  to what the process held before it (the pool, the interpreter, an open store) is measured with
  the high-water mark reset before the clock.

Here the pool and the operations run in each spawned process (:mod:`.peer_engines`);
LMCache's are in :mod:`.peer_lmcache`.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from strata_harness.peer_protocol import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    PAGE_TOKENS,
    TOKEN_BYTES,
    Job,
    PeersBenchError,
    Record,
    compare,
    fsync_files,
    record,
    reset_peak_rss,
    shape,
    source,
    timed,
)

__all__ = ["Pool", "current_rss", "pool_ops"]

BLOCK = PAGE_TOKENS  #: tokens a block of the pool holds (one page of the store)
Array = npt.NDArray[Any]


def current_rss() -> int:
    """This process's resident set now, in bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Pool:
    """The engine's pool for ``tokens`` tokens (see the module): allocated and touched here."""

    def __init__(self, tokens: int, seed: int = 0) -> None:
        if tokens % BLOCK:
            raise PeersBenchError(f"{tokens} tokens are not whole blocks of {BLOCK}")
        self.tokens, self.blocks = tokens, tokens // BLOCK
        total = self.blocks + self.blocks // 4 + 1
        self.layers = [
            np.ones((2, total, BLOCK, HEADS, HEAD_DIM), np.float16) for _ in range(LAYERS)
        ]
        self.table = np.random.default_rng(seed).permutation(total)[: self.blocks]

    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.layers)

    def scatter(self, kv: Array, t: int) -> None:
        """Copy tokens ``[0, t)`` of ``kv`` (``[layers, 2, t, heads, dim]``) into their blocks."""
        ids = self.table[: t // BLOCK]
        for layer, pool in enumerate(self.layers):
            pool[:, ids] = kv[layer, :, :t].reshape(2, -1, BLOCK, HEADS, HEAD_DIM)

    def gather(self, t: int) -> Array:
        """Tokens ``[0, t)`` out of their blocks, as a new ``[layers, 2, t, heads, dim]``."""
        out = np.empty(shape(t), np.float16)
        ids = self.table[: t // BLOCK]
        for layer, pool in enumerate(self.layers):
            out[layer] = pool[:, ids].reshape(2, t, HEADS, HEAD_DIM)
        return out

    def destination(self, fp: Any) -> Any:
        from stratastore.restore import PagedKV

        return PagedKV(fp, self.layers, self.table)

    def compare(self, job: Job, t: int) -> int:
        """Tokens ``[0, t)`` in the pool against the source, bit for bit (outside the clock)."""
        return compare(self.gather(t), job, t)


def filled(job: Job) -> Pool:
    """A pool holding the source's K/V (what a park takes), the source dropped."""
    pool = Pool(job["tokens"])
    kv = source(job)
    pool.scatter(kv, job["tokens"])
    del kv
    gc.collect()
    return pool


def timed_read(job: Job, pool: Pool, read: Callable[[], int]) -> Record:
    """``read()`` (which lands ``t`` tokens in ``pool`` and returns how many) on the clock, the
    RSS high-water mark reset first; its record with ``rss_growth``, what it added to the RSS
    the process held before it."""
    t = job["t"]
    before = current_rss()
    reset_peak_rss()
    got, secs, rss = timed(read)
    if got != t:
        raise PeersBenchError(f"{job['op']}: landed {got:,} tokens of {t:,}")
    return record(secs, rss, t * TOKEN_BYTES, pool.compare(job, t), rss_growth=rss - before)


def file_write(job: Job, save: Callable[[Array, str], None]) -> Record:
    """A peer's durable write from the pool: gather, save, fsync."""
    pool = filled(job)

    def write() -> None:
        save(pool.gather(job["tokens"]), job["path"])
        fsync_files([job["path"]], os.path.dirname(job["path"]))

    _, secs, rss = timed(write)
    return record(secs, rss, job["tokens"] * TOKEN_BYTES)


def file_read(job: Job, load: Callable[[str, int], Array]) -> Record:
    """A peer's read into the pool: its load, then the copy through the block table."""
    pool, t = Pool(job["tokens"], seed=1), int(job["t"])

    def read() -> int:
        kv = load(job["path"], t)
        pool.scatter(kv, t)
        return t

    return timed_read(job, pool, read)


def strata_park(job: Job) -> Record:
    """``park(conv, PagedKV(pool))`` + ``flush()``: durable when it returns."""
    from strata_harness.peer_engines import open_store
    from stratastore.chain import Checkpoint, Conversation

    pool = filled(job)
    fp, store = open_store(job)
    n = job["tokens"]
    conv = Conversation("peers", np.arange(n, dtype=np.uint32), [Checkpoint(n)])

    def park() -> None:
        store.park(conv, pool.destination(fp))
        store.flush()

    _, secs, rss = timed(park)
    store.close()
    return record(secs, rss, n * TOKEN_BYTES)


def strata_restore(job: Job) -> Record:
    """``restore(prompt, PagedKV(pool))``, every page validated."""
    from strata_harness.peer_engines import open_store

    pool = Pool(job["tokens"], seed=1)
    fp, store = open_store(job)
    prompt = np.arange(job["t"], dtype=np.uint32)
    dest = pool.destination(fp)
    try:
        return timed_read(job, pool, lambda: int(store.restore(prompt, dest).tokens))
    finally:
        store.close()


def _file_ops() -> dict[str, Callable[[Job], Record]]:
    from strata_harness import peer_engines as pe

    out: dict[str, Callable[[Job], Record]] = {}
    for name, (save, load, prefix) in pe.FILE_ENGINES.items():
        out[f"{name}.pool_write"] = functools.partial(file_write, save=save)
        out[f"{name}.pool_read"] = functools.partial(file_read, load=load)
        out[f"{name}.pool_prefix"] = functools.partial(file_read, load=prefix)
    return out


def pool_ops() -> dict[str, Callable[[Job], Record]]:
    """The operations of this protocol, by name (added to :data:`.peer_engines.OPS`)."""
    from strata_harness.peer_lmcache import pool_session

    return {
        "stratastore.pool_park": strata_park,
        "stratastore.pool_restore": strata_restore,
        "lmcache.pool_session": pool_session,
        **_file_ops(),
    }
