"""The copy kernels: the ladder copy into a pool of page-sized blocks, the scatter of stored
pages into an engine's per-layer K/V (contiguous or paged through a block table), its inverse
(the gather of an engine's rows into stored pages, what a park from device memory needs), and
zeroing.
Imported on first use by :func:`numba_kernels.cuda.kernels` (one module per concern, see
numba_kernels/_hash_kernel.py). Every launcher checks its arguments first
(:mod:`numba_kernels.checks`): the kernels index without bounds checks."""

from numba import cuda

from .cuda import _imin as _py_imin

imin = cuda.jit(device=True)(_py_imin)  # not min: see numba_kernels.cuda._imin


@cuda.jit  # type: ignore[misc]
def ladder_copy(src, page_bytes, n_pages, pool, block_table):  # type: ignore[no-untyped-def]
    """Copy pages [0, n_pages) of ``src`` into ``pool`` blocks ``block_table[page]`` (one
    CUDA block per page, threads striding over its bytes)."""
    page = cuda.blockIdx.x
    if page >= n_pages:
        return
    dst = block_table[page] * page_bytes
    base = page * page_bytes
    n = imin(page_bytes, src.shape[0] - base)
    i = cuda.threadIdx.x
    while i < n:
        pool[dst + i] = src[base + i]
        i += cuda.blockDim.x


@cuda.jit  # type: ignore[misc]
def scatter_rows(src, n_tokens, page_tokens, layers, row, layer, dst_k, dst_v, slots):  # type: ignore[no-untyped-def]
    """Layer ``layer``'s K and V rows of ``n_tokens`` tokens held in ``src`` as consecutive
    stored pages of ``page_tokens`` (spec F-SEG-4: a page of ``p`` tokens is, per layer, K then
    V, each ``[p, row]``; the last page may be short) into ``dst_k`` / ``dst_v`` (flat bytes of
    rows): token ``j``'s row lands at row ``slots[j]``. Grid: (n_tokens, 2) blocks (token, K/V),
    threads striding over the row's bytes."""
    j = cuda.blockIdx.x
    kind = cuda.blockIdx.y
    if j >= n_tokens:
        return
    full = n_tokens // page_tokens
    page = j // page_tokens
    p = page_tokens if page < full else n_tokens - full * page_tokens
    base = (page * page_tokens * layers * 2 + (layer * 2 + kind) * p) * row + (
        j - page * page_tokens
    ) * row
    d = slots[j] * row
    i = cuda.threadIdx.x
    if kind == 0:
        while i < row:
            dst_k[d + i] = src[base + i]
            i += cuda.blockDim.x
    else:
        while i < row:
            dst_v[d + i] = src[base + i]
            i += cuda.blockDim.x


@cuda.jit  # type: ignore[misc]
def gather_rows(dst, n_tokens, page_tokens, layers, row, layer, src_k, src_v, slots):  # type: ignore[no-untyped-def]
    """The exact inverse of :func:`scatter_rows`: layer ``layer``'s K and V rows of
    ``n_tokens`` tokens, token ``j``'s at row ``slots[j]`` of ``src_k`` / ``src_v`` (flat bytes
    of rows), into ``dst`` as consecutive stored pages of ``page_tokens`` (spec F-SEG-4: a page
    of ``p`` tokens is, per layer, K then V, each ``[p, row]``; the last page may be short).
    Grid: (n_tokens, 2) blocks (token, K/V), threads striding over the row's bytes."""
    j = cuda.blockIdx.x
    kind = cuda.blockIdx.y
    if j >= n_tokens:
        return
    full = n_tokens // page_tokens
    page = j // page_tokens
    p = page_tokens if page < full else n_tokens - full * page_tokens
    base = (page * page_tokens * layers * 2 + (layer * 2 + kind) * p) * row + (
        j - page * page_tokens
    ) * row
    s = slots[j] * row
    i = cuda.threadIdx.x
    if kind == 0:
        while i < row:
            dst[base + i] = src_k[s + i]
            i += cuda.blockDim.x
    else:
        while i < row:
            dst[base + i] = src_v[s + i]
            i += cuda.blockDim.x


@cuda.jit  # type: ignore[misc]
def zero_rows(dst, row, slots, n):  # type: ignore[no-untyped-def]
    """Zero the rows ``slots[0..n)`` (of ``row`` bytes) of ``dst`` (flat bytes): one CUDA block
    a row."""
    j = cuda.blockIdx.x
    if j >= n:
        return
    d = slots[j] * row
    i = cuda.threadIdx.x
    while i < row:
        dst[d + i] = 0
        i += cuda.blockDim.x
