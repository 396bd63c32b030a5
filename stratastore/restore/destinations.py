"""Where a restore writes: the engine's K/V buffers (DESIGN layer 6, issue 5).

Stored pages use the layout of spec F-SEG-4: a page of ``p`` tokens holds, for each layer, K
then V, each ``[p, n_kv_heads, head_dim]``. A destination receives runs of whole pages of one
segment (``write_pages(token_start, n_tokens, page_bytes)``) and lays them out its own way:

* :class:`FlatKV`: one buffer in the stored layout, a segment's pages at ``start * token_bytes``
  (what :meth:`Store.restore` takes);
* :class:`LayerKV`: per-layer K and V arrays ``[max_tokens, n_kv_heads, head_dim]``, the layout
  of a contiguous cache (transformers' ``DynamicCache``);
* :class:`PagedKV`: per-layer pools ``[2, num_blocks, block_size, n_kv_heads, head_dim]``
  addressed through a block table, the layout of vLLM and SGLang.

Arrays may be of any dtype of the right item size (bfloat16 travels as uint16); they are
written through uint8 views, so they must be C-contiguous.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from numba_kernels.cpu import parallel_copy

from ..errors import ConfigError
from ..format import ModelFingerprint

__all__ = ["Destination", "FlatKV", "LayerKV", "PagedKV", "pack_pages"]


class Destination(Protocol):
    def capacity(self) -> int:
        """Tokens it can hold from position 0."""
        ...

    def write_pages(self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8],
                    page_tokens: int) -> None:  # fmt: skip
        """Write ``n_tokens`` tokens starting at ``token_start``, given as consecutive stored
        pages of ``page_tokens`` (the last may be short)."""
        ...


def _bytes_view(a: npt.NDArray[np.generic], what: str) -> npt.NDArray[np.uint8]:
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ConfigError(f"{what} must be a writable, C-contiguous array")
    return a.reshape(-1).view(np.uint8)


class FlatKV:
    """The stored layout, one buffer for the whole conversation."""

    def __init__(self, fp: ModelFingerprint, buf: npt.NDArray[np.generic]) -> None:
        self.tb = fp.token_bytes
        self.buf = _bytes_view(buf, "the K/V buffer")

    def capacity(self) -> int:
        return self.buf.size // self.tb

    def write_pages(self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8],
                    page_tokens: int) -> None:  # fmt: skip
        a = token_start * self.tb
        parallel_copy(self.buf[a : a + n_tokens * self.tb], data[: n_tokens * self.tb])


class _PerToken:
    """Shared page walking: each page is [layers, 2, p, heads, dim*itemsize] bytes."""

    def __init__(self, fp: ModelFingerprint) -> None:
        self.layers = fp.n_layers
        self.row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize  # bytes of one token's K
        self.tb = fp.token_bytes

    def pages(self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8],
              page_tokens: int) -> list[tuple[int, npt.NDArray[np.uint8]]]:  # fmt: skip
        """``(first token, [layers, 2, p, row] view)`` of each page in ``data``."""
        out, pos, off = [], 0, 0
        while pos < n_tokens:
            p = min(page_tokens, n_tokens - pos)
            page = data[off : off + p * self.tb].reshape(self.layers, 2, p, self.row)
            out.append((token_start + pos, page))
            pos, off = pos + p, off + p * self.tb
        return out


class LayerKV(_PerToken):
    """``k[layer]`` and ``v[layer]``: arrays ``[max_tokens, n_kv_heads, head_dim]``."""

    def __init__(self, fp: ModelFingerprint, k: Sequence[npt.NDArray[np.generic]],
                 v: Sequence[npt.NDArray[np.generic]]) -> None:  # fmt: skip
        super().__init__(fp)
        if len(k) != fp.n_layers or len(v) != fp.n_layers:
            raise ConfigError(f"LayerKV needs {fp.n_layers} K and V arrays, got {len(k)}, {len(v)}")
        self.k = [_bytes_view(a, f"K[{i}]").reshape(-1, self.row) for i, a in enumerate(k)]
        self.v = [_bytes_view(a, f"V[{i}]").reshape(-1, self.row) for i, a in enumerate(v)]
        self.max_tokens = min(a.shape[0] for a in [*self.k, *self.v])

    def capacity(self) -> int:
        return self.max_tokens

    def write_pages(self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8],
                    page_tokens: int) -> None:  # fmt: skip
        for t0, page in self.pages(token_start, n_tokens, data, page_tokens):
            p = page.shape[2]
            for layer in range(self.layers):
                self.k[layer][t0 : t0 + p] = page[layer, 0]
                self.v[layer][t0 : t0 + p] = page[layer, 1]


class PagedKV(_PerToken):
    """``pools[layer]``: ``[2, num_blocks, block_size, n_kv_heads, head_dim]``; token ``t``
    lives in block ``block_table[t // block_size]`` at slot ``t % block_size``."""

    def __init__(self, fp: ModelFingerprint, pools: Sequence[npt.NDArray[np.generic]],
                 block_table: Sequence[int] | npt.NDArray[np.integer]) -> None:  # fmt: skip
        super().__init__(fp)
        if len(pools) != fp.n_layers:
            raise ConfigError(f"PagedKV needs {fp.n_layers} per-layer pools, got {len(pools)}")
        shape = pools[0].shape
        if len(shape) != 5 or shape[0] != 2 or any(p.shape != shape for p in pools):
            raise ConfigError("each pool must be [2, num_blocks, block_size, heads, head_dim]")
        self.num_blocks, self.block_size = shape[1], shape[2]
        self.pools = [_bytes_view(p, f"pool[{i}]").reshape(2, self.num_blocks * self.block_size,
                                                          self.row)
                      for i, p in enumerate(pools)]  # fmt: skip
        self.table = np.asarray(block_table, dtype=np.int64)
        if self.table.ndim != 1 or (
            self.table.size and (self.table.min() < 0 or self.table.max() >= self.num_blocks)
        ):
            raise ConfigError(f"the block table must hold block ids in 0..{self.num_blocks - 1}")

    def capacity(self) -> int:
        return int(self.table.size) * int(self.block_size)

    def write_pages(self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8],
                    page_tokens: int) -> None:  # fmt: skip
        for t0, page in self.pages(token_start, n_tokens, data, page_tokens):
            p = page.shape[2]
            t = np.arange(t0, t0 + p)
            slots = self.table[t // self.block_size] * self.block_size + t % self.block_size
            for layer in range(self.layers):
                self.pools[layer][0, slots] = page[layer, 0]
                self.pools[layer][1, slots] = page[layer, 1]


def pack_pages(
    fp: ModelFingerprint,
    k: Sequence[npt.NDArray[np.generic]],
    v: Sequence[npt.NDArray[np.generic]],
    n_tokens: int,
    cuts: Sequence[int] = (0,),
) -> npt.NDArray[np.uint8]:
    """A conversation's K/V in the stored layout (spec F-SEG-4), the inverse of
    :class:`LayerKV`: ``n_tokens`` tokens given per layer as K and V arrays
    ``[tokens, n_kv_heads, head_dim]`` (any dtype of ``fp``'s item size, or bytes). Each segment
    (from each of ``cuts`` to the next, the conversation's segment boundaries) is laid out in
    pages of ``page_tokens`` counted from its own start, the last one short."""
    if len(k) != fp.n_layers or len(v) != fp.n_layers:
        raise ConfigError(f"pack_pages needs {fp.n_layers} K and V arrays, got {len(k)}, {len(v)}")
    row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize
    parts = []
    for arr in (*k, *v):
        b = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if b.size < n_tokens * row:
            raise ConfigError(f"a K/V array holds {b.size // row} tokens, {n_tokens} are needed")
        parts.append(b[: n_tokens * row].reshape(n_tokens, row))
    n_layers, p = fp.n_layers, fp.page_tokens
    a = np.stack([np.stack([parts[i], parts[n_layers + i]]) for i in range(n_layers)])
    bounds = sorted({0, *(c for c in cuts if 0 < c < n_tokens), n_tokens})
    out = []
    for lo, hi in itertools.pairwise(bounds):
        seg, n = a[:, :, lo:hi], hi - lo  # [layers, 2, n, row]
        full = n // p * p
        head = seg[:, :, :full].reshape(n_layers, 2, full // p, p, row).transpose(2, 0, 1, 3, 4)
        out += [head.reshape(-1), seg[:, :, full:].reshape(-1)]
    return np.concatenate(out) if out else np.zeros(0, np.uint8)
