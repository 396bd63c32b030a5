"""The transformers adapter's bytes (:mod:`.hf`): a cache's K/V tensors to the stored layout
(spec F-SEG-4) and restored pages into the tensors a new ``DynamicCache`` holds.

A park copies each K/V byte once, from the cache's tensors straight into the stored page layout
(the transpose is that copy: :func:`pack`); a cache on CUDA is packed on the device
(:func:`pack_on_device`: one strided torch copy per layer, K/V and page run) and shown to the
Store as device memory (:func:`device_view`), hashed there and copied to the host once. A
restore writes into :class:`CacheBuffers`: per-layer tensors never zero-filled, behind a
:class:`~stratastore.restore.LayerKV` (or on CUDA a
:class:`~stratastore.restore.DeviceLayerKV`, validated on the device). Nothing goes through
``.to("cpu")`` for a CUDA cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from numba_kernels.cpu import parallel_run
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.restore import Destination, DeviceLayerKV, LayerKV
from stratastore.restore.destinations import page_runs

__all__ = [
    "CacheBuffers",
    "KVRows",
    "cache_rows",
    "device_view",
    "is_cuda",
    "pack",
    "pack_on_device",
    "packed",
    "token_rows",
]

#: one layer's K and V as byte views ``[n, heads, dim * itemsize]``
KVRows = tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]


def token_rows(t: Any) -> npt.NDArray[np.uint8]:
    """One sequence of a cache layer's K or V (``[1, heads, n, dim]``) as bytes ``[n, heads,
    dim * itemsize]``: a strided view of the tensor's own memory for a CPU tensor (no copy); a
    device tensor comes to the host once, and one whose last dimension is strided is made
    contiguous once."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.stride(-1) != 1:
        t = t.contiguous()
    out: npt.NDArray[np.uint8] = t[0].transpose(0, 1).view(torch.uint8).numpy()
    return out


def _pages_of(a: npt.NDArray[np.uint8], n_pages: int, p: int) -> npt.NDArray[np.uint8]:
    """``a`` ``[n_pages * p, heads, d]`` (any strides) as ``[n_pages, p, heads, d]``: a view."""
    s0, s1, s2 = a.strides
    return as_strided(a, (n_pages, p, *a.shape[1:]), (p * s0, s0, s1, s2), writeable=False)


def _heads_of(a: npt.NDArray[np.uint8], heads: int) -> npt.NDArray[np.uint8]:
    """``a`` ``[n_pages, p, row]`` (rows contiguous) as ``[n_pages, p, heads, row / heads]``:
    a writable view, so an assignment lands in ``a``'s memory."""
    d = a.shape[2] // heads
    return as_strided(a, (*a.shape[:2], heads, d), (*a.strides[:2], d, 1), writeable=True)


def pack(
    fp: ModelFingerprint, rows: Sequence[KVRows], n: int, cuts: Sequence[int]
) -> npt.NDArray[np.uint8]:
    """The stored layout (spec F-SEG-4, a segment from each cut) of ``n`` tokens given per
    layer as ``(K, V)`` byte views ``[n, heads, d]`` of any strides: one strided copy per
    layer, K/V and page run, straight from the cache's memory (what ``pack_pages`` does after
    a contiguous copy of each transposed layer)."""
    tb, p = fp.token_bytes, fp.page_tokens
    out = np.empty(n * tb, np.uint8)
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    runs = [
        run
        for lo, hi in itertools.pairwise(bounds)
        for run in page_runs(fp, lo, hi - lo, out[lo * tb : hi * tb], p)
    ]

    def task(layer: int, kind: int) -> Callable[[], None]:
        src = rows[layer][kind]

        def run() -> None:
            for t0, view in runs:  # [n_pages, layers, 2, q, row]
                n_pages, q = view.shape[0], view.shape[3]
                dst = _heads_of(view[:, layer, kind], fp.n_kv_heads)
                dst[...] = _pages_of(src[t0 : t0 + n_pages * q], n_pages, q)

        return run

    parallel_run([task(i, kind) for i in range(fp.n_layers) for kind in (0, 1)], n * tb)
    return out


def pack_on_device(
    fp: ModelFingerprint, layers: Sequence[tuple[Any, Any]], n: int, cuts: Sequence[int]
) -> Any:
    """The stored layout (spec F-SEG-4, a segment from each cut) of ``n`` tokens given per
    layer as ``(K, V)`` tensors ``[1, heads, n, dim]`` on the device, built on the device: a
    uint8 tensor there, one strided torch copy per layer, K/V and page run (what :func:`pack`
    does on the host; bit-identical)."""
    import torch

    tb, p = fp.token_bytes, fp.page_tokens
    first = layers[0][0]
    out = torch.empty(n * tb, dtype=torch.uint8, device=first.device)
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    rows = [
        tuple(
            (t if t.stride(-1) == 1 else t.contiguous())
            .detach()[0]
            .transpose(0, 1)
            .view(torch.uint8)
            for t in kv
        )
        for kv in layers
    ]
    for lo, hi in itertools.pairwise(bounds):
        full, rest = divmod(hi - lo, p)
        for t0, count, q in ((lo, full, p), (lo + full * p, 1 if rest else 0, rest)):
            if not count:
                continue
            a = t0 * tb
            view = out[a : a + count * q * tb].view(count, fp.n_layers, 2, q, fp.n_kv_heads, -1)
            for layer, kv in enumerate(rows):
                for kind, src in enumerate(kv):
                    view[:, layer, kind].copy_(src[t0 : t0 + count * q].unflatten(0, (count, q)))
    return out


