"""numba CUDA kernels: page-level BLAKE3, first-bad-page validation, and the ladder copy.

BLAKE3 (the ``blake3`` package is the reference every kernel is tested against, bit-exact):
a page is cut into 1 KiB chunks; each chunk's chaining value is 16 compressions of 64-byte
blocks; the chaining values are merged pairwise, level by level, into the root (an odd node is
carried up unchanged, which yields exactly BLAKE3's left-heavy tree). One CUDA block hashes one
page: each thread computes the chunk values of its run of chunks (``ceil(chunks / threads)``,
a power of two, so every run is a whole subtree) and the block merges the runs' values through a
shared-memory tree.

Written in the uint32-cast style (FACTS.md): every sum, xor and rotate is cast back to uint32,
so the numba CUDA simulator (which wraps uint32) and compiled code (which widens) agree, and
NVVM lowers the rotates to 32-bit funnel shifts (``shf.l.wrap.b32``, checked by the PTX test).
The same Python source is compiled for the device and, with ``@njit``, for the host, which is
how the arithmetic is tested quickly; the kernels themselves run in the simulator in CI
(``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["IV", "MAX_PAGE_BYTES", "SCHEDULE", "build", "digest_words_to_bytes"]

IV = np.array(
    [
        0x6A09E667,
        0xBB67AE85,
        0x3C6EF372,
        0xA54FF53A,
        0x510E527F,
        0x9B05688C,
        0x1F83D9AB,
        0x5BE0CD19,
    ],
    dtype=np.uint32,
)
_PERM = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8]


def _schedule() -> np.ndarray:
    rows, cur = [], list(range(16))
    for _ in range(7):
        rows.append(cur)
        cur = [cur[p] for p in _PERM]
    return np.array(rows, dtype=np.int64)


SCHEDULE = _schedule()  #: message word index of each round's 16 slots
#: (a, b, c, d) of the 8 G applications of a round
G_IDX = np.array(
    [
        [0, 4, 8, 12],
        [1, 5, 9, 13],
        [2, 6, 10, 14],
        [3, 7, 11, 15],
        [0, 5, 10, 15],
        [1, 6, 11, 12],
        [2, 7, 8, 13],
        [3, 4, 9, 14],
    ],
    dtype=np.int64,
)
CHUNK_START, CHUNK_END, PARENT, ROOT = 1, 2, 4, 8
MAX_THREADS = 256  #: threads per block (one page); also the shared tree's width
MASK = 0xFFFFFFFF


def _compress(cv, m, counter, block_len, flags, iv, sched, gidx, st, out):  # type: ignore[no-untyped-def]
    """out[0:8] = the chaining value of compressing block ``m`` (16 words) onto ``cv``."""
    for i in range(8):
        st[i] = cv[i]
    for i in range(4):
        st[8 + i] = iv[i]
    st[12] = np.uint32(counter & MASK)
    st[13] = np.uint32((counter >> 32) & MASK)
    st[14] = np.uint32(block_len)
    st[15] = np.uint32(flags)
    for r in range(7):
        for g in range(8):
            a = gidx[g, 0]
            b = gidx[g, 1]
            c = gidx[g, 2]
            d = gidx[g, 3]
            mx = np.uint32(m[sched[r, 2 * g]])
            my = np.uint32(m[sched[r, 2 * g + 1]])
            va = np.uint32(np.uint32(st[a]) + np.uint32(st[b]) + mx)
            x = np.uint32(np.uint32(st[d]) ^ va)
            vd = np.uint32((x >> np.uint32(16)) | (x << np.uint32(16)))
            vc = np.uint32(np.uint32(st[c]) + vd)
            x = np.uint32(np.uint32(st[b]) ^ vc)
            vb = np.uint32((x >> np.uint32(12)) | (x << np.uint32(20)))
            va = np.uint32(va + vb + my)
            x = np.uint32(vd ^ va)
            vd = np.uint32((x >> np.uint32(8)) | (x << np.uint32(24)))
            vc = np.uint32(vc + vd)
            x = np.uint32(vb ^ vc)
            vb = np.uint32((x >> np.uint32(7)) | (x << np.uint32(25)))
            st[a] = va
            st[b] = vb
            st[c] = vc
            st[d] = vd
    for i in range(8):
        out[i] = np.uint32(np.uint32(st[i]) ^ np.uint32(st[i + 8]))


def _load_block(data, base, n, m):  # type: ignore[no-untyped-def]
    """m[0:16] = the little-endian words of ``n`` bytes at ``data[base:]``, zero padded."""
    for w in range(16):
        v = np.uint32(0)
        for k in range(4):
            i = 4 * w + k
            if i < n:
                v = np.uint32(v | (np.uint32(data[base + i]) << np.uint32(8 * k)))
        m[w] = v


def _imin(a, b):  # type: ignore[no-untyped-def]
    """min(a, b): the built-in ``min`` does not compile for the CUDA target in numba 0.68
    ("Signature mismatch"), which only a PTX compile shows: the simulator runs Python's."""
    return a if a < b else b


