"""The timed operations of ``strata bench --peers``, each run in a fresh process.

``python -m strata_harness.peer_engines JOB.json`` runs one operation (``JOB["op"]``, a key of
:data:`OPS`) and writes its record as JSON to ``JOB["result"]``. The clock covers the operation
only (from the engine's layout in memory to durable on disk; from the file to a fresh, fully
materialised array in the engine's layout), never the interpreter start, the imports (the
engine's own modules are imported first, :data:`PRELOAD`), loading the source K/V or opening a
store. Every read is then compared bit for bit with what was written, outside the clock; a
mismatch is a :class:`~strata_harness.peer_protocol.PeersBenchError`. ``maxrss`` is the process's
peak RSS (``VmHWM``) when the clock stops.

The parent writes the K/V once to ``JOB["source"]`` in the engine layout, and its stored page
layout (``pack_pages``) to ``JOB["packed"]``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from strata_harness.peer_pool import pool_ops
from strata_harness.peer_protocol import (
    CHUNK,
    LAYERS,
    PAGE_TOKENS,
    TOKEN_BYTES,
    Job,
    PeersBenchError,
    Record,
    compare,
    fingerprint,
    fsync_dir,
    fsync_files,
    record,
    shape,
    source,
    timed,
)

__all__ = ["FILE_ENGINES", "OPS", "PRELOAD", "main", "open_store"]


# -- raw limits -------------------------------------------------------------------------------
def raw_write(job: Job) -> Record:
    data = source(job).reshape(-1).view(np.uint8)
    view = data.data

    def write() -> None:
        fd = os.open(job["path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for i in range(0, data.size, CHUNK):
                os.write(fd, view[i : i + CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(job["path"]))

    _, secs, rss = timed(write)
    return record(secs, rss, data.size)


def _read_into(path: str, buf: npt.NDArray[np.uint8]) -> None:
    with open(path, "rb", buffering=0) as f:
        view = buf.data
        for i in range(0, buf.size, CHUNK):
            f.readinto(view[i : i + CHUNK])


def raw_read(job: Job) -> Record:
    """Into a fresh buffer (allocated on the clock), or one touched beforehand (``touched``)."""
    n = job["tokens"] * TOKEN_BYTES
    touched = np.ones(n, np.uint8) if job.get("touched") else None

    def read() -> npt.NDArray[np.uint8]:
        out = np.empty(n, np.uint8) if touched is None else touched
        _read_into(job["path"], out)
        return out

    buf, secs, rss = timed(read)
    return record(
        secs,
        rss,
        n,
        compare(buf.view(np.float16).reshape(shape(job["tokens"])), job, job["tokens"]),
    )


def memcpy(job: Job) -> Record:
    """numpy's copy of the whole K/V into a buffer touched beforehand: memory's own limit."""
    src = source(job)
    dst = np.empty_like(src)
    dst.view(np.uint16).fill(1)
    _, secs, rss = timed(lambda: np.copyto(dst, src))
    return record(secs, rss, src.nbytes, compare(dst, job, job["tokens"]))


def _pages(n: int) -> list[tuple[int, int]]:
    """(offset, bytes) of each store page's worth (:data:`PAGE_TOKENS` tokens) of ``n``."""
    pb = PAGE_TOKENS * TOKEN_BYTES
    return [(o, min(pb, n - o)) for o in range(0, n, pb)]