def is_cuda(where: Any) -> bool:
    """Whether a tensor (or a torch device) is on a CUDA device."""
    device = getattr(where, "device", where)
    return getattr(device, "type", None) == "cuda"


def device_view(t: Any) -> Any:
    """A CUDA tensor as device memory numba reads in place (``__cuda_array_interface__``):
    itself, or for bfloat16, which the interface cannot describe, an int16 view of it."""
    import torch

    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class CacheBuffers:
    """Per-layer K and V tensors ``[tokens, heads, head_dim]`` of the cache's dtype on
    ``device``, never filled (``torch.empty``: a page the restore does not write is never
    touched), and the destination writing into their memory: :class:`LayerKV`, or on CUDA
    :class:`~stratastore.restore.DeviceLayerKV` (validated on the device)."""

    def __init__(self, fp: ModelFingerprint, dtype: Any, tokens: int, device: Any = "cpu") -> None:
        import torch

        shape = (max(tokens, 1), fp.n_kv_heads, fp.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(fp.n_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(fp.n_layers)]
        self.dest: Destination
        if is_cuda(device):
            self.dest = DeviceLayerKV(
                fp, [device_view(t) for t in self.k], [device_view(t) for t in self.v]
            )
        else:
            self.dest = LayerKV(
                fp,
                [_byte_view(t) for t in self.k],
                [_byte_view(t) for t in self.v],
                read_direct=True,
            )

    def cache(self, config: Any, n: int) -> Any:
        """A ``DynamicCache`` of the first ``n`` tokens, holding views of these tensors."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=config)
        plain = len(cache.layers) == len(self.k) and all(
            type(layer) is DynamicLayer for layer in cache.layers
        )
        for i, (k, v) in enumerate(zip(self.k, self.v, strict=True)):
            kt, vt = (t[:n].transpose(0, 1).unsqueeze(0) for t in (k, v))  # [1, heads, n, dim]
            if plain:  # hand the views over: DynamicLayer.update would concatenate (a copy)
                layer: Any = cache.layers[i]
                layer.lazy_initialization(kt, vt)
                layer.keys, layer.values = kt, vt
            else:
                cache.update(kt, vt, i)
        return cache


def _byte_view(t: Any) -> npt.NDArray[np.uint8]:
    """A contiguous tensor ``[tokens, heads, dim]`` as bytes ``[tokens, row]``: its memory."""
    import torch

    out: npt.NDArray[np.uint8] = t.view(torch.uint8).numpy().reshape(t.shape[0], -1)
    return out


def cache_rows(
    cache: Any, n: int, dtype: Any, layers: int, heads: int, head_dim: int
) -> list[KVRows]:
    """Each layer's ``(K, V)`` of ``cache`` as byte views ``[n, heads, dim * itemsize]``,
    after checking the layer count (``layers``), ``dtype`` and shape ``(1, heads, n,
    head_dim)`` (and that all are on one device); none for a cache on CUDA (packed on the
    device: :func:`packed`)."""
    found = getattr(cache, "layers", None)
    if found is None or len(found) != layers:
        raise ConfigError(
            f"the cache has {len(found or [])} layers; this model has {layers}: park "
            "the cache of the model this adapter is for"
        )
    rows = []
    for i, layer in enumerate(found):
        for t in (layer.keys, layer.values):
            if t.dtype != dtype:
                raise ConfigError(
                    f"layer {i} holds {t.dtype}; this adapter stores "
                    f"{dtype}: open it with dtype={t.dtype}"
                )
            if tuple(t.shape) != (1, heads, n, head_dim):
                raise ConfigError(
                    f"layer {i} K/V shape {tuple(t.shape)} is not (1, {heads}, {n}, "
                    f"{head_dim}): one sequence whose length is the token count"
                )
    places = {str(t.device) for layer in found for t in (layer.keys, layer.values)}
    if len(places) > 1:
        raise ConfigError(
            f"the cache's layers live on {sorted(places)}: park a cache whose K/V are on one device"
        )
    if is_cuda(found[0].keys):
        return []  # packed, hashed on the device
    for layer in found:
        rows.append((token_rows(layer.keys), token_rows(layer.values)))
    return rows


def packed(
    fp: ModelFingerprint, cache: Any, rows: list[KVRows], n: int, cuts: Sequence[int]
) -> Any:
    """The stored layout of ``cache`` (checked by :func:`cache_rows`): on the host from
    ``rows``, or for a cache on CUDA built on the device (:func:`pack_on_device`), as device
    memory :meth:`~stratastore.Store.park` hashes there."""
    if not rows:
        pairs = [(layer.keys, layer.values) for layer in cache.layers]
        return device_view(pack_on_device(fp, pairs, n, cuts))
    return pack(fp, rows, n, cuts)
