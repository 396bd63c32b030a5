"""LMCache in ``strata bench --peers``: its public engine, driven on the CPU.

LMCache keeps the index of what it stored in the process that stored it (its local disk backend
does not read its directory back at start), so one fresh process per backend and round stores
the K/V and then times every read: ``LMCacheEngineBuilder.get_or_create`` with a connector that
copies bytes between the engine layout ``[layers, 2, tokens, heads, dim]`` and LMCache's memory
objects ``[2, layers, chunk tokens, heads * dim]`` (what a GPU connector does, here in host
memory), then ``store`` and ``retrieve`` into a fresh ``torch.empty`` in the engine layout.

- **disk**: the local disk backend alone (``local_cpu`` off, so nothing is kept in RAM; checked
  before the cold reads). The durable write is ``store``, the wait for its asynchronous file
  writes, and fsync of every file and of the directory: LMCache itself never fsyncs.
- **ram**: the local CPU backend alone; its store is not durable, so only reads are compared.
- **strata**: the stratastore plugin (:mod:`stratastore.adapters.lmcache`, ``local_cpu`` off),
  its budget the K/V plus 64 MiB. The durable write is ``store`` and the plugin's ``flush()``
  (every put's Future done: fsynced and committed by the plugin itself). It validates every page
  it reads. (``strata bench --lmcache``, :mod:`strata_harness.lmcache_bench`, sets it beside
  **disk**.)

LMCache allocates and touches its whole CPU buffer (``max_local_cpu_size``) when it starts, for
both backends: it is sized to the K/V plus 64 MiB, the least that holds one store or one
retrieve. The source K/V is dropped after the store, and the RSS high-water mark reset before
each read (``clear_refs``), so a read's peak RSS is what the engine holds plus what it
allocates. Chunks are LMCache's 256 tokens (halved until the 50% prefix is whole chunks); their
keys come from Python's ``hash()`` without vLLM, so the parent sets ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from strata_harness.peer_protocol import (
    HEAD_DIM,
    HEADS,
    LAYERS,
    TOKEN_BYTES,
    Job,
    PeersBenchError,
    Record,
    compare,
    data_files,
    evict,
    fsync_files,
    record,
    reset_peak_rss,
    shape,
    source,
    timed,
    warm,
)

__all__ = ["pool_session", "session"]

INSTANCE = "strata-peers"
PLUGIN = "stratastore"


def _engine(job: Job) -> Any:
    from lmcache.v1.config import LMCacheEngineConfig

    from stratastore.adapters.lmcache.cpu import cpu_engine

    backend = job["backend"]
    # LMCache touches its whole CPU buffer at start: give it the K/V and 64 MiB (GB = 2**30)
    room = job["tokens"] * TOKEN_BYTES / 2**30 + 1 / 16
    extra = {}
    if backend == "strata":  # the stratastore plugin, its budget the K/V and more
        p = f"storage_plugin.{PLUGIN}."
        extra = {
            p + "module_path": "stratastore.adapters.lmcache",
            p + "class_name": "StrataStoragePlugin",
            p + "dir": job["path"],
            p + "budget_mib": job["tokens"] * TOKEN_BYTES // 2**20 + 64,
        }
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=job["chunk"],
        local_cpu=backend == "ram",
        max_local_cpu_size=room,
        local_disk=job["path"] + "/" if backend == "disk" else None,
        max_local_disk_size=room if backend == "disk" else 0.0,
        storage_plugins=[PLUGIN] if extra else None,
        extra_config=extra or None,
    )
    engine = cpu_engine(
        INSTANCE,
        cfg,
        model_name="bench/llama-3.1-8b-geometry",
        layers=LAYERS,
        heads=HEADS,
        head_dim=HEAD_DIM,
        chunk=job["chunk"],
    )
    if extra and PLUGIN not in engine.storage_manager.storage_backends:
        raise PeersBenchError("LMCache did not load the stratastore plugin (see its log)")
    return engine


def _store(engine: Any, job: Job, tokens: Any, kv: Callable[[], Any]) -> Record:
    """``engine.store`` of ``kv()`` (on the clock) until it is durable."""
    backends = engine.storage_manager.storage_backends

    def store() -> None:
        engine.store(tokens, kvcaches=kv())
        if job["backend"] == "strata":  # durable when every put's Future is done
            backends[PLUGIN].flush()
        elif job["backend"] == "disk":
            worker = backends["LocalDiskBackend"].disk_worker
            while worker.put_tasks:  # its file writes are asynchronous
                time.sleep(0.0005)
            fsync_files(data_files([job["path"]]), job["path"])

    _, secs, rss = timed(store)
    return record(secs, rss, job["tokens"] * TOKEN_BYTES)


def _open(job: Job) -> Any:
    """This backend's engine, or why LMCache cannot be imported or built here (a note, not a
    failure)."""
    try:
        import torch  # noqa: F401

        os.makedirs(job["path"], exist_ok=True)
        return _engine(job)
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def session(job: Job) -> Record:
    """Store, then every read of this backend; ``{"records": {op: record}, ...}``, or
    ``{"unavailable": why}`` where LMCache cannot be imported or built here."""
    engine = _open(job)
    if isinstance(engine, str):
        return {"unavailable": engine}
    import torch

    n, half, disk = job["tokens"], job["half"], job["backend"] in ("disk", "strata")
    tokens = torch.arange(n)
    kv = [torch.from_numpy(source(job))]
    stored = _store(engine, job, tokens, lambda: kv[0])
    kv.clear()
    records = {"durable write" if disk else "store (RAM, not durable)": stored}
    gc.collect()  # the source K/V is gone: reads count what the engine holds
    resets = True
    files = data_files([job["path"]]) if disk else []
    hot = warm(files) if disk else 1.0
    cold: list[float] = []

    def read(t: int, op: str) -> None:
        nonlocal resets
        if op.endswith("cold"):
            if len(engine.storage_manager.storage_backends["LocalCPUBackend"].hot_cache):
                raise PeersBenchError(
                    f"LMCache {job['backend']}: chunks are held in RAM, a read is not cold"
                )
            cold.append(evict(files))
        resets = reset_peak_rss() and resets

        def retrieve() -> tuple[Any, int]:
            res = torch.empty(shape(t), dtype=torch.float16)
            return res, int(engine.retrieve(tokens[:t], kvcaches=res).sum())

        (res, got), secs, rss = timed(retrieve)
        if got != t:
            raise PeersBenchError(f"LMCache {job['backend']}: retrieved {got:,} tokens of {t:,}")
        records[op] = record(secs, rss, t * TOKEN_BYTES, compare(np.asarray(res.numpy()), job, t))

    read(n, "read hot")
    read(half, "prefix hot")
    if disk and job["cold"]:
        read(n, "read cold")
        read(half, "prefix cold")
    return {"records": records, "hot_resident": hot, "cold_resident": cold, "peak_reset": resets}


def pool_session(job: Job) -> Record:
    """The engine-pool protocol (:mod:`.peer_pool`) for this backend, as :func:`session`: the
    durable store gathers the conversation out of the pool into LMCache's engine layout on the
    clock; each retrieve lands in a buffer an engine keeps (allocated and touched once, before
    the clock) and is copied from there into the pool through the block table, on the clock."""
    from strata_harness.peer_pool import Pool, filled, timed_read

    engine = _open(job)
    if isinstance(engine, str):
        return {"unavailable": engine}
    import torch

    n, half, disk = job["tokens"], job["half"], job["backend"] in ("disk", "strata")
    tokens = torch.arange(n)
    pool = filled(job)
    stored = _store(engine, job, tokens, lambda: torch.from_numpy(pool.gather(n)))
    records = {"durable write" if disk else "store (RAM, not durable)": stored}
    del pool
    gc.collect()
    pool = Pool(n, seed=1)
    staging = torch.ones(shape(n), dtype=torch.float16)  # the engine's, allocated once
    files = data_files([job["path"]]) if disk else []
    hot = warm(files) if disk else 1.0
    cold: list[float] = []

    def read(t: int, op: str) -> None:
        if op.endswith("cold"):
            cold.append(evict(files))

        def retrieve() -> int:
            got = int(engine.retrieve(tokens[:t], kvcaches=staging[:, :, :t]).sum())
            pool.scatter(staging.numpy(), t)
            return got

        records[op] = timed_read({**job, "t": t, "op": f"lmcache {op}"}, pool, retrieve)

    read(n, "read hot")
    read(half, "prefix hot")
    if disk and job["cold"]:
        read(n, "read cold")
        read(half, "prefix cold")
    return {"records": records, "hot_resident": hot, "cold_resident": cold, "peak_reset": True}