def _on_both_cores(run: Callable[[list[tuple[int, int]]], None], n: int) -> None:
    """``run`` over :func:`_pages` of ``n`` bytes, in one run a CPU, on a thread each."""
    from concurrent.futures import ThreadPoolExecutor

    pages, cpus = _pages(n), max(1, min(os.cpu_count() or 1, 8))
    per = -(-len(pages) // cpus)
    with ThreadPoolExecutor(cpus) as pool:
        list(pool.map(run, [pages[i : i + per] for i in range(0, len(pages), per)]))


def raw_blake3(job: Job) -> Record:
    """BLAKE3 of the K/V's bytes (in memory), a store page a call, on every CPU at once: the
    rate the cores hash these bytes and do nothing else."""
    import blake3

    data = source(job).reshape(-1).view(np.uint8)
    view = data.data

    def run(part: list[tuple[int, int]]) -> None:
        for o, m in part:
            blake3.blake3(view[o : o + m]).digest()

    _, secs, rss = timed(lambda: _on_both_cores(run, data.size))
    return record(secs, rss, data.size)


def raw_read_blake3(job: Job) -> Record:
    """A store page at a time ``pread`` from the (resident) file into its place in a buffer
    touched beforehand and hashed there with BLAKE3, on every CPU at once: the plain way to
    read and validate it (one copy, one hash, nothing scattered)."""
    import blake3

    n = job["tokens"] * TOKEN_BYTES
    touched = np.ones(n, np.uint8)
    view = touched.data
    fd = os.open(job["path"], os.O_RDONLY)

    def run(part: list[tuple[int, int]]) -> None:
        for o, m in part:
            os.preadv(fd, [view[o : o + m]], o)
            blake3.blake3(view[o : o + m]).digest()

    try:
        _, secs, rss = timed(lambda: _on_both_cores(run, n))
    finally:
        os.close(fd)
    return record(secs, rss, n)


# -- numpy, safetensors, torch ----------------------------------------------------------------
def _write(job: Job, save: Callable[[npt.NDArray[np.float16], str], None]) -> Record:
    kv = source(job)

    def write() -> None:
        save(kv, job["path"])
        fsync_files([job["path"]], os.path.dirname(job["path"]))

    _, secs, rss = timed(write)
    return record(secs, rss, kv.nbytes)


def _read(job: Job, load: Callable[[str, int], npt.NDArray[Any]]) -> Record:
    t = job["t"]
    res, secs, rss = timed(lambda: load(job["path"], t))
    return record(secs, rss, t * TOKEN_BYTES, compare(res, job, t))


def _np_save(kv: npt.NDArray[np.float16], path: str) -> None:
    with open(path, "wb") as f:
        np.save(f, kv)


def _np_load(path: str, t: int) -> npt.NDArray[Any]:
    whole: npt.NDArray[Any] = np.load(path)
    return whole


def _np_load_prefix(path: str, t: int) -> npt.NDArray[Any]:
    mapped = np.load(path, mmap_mode="r")
    out = np.empty(shape(t), mapped.dtype)
    np.copyto(out, mapped[:, :, :t])
    del mapped
    return out


def _st_save(kv: npt.NDArray[np.float16], path: str) -> None:
    from safetensors.numpy import save_file

    save_file({"kv": kv}, path)


def _st_load(path: str, t: int) -> npt.NDArray[Any]:
    from safetensors.numpy import load_file

    return np.asarray(load_file(path)["kv"])


def _st_load_prefix(path: str, t: int) -> npt.NDArray[Any]:
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        return np.ascontiguousarray(f.get_slice("kv")[:, :, :t])


def _torch_save(kv: npt.NDArray[np.float16], path: str) -> None:
    import torch

    torch.save(torch.from_numpy(kv), path)


def _torch_load(path: str, t: int) -> npt.NDArray[Any]:
    import torch

    return np.asarray(torch.load(path, weights_only=True).numpy())


def _torch_load_prefix(path: str, t: int) -> npt.NDArray[Any]:
    import torch

    mapped = torch.load(path, mmap=True, weights_only=True)
    out = mapped[:, :, :t].contiguous()
    del mapped
    return np.asarray(out.numpy())


# -- stratastore, through the engine-facing API -----------------------------------------------
def open_store(job: Job) -> Any:
    from stratastore import Store

    fp = fingerprint()
    # the park goes to disk, nothing is kept in RAM; an attention-only model resumes on any page
    cfg = {
        "park": "disk",
        "ram_mib": 0,
        "cold_dir": job["path"],
        "page_resume": True,
        "cold_mib": 2 * job["tokens"] * TOKEN_BYTES // 2**20 + 64,
    }
    return fp, Store.open(fp, cfg)


def strata_park(job: Job) -> Record:
    """``pack_pages`` from the engine layout, ``park``, ``flush`` (durable when it returns)."""
    from stratastore.chain import Checkpoint, Conversation
    from stratastore.restore import pack_pages

    fp, store = open_store(job)
    kv, n = source(job), job["tokens"]
    conv = Conversation("peers", np.arange(n, dtype=np.uint32), [Checkpoint(n)])

    def park() -> float:
        t = time.perf_counter()
        packed = pack_pages(
            fp, [kv[x, 0] for x in range(LAYERS)], [kv[x, 1] for x in range(LAYERS)], n
        )
        packing = time.perf_counter() - t
        store.park(conv, packed)
        store.flush()
        return packing

    packing, secs, rss = timed(park)
    store.close()
    return record(secs, rss, kv.nbytes, pack_seconds=packing)


def strata_restore(job: Job) -> Record:
    """``restore`` into a fresh ``LayerKV`` over the engine layout, or (``flat``) into a fresh
    flat buffer in the stored page layout."""
    from stratastore.restore import LayerKV

    fp, store = open_store(job)
    t, flat = job["t"], bool(job.get("flat"))
    prompt = np.arange(t, dtype=np.uint32)

    def restore() -> tuple[npt.NDArray[Any], int]:
        if flat:
            buf: npt.NDArray[Any] = np.empty(t * TOKEN_BYTES, np.uint8)
            return buf, store.restore(prompt, buf).tokens
        res = np.empty(shape(t), np.float16)
        dst = LayerKV(fp, [res[x, 0] for x in range(LAYERS)], [res[x, 1] for x in range(LAYERS)])
        return res, store.restore(prompt, dst).tokens

    (res, got), secs, rss = timed(restore)
    store.close()
    if got != t:
        raise PeersBenchError(f"{job['op']}: restored {got:,} tokens of {t:,}")
    return record(secs, rss, t * TOKEN_BYTES, compare(res, job, t, flat=flat))


def _lmcache(job: Job) -> Record:
    from strata_harness.peer_lmcache import session

    return session(job)


#: each file format's save, load and 50% prefix load
FILE_ENGINES: dict[str, tuple[Callable[..., None], Callable[..., Any], Callable[..., Any]]] = {
    "numpy": (_np_save, _np_load, _np_load_prefix),
    "safetensors": (_st_save, _st_load, _st_load_prefix),
    "torch": (_torch_save, _torch_load, _torch_load_prefix),
}

OPS: dict[str, Callable[[Job], Record]] = {
    "raw.write": raw_write,
    "raw.read": raw_read,
    "raw.memcpy": memcpy,
    "raw.blake3": raw_blake3,
    "raw.read_blake3": raw_read_blake3,
    "numpy.write": lambda job: _write(job, _np_save),
    "numpy.read": lambda job: _read(job, _np_load),
    "numpy.prefix": lambda job: _read(job, _np_load_prefix),
    "safetensors.write": lambda job: _write(job, _st_save),
    "safetensors.read": lambda job: _read(job, _st_load),
    "safetensors.prefix": lambda job: _read(job, _st_load_prefix),
    "torch.write": lambda job: _write(job, _torch_save),
    "torch.read": lambda job: _read(job, _torch_load),
    "torch.prefix": lambda job: _read(job, _torch_load_prefix),
    "stratastore.park": strata_park,
    "stratastore.restore": strata_restore,
    "lmcache.session": _lmcache,
}


OPS.update(pool_ops())  # the engine-pool protocol (:mod:`strata_harness.peer_pool`)

#: what each engine's operations import, imported before the clock starts (imports are not timed)
PRELOAD = {
    "safetensors": ("safetensors", "safetensors.numpy"),
    "torch": ("torch",),
    "lmcache": ("torch", "lmcache.v1.cache_engine"),
}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        job = json.load(f)
    try:
        for module in PRELOAD.get(job["op"].split(".")[0], ()):
            with contextlib.suppress(Exception):  # the operation says what is missing
                importlib.import_module(module)
        out = OPS[job["op"]](job)
        out["package"] = os.path.dirname(os.path.abspath(__file__))  # the stratastore measured
        code = 0
    except PeersBenchError as e:
        out, code = {"error": str(e)}, 1
    with open(job["result"], "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # an engine's worker threads (LMCache's) must not hold the process open


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
