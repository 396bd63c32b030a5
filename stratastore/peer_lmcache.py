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
from typing import Any

import numpy as np

from .peer_protocol import (
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

__all__ = ["session"]

INSTANCE = "strata-peers"


def _connector() -> Any:
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CopyConnector(GPUConnectorInterface):  # type: ignore[misc]
        """Copies between ``kvcaches`` (the engine layout) and memory objects."""

        def __init__(self) -> None:
            self.kvcaches = None

        def get_shape(self, num_tokens: int) -> Any:
            import torch

            return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])

        def from_gpu(self, obj: Any, start: int, end: int, **kw: Any) -> None:
            self.batched_from_gpu([obj], [start], [end], **kw)

        def to_gpu(self, obj: Any, start: int, end: int, **kw: Any) -> None:
            self.batched_to_gpu([obj], [start], [end], **kw)

        def batched_from_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
            kv = kw["kvcaches"]
            for obj, a, b in zip(objs, starts, ends, strict=True):
                part = kv[:, :, a:b].reshape(LAYERS, 2, b - a, HEADS * HEAD_DIM)
                obj.tensor.copy_(part.transpose(0, 1))

        def batched_to_gpu(self, objs: Any = None, starts: Any = None, ends: Any = None,
                           **kw: Any) -> None:  # fmt: skip
            kv = kw["kvcaches"]
            for obj, a, b in zip(objs, starts, ends, strict=True):
                part = obj.tensor.view(2, LAYERS, b - a, HEADS, HEAD_DIM)
                kv[:, :, a:b].copy_(part.transpose(0, 1))

    return CopyConnector()


def _engine(job: Job) -> Any:
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.metadata import LMCacheMetadata

    disk = job["backend"] == "disk"
    # LMCache touches its whole CPU buffer at start: give it the K/V and 64 MiB (GB = 2**30)
    room = job["tokens"] * TOKEN_BYTES / 2**30 + 1 / 16
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=job["chunk"], local_cpu=not disk, max_local_cpu_size=room,
        local_disk=job["path"] + "/" if disk else None,
        max_local_disk_size=room if disk else 0.0,
    )  # fmt: skip
    meta = LMCacheMetadata(model_name="bench/llama-3.1-8b-geometry", world_size=1,
                           local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.float16,
                           kv_shape=(LAYERS, 2, job["chunk"], HEADS, HEAD_DIM),
                           chunk_size=job["chunk"])  # fmt: skip
    engine = LMCacheEngineBuilder.get_or_create(INSTANCE, cfg, meta, _connector(),
                                                lambda t, r: None, lambda o, r: o)  # fmt: skip
    engine.post_init()
    return engine


def _store(engine: Any, job: Job, tokens: Any) -> Record:
    import torch

    kv = torch.from_numpy(source(job))
    backends = engine.storage_manager.storage_backends

    def store() -> None:
        engine.store(tokens, kvcaches=kv)
        if job["backend"] == "disk":
            worker = backends["LocalDiskBackend"].disk_worker
            while worker.put_tasks:  # its file writes are asynchronous
                time.sleep(0.0005)
            fsync_files(data_files([job["path"]]), job["path"])

    _, secs, rss = timed(store)
    return record(secs, rss, job["tokens"] * TOKEN_BYTES)


def session(job: Job) -> Record:
    """Store, then every read of this backend; ``{"records": {op: record}, ...}``, or
    ``{"unavailable": why}`` where LMCache cannot be imported or built here."""
    try:
        import torch

        os.makedirs(job["path"], exist_ok=True)
        engine = _engine(job)
    except Exception as e:  # an LMCache that cannot run here is a note, not a failure
        return {"unavailable": f"{type(e).__name__}: {e}"}
    n, half, disk = job["tokens"], job["half"], job["backend"] == "disk"
    tokens = torch.arange(n)
    records = {"durable write" if disk else "store (RAM, not durable)": _store(engine, job, tokens)}
    gc.collect()  # the source K/V is gone: reads count what the engine holds
    resets = True
    files = data_files([job["path"]]) if disk else []
    hot = warm(files) if disk else 1.0
    cold: list[float] = []

    def read(t: int, op: str) -> None:
        nonlocal resets
        if op.endswith("cold"):
            if len(engine.storage_manager.storage_backends["LocalCPUBackend"].hot_cache):
                raise PeersBenchError("LMCache disk: chunks are held in RAM, a read is not cold")
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
    return {"records": records, "hot_resident": hot, "cold_resident": cold,
            "peak_reset": resets}  # fmt: skip
