"""vLLM's K/V pool as the store sees it: each attention layer's cache tensor as a view of the
same memory (never a copy), in layer order, checked against the model's fingerprint and vLLM's
block size when vLLM registers it. A restore lands in it in place (:meth:`Pool.destination`),
a park reads from it in place (:meth:`Pool.source`, ``Store.park``'s streamed park) or, for a
request that runs on, from a copy made in the step (:meth:`Pool.copy`); all in whole pages of
the store.

A page of the store (``fp.page_tokens`` tokens, 16 by default) is not a block of vLLM's pool
(``block_size`` tokens, 128 on vLLM's CPU backend, 16 on its GPU backends): a block holds
``block_size // page_tokens`` whole pages (the pool refuses a block size that is not a
multiple of the page), and token ``t`` of a request lives in block ``block_ids[t //
block_size]`` at slot ``t % block_size``. So a page is part of a block, a restore may end
mid-block (the rest of that block is left as it was) and a park may take a block's first pages
only.

The layouts, told apart by the tensors' shape and memory (vLLM 0.32):

* vLLM's CPU attention backend: per layer ``[num_blocks, n_kv_heads, block_size, 2 x
  head_dim]``, each block per head a region of its ``block_size`` tokens' K, then one of their
  V, each region in the attention ISA's own order (:mod:`.block_layout`: token-major rows,
  dim-major columns, AMX's tiles), measured from vLLM's kernel when the pool is registered:
  :class:`CpuBlocks`;
* the paged layouts of the GPU backends, in host memory (:class:`~stratastore.restore.PagedKV`)
  or on a CUDA device (:class:`~stratastore.restore.DevicePagedKV`, through
  ``__cuda_array_interface__``: read, validated by the BLAKE3 kernel and scattered on the
  device; a park gathered and hashed there): FlashAttention's ``[2, num_blocks, block_size,
  n_kv_heads, head_dim]`` and FlashInfer's
  ``[num_blocks, 2, block_size, n_kv_heads, head_dim]``, in vLLM's default NHD order (a cache
  kept HND is a permuted view: refused by name). MLA's latent caches and sliding-window layers
  have other shapes or other layer counts, and are refused at registration.

A page's K/V is moved to and from the stored page layout (spec F-SEG-4: per layer K then V,
each ``[page_tokens, n_kv_heads, head_dim]``, token-major), so a restore gives back exactly the
items vLLM's kernel wrote for those tokens, whichever part of a block they are. Each move is
one assignment per layer and kind over all the pages (a strided view of the block's order, or
its measured offsets), never a copy per page. Block ids are checked when a destination or a
source is made (:func:`~stratastore.restore.checked_block_table`): an id outside the pool or
given twice is refused before a byte moves. torch is imported only for vLLM's own tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from numba_kernels.cpu import parallel_run
from stratastore.adapters.vllm.block_layout import BlockLayout, Mover
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.io.system import cpu_count
from stratastore.restore import (
    DestinationRefused,
    DevicePagedKV,
    PagedKV,
    as_engine_capture,
    checked_block_table,
)
from stratastore.restore.device_arrays import as_device_array, is_device_array
from stratastore.restore.in_place import is_torch_tensor

__all__ = ["CpuBlocks", "Pool", "layer_order"]


def layer_order(names: Sequence[str]) -> list[str]:
    """vLLM's attention layer names in model order (by the layer number each carries:
    ``model.layers.11.self_attn.attn`` is layer 11), refusing names without exactly one."""

    def number(name: str) -> int:
        found = [int(p) for p in name.split(".") if p.isdigit()]
        if len(found) != 1:
            raise ConfigError(
                f"StrataConnector: cannot tell the layer number of vLLM's KV cache "
                f"{name!r} (one integer part expected)"
            )
        return found[0]

    return sorted(names, key=number)


def _check_block_size(fp: ModelFingerprint, block_size: int) -> None:
    if block_size <= 0 or block_size % fp.page_tokens:
        raise ConfigError(
            f"StrataConnector: vLLM's block size {block_size} is not a multiple of the "
            f"store's page of {fp.page_tokens} tokens ({fp.describe()}): a page must lie "
            f"within one block; choose a page size that divides {block_size}"
        )


def _page_slots(
    ids: npt.NDArray[np.int64], first: int, n: int, per_block: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where pages ``first .. first + n - 1`` of a request lie: each one's block id and its
    page within that block (the fancy indices of a block array seen as ``[..., blocks, ...,
    pages of a block, page_tokens, ...]``)."""
    g = np.arange(first, first + n, dtype=np.int64)
    return ids[g // per_block], g % per_block


def _gathered_pages(fp: ModelFingerprint, n_tokens: int, capacity: int, n_ids: int) -> int:
    """The pages of a park of ``n_tokens``, refusing what is not whole pages within the
    request's blocks (a :class:`ConfigError`: the park would store wrong or missing K/V)."""
    if n_tokens < 0 or n_tokens % fp.page_tokens or n_tokens > capacity:
        raise ConfigError(
            f"StrataConnector: a park of {n_tokens} tokens from {n_ids} blocks "
            f"({capacity} tokens) is not whole pages of {fp.page_tokens} within the "
            "request's blocks"
        )
    return n_tokens // fp.page_tokens


class CpuBlocks:
    """A restore destination on the CPU backend's blocks (see the module): ``blocks`` per layer
    ``[num_blocks, n_kv_heads, 2, block_size, head_dim]`` (K rows then V rows of each block and
    head), token ``t`` landing in block ``block_ids[t // block_size]`` at slot ``t %
    block_size`` of every layer, never a token below ``skip`` (vLLM's own prefix cache holds
    those, in blocks other requests may share) floored to a whole page (a page is written
    whole; vLLM's prefix hits are whole blocks, so in practice nothing is floored).
    ``block_size`` is the arrays' own when not given. Whole pages of ``fp.page_tokens`` only;
    read through staging (validated pages are copied in, one move per layer and kind, each
    chunk as it validates: it has ``zero``). A park's source too (``page_views``,
    ``gather_pages``)."""

    read_direct = False

    def __init__(
        self,
        fp: ModelFingerprint,
        blocks: Sequence[npt.NDArray[Any]],
        block_ids: Sequence[int] | npt.NDArray[np.integer],
        skip: int = 0,
        block_size: int | None = None,
        movers: tuple[Mover, Mover] | None = None,
    ) -> None:
        self.fp, self.blocks = fp, list(blocks)
        h, d, p = fp.n_kv_heads, fp.head_dim, fp.page_tokens
        shape = tuple(getattr(self.blocks[0], "shape", ())) if self.blocks else ()
        bs = block_size if block_size is not None else (shape[3] if len(shape) == 5 else 0)
        _check_block_size(fp, bs)
        if (
            len(self.blocks) != fp.n_layers
            or len(shape) != 5
            or shape[1:] != (h, 2, bs, d)
            or any(a.shape != shape or a.itemsize != fp.dtype.itemsize for a in self.blocks)
        ):
            raise DestinationRefused(
                f"StrataConnector: the CPU blocks are {len(self.blocks)} layers of {shape}; "
                f"{fp.describe()} needs {fp.n_layers} of [blocks, {h}, 2, {bs}, {d}] of "
                f"{fp.dtype.itemsize}-byte items"
            )
        if not all(blk.flags.c_contiguous for blk in self.blocks):
            raise DestinationRefused(
                "StrataConnector: the CPU blocks must be C-contiguous arrays (vLLM's own "
                "tensors as numpy views): a view of another layout would take the pages "
                "in a copy, not in the pool"
            )
        self.bs, self.page, self.per_block = bs, p, bs // p
        self.num_blocks = int(shape[0])
        self.ids = checked_block_table(block_ids, self.num_blocks, bs, "vLLM's block table")
        self.skip = max(0, skip - skip % p)
        if movers is None:  # the order inside a block: token-major rows unless measured
            rows = BlockLayout.rows(bs, d)
            movers = (Mover(rows.k, p), Mover(rows.v, p))
        self.movers = movers
        #: per layer and kind, [blocks, heads, block_size x dim]: views of vLLM's memory
        self.regions = [
            [a[:, :, kind].reshape(self.num_blocks, h, bs * d) for kind in (0, 1)]
            for a in self.blocks
        ]

    def capacity(self) -> int:
        return int(self.ids.size) * self.bs

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        fp, p = self.fp, self.page
        end = token_start + n_tokens
        if token_start % p or n_tokens % p or page_tokens != p or token_start < 0:
            raise DestinationRefused(
                f"StrataConnector: a restore of tokens [{token_start}, {end}) in pages of "
                f"{page_tokens} is not whole pages of {p}"
            )
        if end > self.capacity():
            raise DestinationRefused(
                f"StrataConnector: a restore of tokens [{token_start}, {end}) runs past the "
                f"request's {self.ids.size} blocks ({self.capacity()} tokens)"
            )
        drop = min(max(0, self.skip - token_start), n_tokens)  # whole pages: skip is floored
        n = (n_tokens - drop) // p
        if n <= 0:
            return
        tb = fp.token_bytes
        pages = data[drop * tb : (drop + n * p) * tb].view(self.blocks[0].dtype)
        pages = pages.reshape(n, fp.n_layers, 2, p, fp.n_kv_heads, fp.head_dim)
        bids, subs = _page_slots(self.ids, (token_start + drop) // p, n, self.per_block)
        self._move(bids, subs, pages, put=True)

    def zero(self, token_start: int, n_tokens: int) -> None:
        """Zero the items of tokens ``[token_start, token_start + n_tokens)`` (whole pages,
        never below ``skip``): the :class:`~stratastore.restore.Zeroable` capability, so a
        restore applies each chunk as soon as it validates (overlapping the reads of the next
        ones) and takes back what lies past the prefix it reports."""
        p = self.page
        start = max(token_start, self.skip)
        end = token_start + n_tokens
        if start >= end:
            return
        first, last = start // p, -(-end // p)
        zeros = np.zeros(
            (last - first, self.fp.n_layers, 2, p, self.fp.n_kv_heads, self.fp.head_dim),
            dtype=self.blocks[0].dtype,
        )
        bids, subs = _page_slots(self.ids, first, last - first, self.per_block)
        self._move(bids, subs, zeros, put=True)

    def gather_pages(
        self, token_start: int, n_tokens: int, out: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        """Tokens ``[token_start, token_start + n_tokens)`` into ``out`` as stored pages (the
        :class:`~stratastore.restore.GathersPages` capability a park streams through): one
        move per layer and kind over all the whole pages, the last page (when short) through
        a page of scratch."""
        fp, p = self.fp, self.page
        end = token_start + n_tokens
        if token_start % p or page_tokens != p or token_start < 0 or end > self.capacity():
            raise DestinationRefused(
                f"StrataConnector: a park of tokens [{token_start}, {end}) in pages of "
                f"{page_tokens} is not pages of {p} within the request's {self.ids.size} "
                f"blocks ({self.capacity()} tokens)"
            )
        if out.size != n_tokens * fp.token_bytes:
            raise DestinationRefused(
                f"StrataConnector: {out.size:,} bytes given for a park of {n_tokens} tokens "
                f"({n_tokens * fp.token_bytes:,} bytes)"
            )
        full, tail = divmod(n_tokens, p)
        dtype = self.blocks[0].dtype
        shape = (fp.n_layers, 2, p, fp.n_kv_heads, fp.head_dim)
        pages = out[: full * p * fp.token_bytes].view(dtype).reshape(full, *shape)
        self._take(token_start // p, pages)
        if tail:
            scratch = np.empty((1, *shape), dtype=dtype)
            self._take(token_start // p + full, scratch)
            last = out[full * p * fp.token_bytes :].view(dtype)
            last.reshape(fp.n_layers, 2, tail, fp.n_kv_heads, fp.head_dim)[...] = scratch[
                0, :, :, :tail
            ]

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        """The stored page of tokens ``[token_start, token_start + n_tokens)``: a copy (a
        page's items are not in one piece in the CPU order), one view of it."""
        out = np.empty(n_tokens * self.fp.token_bytes, dtype=np.uint8)
        self.gather_pages(token_start, n_tokens, out, self.page)
        return [out.data]

    def _take(self, first: int, pages: npt.NDArray[Any]) -> None:
        """Pages ``first .. first + len(pages) - 1`` of the request into ``pages`` (``[n,
        layers, 2, page, heads, dim]``)."""
        bids, subs = _page_slots(self.ids, first, int(pages.shape[0]), self.per_block)
        self._move(bids, subs, pages, put=False)

    def _move(
        self,
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        pages: npt.NDArray[Any],
        *,
        put: bool,
    ) -> None:
        """Every layer's and kind's pages (``[n, layers, 2, page, heads, dim]``) into the
        blocks (``put``) or out of them, the layers split over the store's copy threads (the
        movers' kernels release the GIL): the cores the forward is not using move the pages."""
        groups = max(1, min(cpu_count(), self.fp.n_layers))

        def task(layers: range) -> Callable[[], None]:
            def run() -> None:
                for layer in layers:
                    for kind in (0, 1):
                        mover, region = self.movers[kind], self.regions[layer][kind]
                        if put:
                            mover.put(region, bids, subs, pages[:, layer, kind])
                        else:
                            mover.take(region, bids, subs, pages[:, layer, kind])

            return run

        spans = np.array_split(np.arange(self.fp.n_layers), groups)
        parallel_run(
            [task(range(int(g[0]), int(g[-1]) + 1)) for g in spans if g.size],
            int(pages.nbytes),
        )


class Pool:
    """The engine's pool (see the module) of blocks of ``block_size`` tokens (vLLM's), refused
    with a typed error at start-up when its tensors are not the model's (another shape, dtype
    or layout) or its blocks do not hold whole pages of the store. ``caches``: vLLM's tensors
    (torch, on the CPU or a CUDA device), or arrays as they would be (numpy arrays in host
    memory, objects with ``__cuda_array_interface__`` on a device). A paged layout's K/V axis
    is read from the shape (``[2, blocks, ...]`` unless only ``[blocks, 2, ...]`` fits); a pool
    of exactly 2 blocks is read as FlashAttention's unless ``kv_first=False``."""

    def __init__(
        self,
        fp: ModelFingerprint,
        caches: Mapping[str, Any],
        block_size: int,
        layout: BlockLayout | None = None,
        *,
        kv_first: bool | None = None,
    ) -> None:
        _check_block_size(fp, block_size)
        self.fp, self.block_size = fp, block_size
        names = layer_order(list(caches))
        if len(names) != fp.n_layers:
            raise ConfigError(
                f"StrataConnector: vLLM registered {len(names)} KV caches; the "
                f"model has {fp.n_layers} attention layers ({fp.describe()}): "
                "models with layers of other kinds (sliding windows, mamba, MLA) "
                "are not supported"
            )
        tensors = [caches[n] for n in names]
        self.device = any(_on_device(t) for t in tensors)
        bs, h, d = block_size, fp.n_kv_heads, fp.head_dim
        said = [_Described.of(t, n) for n, t in zip(names, tensors, strict=True)]
        shape = said[0].shape
        self.cpu = not self.device and len(shape) == 4 and shape[1:] == (h, bs, 2 * d)
        firsts = len(shape) == 5 and shape[0] == 2 and shape[2:] == (bs, h, d)
        seconds = len(shape) == 5 and shape[1] == 2 and shape[2:] == (bs, h, d)
        self.kv_first = firsts if kv_first is None or not (firsts and seconds) else kv_first
        paged = firsts if self.kv_first else seconds
        for name, t, got in zip(names, tensors, said, strict=True):
            if not (self.cpu or paged) or got.shape != shape:
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is {got.shape} of "
                    f"{got.dtype}; {fp.describe()} in blocks of {bs} needs [blocks, {h}, {bs}, "
                    f"{2 * d}] (the CPU backend), [2, blocks, {bs}, {h}, {d}] "
                    f"(FlashAttention) or [blocks, 2, {bs}, {h}, {d}] (FlashInfer), every "
                    "layer alike and in one memory"
                )
            if _on_device(t) != self.device:
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is in "
                    f"{'device' if _on_device(t) else 'host'} memory and "
                    f"{names[0]!r} is not: every layer's cache must be on one device"
                )
            got.check(fp, name)
        self.num_blocks = int(shape[1] if self.kv_first and not self.cpu else shape[0])
        if self.device:
            #: per layer: the tensor as device memory numba reads (2-byte items as int16:
            #: torch's bfloat16 has no __cuda_array_interface__; bytes move as they are)
            self.arrays = [_device_view(t, fp) for t in tensors]
            self.movers = _rows_movers(block_size, fp)
            return
        arrays = [_host_view(t, fp, name) for name, t in zip(names, tensors, strict=True)]
        #: per layer: [blocks, heads, 2, bs, dim] (CPU) or the paged shape as registered
        self.arrays = (
            [a.reshape(self.num_blocks, h, 2, bs, d) for a in arrays] if self.cpu else arrays
        )
        #: the CPU layout's order inside a block (:mod:`.block_layout`), token-major rows
        #: unless ``layout`` (measured from vLLM's kernel) says otherwise
        order = layout if layout is not None else BlockLayout.rows(bs, d)
        self.movers = (Mover(order.k, fp.page_tokens), Mover(order.v, fp.page_tokens))
        if self.cpu:
            self._warm()

    def _warm(self) -> None:
        """Run each mover's kernels once on scratch memory of one block (never vLLM's), so
        the first load does not wait for them to compile (numba caches them per install)."""
        fp, p = self.fp, self.fp.page_tokens
        region = np.zeros((1, fp.n_kv_heads, self.block_size * fp.head_dim), self.arrays[0].dtype)
        page = np.zeros((1, p, fp.n_kv_heads, fp.head_dim), self.arrays[0].dtype)
        one = np.zeros(1, dtype=np.int64)
        for mover in self.movers:
            mover.take(region, one, one, page)
            mover.put(region, one, one, page)

    def source(self, block_ids: Sequence[int] | npt.NDArray[np.integer]) -> Any:
        """A request's blocks as a restore's destination and a park's source: in the engine's
        own memory, never a copy (:class:`CpuBlocks`, :class:`~stratastore.restore.PagedKV`,
        or on a device :class:`~stratastore.restore.DevicePagedKV`); ``Store.park(conv,
        pool.source(ids))`` streams a park out of the blocks (gathered, hashed and written by
        chunks, or on a device gathered and hashed there). The ids are checked here
        (:class:`DestinationRefused`: repeated, negative, past the pool, not integers)."""
        if self.cpu:
            return CpuBlocks(self.fp, self.arrays, block_ids, 0, self.block_size, self.movers)
        if self.device:
            return DevicePagedKV(self.fp, self.arrays, block_ids, kv_first=self.kv_first)
        return PagedKV(self.fp, self.arrays, block_ids, kv_first=self.kv_first)

    def destination(self, block_ids: Sequence[int] | npt.NDArray[np.integer], skip: int = 0) -> Any:
        """Where a restore into a request's blocks ``block_ids`` lands (token ``t`` in block
        ``block_ids[t // block_size]``), never below ``skip`` floored to a whole page (the
        blocks vLLM's own prefix cache holds, which other requests may share)."""
        skip = max(0, skip - skip % self.fp.page_tokens)
        if self.cpu:
            return CpuBlocks(self.fp, self.arrays, block_ids, skip, self.block_size, self.movers)
        dest = self.source(block_ids)
        return _SkipBelow(dest, skip) if skip else dest

    def copy(self, block_ids: Sequence[int] | npt.NDArray[np.integer], n_tokens: int) -> Any:
        """The first ``n_tokens`` tokens (whole pages) of a request as stored pages (spec
        F-SEG-4), in memory of their own, so the blocks are free to be reused once it returns:
        flat host bytes gathered by the park's own path
        (:meth:`~stratastore.restore.EngineCapture.pack`), or on a device a device array
        gathered there (``Store.park`` hashes it on the device)."""
        src = self.source(block_ids)
        _gathered_pages(self.fp, n_tokens, src.capacity(), len(block_ids))
        if self.device:
            return src.gather_pages_device([(0, n_tokens)])
        capture = as_engine_capture(self.fp, src, n_tokens, "StrataConnector: park")
        assert capture is not None  # every host source here has page views
        return capture.pack([(0, n_tokens)])


def _on_device(t: Any) -> bool:
    """Whether vLLM's tensor ``t`` is device memory (a torch CUDA tensor; an object with
    ``__cuda_array_interface__``)."""
    if is_torch_tensor(t):
        return bool(t.device.type != "cpu")
    return is_device_array(t)


@dataclass(frozen=True)
class _Described:
    """What the pool checks of one of vLLM's tensors, however it is given (torch, on the host
    or a device; an object with ``__cuda_array_interface__``; a numpy array)."""

    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    contiguous: bool

    @classmethod
    def of(cls, t: Any, name: str) -> _Described:
        if is_torch_tensor(t):
            shape = tuple(int(x) for x in t.shape)
            return cls(shape, str(t.dtype), int(t.element_size()), bool(t.is_contiguous()))
        if is_device_array(t):
            dev = as_device_array(t, f"vLLM's KV cache {name!r}", ConfigError)
            dt = np.dtype(dev.dtype)
            return cls(tuple(dev.shape), str(dt), dt.itemsize, bool(dev.is_c_contiguous()))
        a = np.asarray(t)
        return cls(a.shape, str(a.dtype), a.itemsize, bool(a.flags.c_contiguous))

    def check(self, fp: ModelFingerprint, name: str) -> None:
        """Refuse a cache of another item size, or one not laid out in its shape's order."""
        if self.itemsize != fp.dtype.itemsize or not self.contiguous:
            raise ConfigError(
                f"StrataConnector: vLLM's KV cache {name!r} is {self.dtype} (contiguous: "
                f"{self.contiguous}); {fp.describe()} needs {fp.dtype.itemsize}-byte items in "
                "the order of its shape (vLLM's NHD layout: a cache kept HND, "
                "VLLM_KV_CACHE_LAYOUT=HND, is a permuted view; run with "
                "VLLM_KV_CACHE_LAYOUT=NHD)"
            )


def _item_dtype(fp: ModelFingerprint) -> Any:
    return {1: np.uint8, 2: np.int16, 4: np.int32}[fp.dtype.itemsize]


def _host_view(t: Any, fp: ModelFingerprint, name: str) -> npt.NDArray[Any]:
    """vLLM's host tensor as a numpy array of the same memory (bfloat16 seen as 2-byte
    integers: bytes move as they are)."""
    if is_torch_tensor(t):
        import torch

        item = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[fp.dtype.itemsize]
        return cast("npt.NDArray[Any]", t.view(item).numpy())
    if not isinstance(t, np.ndarray):
        raise ConfigError(
            f"StrataConnector: vLLM's KV cache {name!r} is a {type(t).__name__}, not a tensor"
        )
    return t.view(_item_dtype(fp))


def _device_view(t: Any, fp: ModelFingerprint) -> Any:
    """vLLM's device tensor as memory numba reads through ``__cuda_array_interface__``: a
    torch tensor viewed as the integer of its item size (torch's bfloat16 has no interface)."""
    if is_torch_tensor(t):
        import torch

        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[fp.dtype.itemsize])
    return t


def _rows_movers(block_size: int, fp: ModelFingerprint) -> tuple[Mover, Mover]:
    rows = BlockLayout.rows(block_size, fp.head_dim)
    return Mover(rows.k, fp.page_tokens), Mover(rows.v, fp.page_tokens)


class _SkipBelow:
    """A restore into a paged destination (host or device) that never writes tokens below
    ``skip`` (a whole page: see :meth:`Pool.destination`): what it is asked to write or zero
    below that is left alone. It takes its inner destination's path (on the device when that
    one is) and zeroes through it."""

    read_direct = False

    def __init__(self, inner: Any, skip: int) -> None:
        self.inner, self.fp = inner, inner.fp
        self.skip = skip - skip % inner.fp.page_tokens
        self.on_device = bool(getattr(inner, "on_device", False))

    def capacity(self) -> int:
        return int(self.inner.capacity())

    def write_pages(self, token_start: int, n_tokens: int, data: Any, page_tokens: int) -> None:
        drop = min(max(0, self.skip - token_start), n_tokens)
        drop -= drop % page_tokens
        if drop < n_tokens:
            tb = self.fp.token_bytes
            self.inner.write_pages(
                token_start + drop, n_tokens - drop, data[drop * tb :], page_tokens
            )

    def zero(self, token_start: int, n_tokens: int) -> None:
        start = max(token_start, self.skip)
        if start < token_start + n_tokens:
            self.inner.zero(start, token_start + n_tokens - start)
