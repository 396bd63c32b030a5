"""The shared parts of ``strata bench --peers`` (:mod:`strata_harness.peers`): the K/V geometry,
page-cache eviction and its check, the clock, the bit-for-bit comparison.

The K/V is ``[layers, 2, tokens, kv_heads, head_dim]`` fp16 (:func:`shape`), the Llama-3.1-8B
geometry. Evicting a file from the page cache is fsync + ``POSIX_FADV_DONTNEED``; what stays
resident is counted with ``mincore`` over a shared read-only mapping of it (mapping a file reads
nothing). A result is compared with the source as integers (random fp16 bytes hold NaNs).
"""

from __future__ import annotations

import ctypes
import os
import resource
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError

__all__ = [
    "CHUNK",
    "GEOMETRY",
    "HEADS",
    "HEAD_DIM",
    "Job",
    "LAYERS",
    "PAGE_TOKENS",
    "TOKEN_BYTES",
    "PeersBenchError",
    "Record",
    "compare",
    "data_files",
    "evict",
    "fingerprint",
    "fsync_dir",
    "fsync_files",
    "maxrss",
    "record",
    "reset_peak_rss",
    "resident",
    "shape",
    "source",
    "timed",
    "warm",
]

LAYERS, HEADS, HEAD_DIM, PAGE_TOKENS = 32, 8, 128, 16
GEOMETRY = {
    "layers": LAYERS,
    "kv_heads": HEADS,
    "head_dim": HEAD_DIM,
    "dtype": "float16",
    "page_tokens": PAGE_TOKENS,
}
TOKEN_BYTES = LAYERS * 2 * HEADS * HEAD_DIM * 2  #: 128 KiB
CHUNK = 16 << 20  #: raw reads and writes, and comparisons, go in pieces of this many bytes

Record = dict[str, Any]  #: seconds, maxrss (bytes), bytes (delivered or written), compared
Job = dict[str, Any]


class PeersBenchError(StrataError):
    """The peers benchmark cannot run or its protocol failed (a result that differs from the
    source, a data file left in the page cache, a failed engine); the message says which."""


def shape(tokens: int) -> tuple[int, int, int, int, int]:
    return (LAYERS, 2, tokens, HEADS, HEAD_DIM)


def fingerprint() -> Any:
    """The model of the benchmark: the Llama-3.1-8B geometry, pages of 16 tokens."""
    from stratastore.format import ModelFingerprint

    return ModelFingerprint.create(
        "bench/llama-3.1-8b-geometry",
        n_layers=LAYERS,
        n_kv_heads=HEADS,
        head_dim=HEAD_DIM,
        page_tokens=PAGE_TOKENS,
    )


# -- the page cache ---------------------------------------------------------------------------
def data_files(paths: Iterable[str]) -> list[str]:
    """Every regular file at or under ``paths`` (a store's directories), sorted."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            out += [os.path.join(d, f) for d, _, names in os.walk(p) for f in names]
        elif os.path.isfile(p):
            out.append(p)
    return sorted(out)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident(paths: list[str]) -> tuple[int, int]:
    """(pages in the page cache, pages) of the files ``paths``, by ``mincore`` over a shared
    read-only mapping of each (mapping touches nothing)."""
    libc, page = _libc(), os.sysconf("SC_PAGE_SIZE")
    have = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if not size:
            continue
        n = (size + page - 1) // page
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {p} for mincore failed")
            try:
                vec = np.zeros(n, np.uint8)
                if libc.mincore(addr, size, vec.ctypes.data) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore of {p} failed")
                have += int(np.count_nonzero(vec & 1))
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        total += n
    return have, total


def evict(paths: list[str]) -> float:
    """fsync and ``POSIX_FADV_DONTNEED`` each file; the fraction of their pages still resident
    (checked with mincore)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    have, total = resident(paths)
    return have / total if total else 0.0


def warm(paths: list[str]) -> float:
    """Read each file once (into the page cache); the fraction of their pages resident."""
    buf = bytearray(CHUNK)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    have, total = resident(paths)
    return have / total if total else 1.0


def fsync_files(paths: list[str], directory: str) -> None:
    """fsync each file, then the directory that holds them (what makes them durable)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(directory)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- measuring and checking -------------------------------------------------------------------
def maxrss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` of ``/proc/self/status``, the high-water mark
    of its own memory. Not ``ru_maxrss``: Linux carries that across ``execve`` from the process
    that spawned this one (``subprocess`` forks with ``vfork``), so every child would report at
    least its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark (``VmHWM``, what :func:`maxrss` reads) to its
    current RSS (Linux ``clear_refs`` 5); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def timed(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """(what ``fn`` returns, its seconds, the peak RSS (:func:`maxrss`) when it returned)."""
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t, maxrss()


def source(job: Job) -> npt.NDArray[np.float16]:
    """The K/V to write, read from the parent's file into fresh memory (outside the clock)."""
    return np.fromfile(job["source"], np.float16).reshape(shape(job["tokens"]))


def compare(got: npt.NDArray[Any], job: Job, tokens: int, *, flat: bool = False) -> int:
    """Compare ``got`` bit for bit with the first ``tokens`` tokens of the source (the engine
    layout ``[layers, 2, tokens, heads, dim]``), or with as many bytes of the page layout
    (``flat``); returns the bytes compared. A difference raises :class:`PeersBenchError`."""
    if flat:
        want = np.memmap(job["packed"], np.uint8, "r")[: tokens * TOKEN_BYTES]
        have = np.ascontiguousarray(got).reshape(-1).view(np.uint8)
        pieces: Iterable[tuple[Any, Any]] = (
            (have[i : i + CHUNK], want[i : i + CHUNK]) for i in range(0, want.size, CHUNK)
        )
        if have.size != want.size:
            raise PeersBenchError(f"{job['op']}: {have.size:,} bytes, {want.size:,} expected")
    else:
        src = np.memmap(job["source"], np.uint16, "r", shape=shape(job["tokens"]))
        if got.shape != shape(tokens) or got.itemsize != 2:
            raise PeersBenchError(
                f"{job['op']}: returned {got.dtype}{list(got.shape)}, not "
                f"float16{list(shape(tokens))}"
            )
        have = got.view(np.uint16)
        pieces = ((have[x, k], src[x, k, :tokens]) for x in range(LAYERS) for k in range(2))
    n = 0
    for a, b in pieces:
        if not np.array_equal(a, b):
            raise PeersBenchError(
                f"{job['op']}: the bytes read differ from the bytes written "
                f"(in the {n:,} to {n + b.nbytes:,} byte range)"
            )
        n += b.nbytes
    return n


def record(secs: float, rss: int, nbytes: int, compared: int = 0, **extra: Any) -> Record:
    return {"seconds": secs, "maxrss": rss, "bytes": nbytes, "compared": compared, **extra}