def _imax(a, b):  # type: ignore[no-untyped-def]
    """max(a, b), for the same reason as :func:`_imin`."""
    return a if a > b else b


def build(device: Callable[[Any], Any]) -> dict[str, Any]:
    """Compile the BLAKE3 pieces with ``device`` (``cuda.jit(device=True)`` or ``njit``)."""
    compress = device(_compress)
    load_block = device(_load_block)
    imin = device(_imin)
    imax = device(_imax)

    def chunk_cv(data, start, length, chunk_index, root, iv, sched, gidx, st, m, cv):  # type: ignore[no-untyped-def]
        """cv[0:8] = the chaining value of the chunk of ``length`` bytes at ``start`` (the
        root flag on its last block when the chunk is the whole input)."""
        for i in range(8):
            cv[i] = iv[i]
        blocks = imax(1, (length + 63) // 64)
        for blk in range(blocks):
            n = imin(64, length - 64 * blk)
            load_block(data, start + 64 * blk, n, m)
            flags = 0
            if blk == 0:
                flags |= CHUNK_START
            if blk == blocks - 1:
                flags |= CHUNK_END
                if root:
                    flags |= ROOT
            compress(cv, m, chunk_index, n, flags, iv, sched, gidx, st, cv)

    def parent_cv(left, right, root, iv, sched, gidx, st, m, out):  # type: ignore[no-untyped-def]
        for i in range(8):
            m[i] = left[i]
            m[8 + i] = right[i]
        flags = PARENT | ROOT if root else PARENT
        compress(iv, m, 0, 64, flags, iv, sched, gidx, st, out)

    return {
        "compress": compress,
        "chunk_cv": device(chunk_cv),
        "parent_cv": device(parent_cv),
        "load_block": load_block,
        "imin": imin,
        "imax": imax,
    }


def digest_words_to_bytes(words: np.ndarray) -> np.ndarray:
    """(n, 8) uint32 root chaining values -> (n, 32) uint8 digests (little-endian)."""
    return np.ascontiguousarray(words.astype("<u4")).view(np.uint8).reshape(-1, 32)


MAX_RUN = 256  #: chunks one thread merges itself (local memory: 8 KiB a thread at most)
#: the largest page the page-hash kernel takes: MAX_THREADS * MAX_RUN KiB (64 MiB); the device
#: path refuses a model with larger pages, typed, before anything runs
MAX_PAGE_BYTES = MAX_THREADS * MAX_RUN * 1024


_KERNELS: dict[str, Any] = {}
_CONSTS: list[Any] = []
#: the numba CUDA simulator runs a kernel by swapping its module's global ``cuda`` for a fake;
#: two threads launching at once would swap each other's, so under the simulator (and only
#: there) launches take turns
_SIM_LOCK = threading.Lock()


def kernels() -> dict[str, Any]:
    """The compiled kernels, one module per concern (importing numba.cuda is slow, so it
    happens on first use)."""
    if not _KERNELS:
        from . import _copy_kernels, _hash_kernel, _validate_kernel

        _KERNELS.update(
            page_hash=_hash_kernel.page_hash,
            first_bad=_validate_kernel.first_bad,
            ladder_copy=_copy_kernels.ladder_copy,
            scatter_rows=_copy_kernels.scatter_rows,
            gather_rows=_copy_kernels.gather_rows,
            zero_rows=_copy_kernels.zero_rows,
        )
    return _KERNELS


def _launch(name: str, grid: Any, block: int, *args: Any, stream: Any = 0) -> None:
    """Launch kernel ``name`` (taking turns under the simulator, see ``_SIM_LOCK``)."""
    from numba import config

    k = kernels()[name]
    if config.ENABLE_CUDASIM:
        with _SIM_LOCK:
            k[grid, block, stream](*args)
    else:
        k[grid, block, stream](*args)


def _consts() -> tuple[Any, Any, Any]:
    """BLAKE3's IV, message schedule and G indices on the device (copied once)."""
    if not _CONSTS:
        from numba import cuda

        _CONSTS.extend([cuda.to_device(IV), cuda.to_device(SCHEDULE), cuda.to_device(G_IDX)])
    return _CONSTS[0], _CONSTS[1], _CONSTS[2]


def threads_for(page_bytes: int) -> int:
    """Threads of a page's block: one per 1 KiB chunk up to MAX_THREADS."""
    chunks = max(1, -(-page_bytes // 1024))
    if chunks > MAX_THREADS * MAX_RUN:
        raise ValueError(
            f"pages of {page_bytes} bytes exceed the kernel's {MAX_THREADS * MAX_RUN} KiB limit"
        )
    return min(MAX_THREADS, chunks)


def page_hash_words(
    data: Any,
    total: int,
    page_bytes: int,
    *,
    threads: int | None = None,
    pages: int | None = None,
    stream: Any = 0,
) -> Any:
    """The (n_pages, 8) uint32 root chaining values (the digests as little-endian words) of the
    pages of a device array, left on the device (enqueued on ``stream``); ``n_pages`` is
    ``ceil(total / page_bytes)`` (or ``pages``: 1 hashes an empty input). ``threads``
    overrides the block size (tests use it to give each thread several chunks)."""
    from numba import cuda

    n = pages if pages is not None else -(-total // page_bytes)
    out = cuda.device_array((n, 8), dtype=np.uint32, stream=stream)
    if n == 0:
        return out
    chunks = max(1, -(-page_bytes // 1024))
    if threads is not None and not (1 <= threads <= MAX_THREADS and chunks <= threads * MAX_RUN):
        raise ValueError(
            f"{threads} threads cannot hash pages of {page_bytes} bytes "
            f"(each thread merges at most {MAX_RUN} chunks)"
        )
    iv, sched, gidx = _consts()
    longest = max(1, min(page_bytes, total))  # the first page: no page is longer
    _launch(
        "page_hash",
        n,
        threads or threads_for(longest),
        data,
        total,
        page_bytes,
        iv,
        sched,
        gidx,
        out,
        stream=stream,
    )
    return out


def page_hashes_device(
    data: Any, total: int, page_bytes: int, *, threads: int | None = None, pages: int | None = None
) -> np.ndarray:
    """(n_pages, 32) digests (on the host) of the pages of a device array: see
    :func:`page_hash_words`."""
    words = page_hash_words(data, total, page_bytes, threads=threads, pages=pages)
    if words.shape[0] == 0:
        return np.empty((0, 32), dtype=np.uint8)
    return digest_words_to_bytes(words.copy_to_host())


def first_bad_device(actual: Any, expected: Any, *, stream: Any = 0) -> int:
    """The first page whose digest differs (device arrays of one shape: (n, 32) bytes or
    (n, 8) words), or -1. Waits for ``stream``: the answer is on the host."""
    from numba import cuda

    n = actual.shape[0]
    result = cuda.to_device(np.array([n], dtype=np.int64), stream=stream)
    if n:
        _launch("first_bad", -(-n // 128), 128, actual, expected, result, stream=stream)
    got = int(result.copy_to_host(stream=stream)[0])
    return -1 if got >= n else got


def ladder_copy_device(
    src: Any, page_bytes: int, n_pages: int, pool: Any, block_table: Any
) -> None:
    """Copy the first ``n_pages`` pages of ``src`` into ``pool`` blocks of ``page_bytes``
    through ``block_table`` (all device arrays)."""
    if n_pages > 0:
        _launch("ladder_copy", n_pages, 128, src, page_bytes, n_pages, pool, block_table)


def scatter_rows_device(
    src: Any,
    n_tokens: int,
    page_tokens: int,
    layers: int,
    row: int,
    layer: int,
    dst_k: Any,
    dst_v: Any,
    slots: Any,
    *,
    stream: Any = 0,
) -> None:
    """Layer ``layer``'s K and V rows of the ``n_tokens`` tokens stored in ``src`` (consecutive
    pages, spec F-SEG-4) into rows ``slots`` of ``dst_k`` / ``dst_v`` (flat device bytes);
    arguments checked by the caller (:func:`numba_kernels.checks.check_scatter`)."""
    if n_tokens > 0:
        _launch(
            "scatter_rows",
            (n_tokens, 2),
            _row_threads(row),
            src,
            n_tokens,
            page_tokens,
            layers,
            row,
            layer,
            dst_k,
            dst_v,
            slots,
            stream=stream,
        )


def gather_rows_device(
    dst: Any,
    n_tokens: int,
    page_tokens: int,
    layers: int,
    row: int,
    layer: int,
    src_k: Any,
    src_v: Any,
    slots: Any,
    *,
    stream: Any = 0,
) -> None:
    """The inverse of :func:`scatter_rows_device`: layer ``layer``'s K and V rows of
    ``n_tokens`` tokens, at rows ``slots`` of ``src_k`` / ``src_v`` (flat device bytes), into
    ``dst`` as consecutive stored pages of ``page_tokens`` (spec F-SEG-4, the last page
    possibly short). ``dst`` must hold ``n_tokens * layers * 2 * row`` bytes and every slot
    lie within both sources: the kernel indexes without bounds checks, so the caller checks
    (:class:`stratastore.restore.device.DevicePagedKV` through its block table)."""
    if n_tokens > 0:
        _launch(
            "gather_rows",
            (n_tokens, 2),
            _row_threads(row),
            dst,
            n_tokens,
            page_tokens,
            layers,
            row,
            layer,
            src_k,
            src_v,
            slots,
            stream=stream,
        )


def zero_rows_device(dst: Any, row: int, slots: Any, *, stream: Any = 0) -> None:
    """Zero rows ``slots`` (of ``row`` bytes) of ``dst`` (flat device bytes)."""
    n = int(slots.shape[0])
    if n > 0:
        _launch("zero_rows", n, _row_threads(row), dst, row, slots, n, stream=stream)


def _row_threads(row: int) -> int:
    """Threads striding over a row of ``row`` bytes: a warp at least, 256 at most."""
    return max(32, min(256, -(-row // 32) * 32))
