"""vLLM's K/V pool as the store sees it: each attention layer's cache tensor as a numpy view of
the same memory (never a copy), in layer order, checked against the model's fingerprint and
vLLM's block size when vLLM registers it. A restore lands in it in place
(:meth:`Pool.destination`), a park gathers from it (:meth:`Pool.gather`), both in whole pages
of the store.

A page of the store (``fp.page_tokens`` tokens, 16 by default) is not a block of vLLM's pool
(``block_size`` tokens, 128 on vLLM's CPU backend): a block holds ``block_size //
page_tokens`` whole pages (the pool refuses a block size that is not a multiple of the page),
and token ``t`` of a request lives in block ``block_ids[t // block_size]`` at slot ``t %
block_size``. So a page is part of a block, a restore may end mid-block (the rest of that
block is left as it was) and a park may take a block's first pages only.

Two layouts, told apart by the tensors' shape:

* vLLM's CPU attention backend: per layer ``[num_blocks, n_kv_heads, block_size, 2 x head_dim]``,
  each block per head a region of its ``block_size`` tokens' K, then one of their V
  (``[..., 2, block_size x head_dim]`` in memory), each region in the attention ISA's own
  order (:mod:`.block_layout`: token-major rows, dim-major columns, AMX's tiles), measured from
  vLLM's kernel when the pool is registered: :class:`CpuBlocks`;
* the paged layout of the GPU backends, ``[2, num_blocks, block_size, n_kv_heads, head_dim]``:
  :class:`~stratastore.restore.PagedKV`.

A page's K/V is moved to and from the stored page layout (spec F-SEG-4: per layer K then V,
each ``[page_tokens, n_kv_heads, head_dim]``, token-major), so a restore gives back exactly the
items vLLM's kernel wrote for those tokens, whichever part of a block they are. Each move is
one assignment per layer and kind over all the pages (a strided view of the block's order, or
its measured offsets), never a copy per page. Block ids are checked when a destination is made
or a park gathers (:func:`~stratastore.restore.checked_block_table`): an id outside the pool or
given twice is refused before a byte moves. Only torch is imported here (vLLM's tensors),
lazily."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.adapters.vllm.block_layout import BlockLayout, Mover
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.restore import DestinationRefused, PagedKV, checked_block_table

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
    staged (validated pages are copied in, one assignment per layer)."""

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
        for layer, regions in enumerate(self.regions):
            for kind, (mover, region) in enumerate(zip(self.movers, regions, strict=True)):
                mover.put(region, bids, subs, pages[:, layer, kind])

    def gather(self, n_tokens: int) -> npt.NDArray[np.uint8]:
        """The first ``n_tokens`` tokens (whole pages) as stored pages, flat bytes (a copy)."""
        fp = self.fp
        n = _gathered_pages(fp, n_tokens, self.capacity(), int(self.ids.size))
        out = np.empty(
            (n, fp.n_layers, 2, self.page, fp.n_kv_heads, fp.head_dim), dtype=self.blocks[0].dtype
        )
        bids, subs = _page_slots(self.ids, 0, n, self.per_block)
        for layer, regions in enumerate(self.regions):
            for kind, (mover, region) in enumerate(zip(self.movers, regions, strict=True)):
                mover.take(region, bids, subs, out[:, layer, kind])
        return out.reshape(-1).view(np.uint8)


class Pool:
    """The engine's pool (see the module) of blocks of ``block_size`` tokens (vLLM's), refused
    with a typed error at start-up when its tensors are not the model's (another shape, dtype
    or device) or its blocks do not hold whole pages of the store."""

    def __init__(
        self,
        fp: ModelFingerprint,
        caches: Mapping[str, Any],
        block_size: int,
        layout: BlockLayout | None = None,
    ) -> None:
        _check_block_size(fp, block_size)
        import torch

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
        bs, h, d = block_size, fp.n_kv_heads, fp.head_dim
        shape = tuple(tensors[0].shape)
        self.cpu = len(shape) == 4 and shape[1:] == (h, bs, 2 * d)
        paged = len(shape) == 5 and shape[0] == 2 and shape[2:] == (bs, h, d)
        for name, t in zip(names, tensors, strict=True):
            if not (self.cpu or paged) or tuple(t.shape) != shape:
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is {tuple(t.shape)} of "
                    f"{t.dtype}; {fp.describe()} in blocks of {bs} needs [blocks, {h}, {bs}, "
                    f"{2 * d}] (the CPU backend) or [2, blocks, {bs}, {h}, {d}], every layer "
                    "alike"
                )
            if t.element_size() != fp.dtype.itemsize or not t.is_contiguous():
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is {t.dtype} "
                    f"(contiguous: {t.is_contiguous()}); {fp.describe()} needs "
                    f"{fp.dtype.itemsize}-byte items, in place"
                )
            if t.device.type != "cpu":
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is on {t.device}; "
                    "this connector reads and writes host memory"
                )
        item = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[fp.dtype.itemsize]
        #: the same memory as numpy (bfloat16 seen as 2-byte integers: bytes move as they are)
        arrays = [t.view(item).numpy() for t in tensors]
        self.num_blocks = int(shape[0] if self.cpu else shape[1])
        #: per layer: [blocks, heads, 2, bs, dim] (CPU) or [2, blocks, bs, heads, dim] (paged)
        self.arrays = (
            [a.reshape(self.num_blocks, h, 2, bs, d) for a in arrays] if self.cpu else arrays
        )
        #: the CPU layout's order inside a block (:mod:`.block_layout`), token-major rows
        #: unless ``layout`` (measured from vLLM's kernel) says otherwise
        order = layout if layout is not None else BlockLayout.rows(bs, d)
        p = fp.page_tokens
        self.movers = (Mover(order.k, p), Mover(order.v, p))

    def destination(self, block_ids: Sequence[int] | npt.NDArray[np.integer], skip: int = 0) -> Any:
        """Where a restore into a request's blocks ``block_ids`` lands (token ``t`` in block
        ``block_ids[t // block_size]``), never below ``skip`` floored to a whole page; the ids
        are checked here (:class:`DestinationRefused`: repeated, negative, past the pool, not
        integers)."""
        skip = max(0, skip - skip % self.fp.page_tokens)
        if self.cpu:
            return CpuBlocks(self.fp, self.arrays, block_ids, skip, self.block_size, self.movers)
        dest = PagedKV(self.fp, self.arrays, block_ids)
        if skip:  # its pages below skip go to blocks vLLM's prefix cache shares: staged
            return _SkipBelow(dest, skip)
        return dest

    def gather(
        self, block_ids: Sequence[int] | npt.NDArray[np.integer], n_tokens: int
    ) -> npt.NDArray[np.uint8]:
        """The first ``n_tokens`` tokens (whole pages) of a request as stored pages, flat bytes
        (spec F-SEG-4: per page, per layer, K then V, each ``[page_tokens, n_kv_heads,
        head_dim]``): a copy, the blocks are free to be reused once it returns. The ids are
        checked as a destination's are."""
        if self.cpu:
            blocks = CpuBlocks(self.fp, self.arrays, block_ids, 0, self.block_size, self.movers)
            return blocks.gather(n_tokens)
        fp, p, bs = self.fp, self.fp.page_tokens, self.block_size
        ids = checked_block_table(block_ids, self.num_blocks, bs, "vLLM's block table")
        n = _gathered_pages(fp, n_tokens, int(ids.size) * bs, int(ids.size))
        out = np.empty(
            (n, fp.n_layers, 2, p, fp.n_kv_heads, fp.head_dim), dtype=self.arrays[0].dtype
        )
        bids, subs = _page_slots(ids, 0, n, bs // p)
        for layer, a in enumerate(self.arrays):  # [2, blocks, pages of a block, p, heads, dim]
            a6 = a.reshape(2, self.num_blocks, bs // p, p, fp.n_kv_heads, fp.head_dim)
            out[:, layer] = a6[:, bids, subs].transpose(1, 0, 2, 3, 4)
        return out.reshape(-1).view(np.uint8)


class _SkipBelow:
    """A restore into a :class:`PagedKV` that never writes tokens below ``skip`` (a whole page:
    see :meth:`Pool.destination`), staged."""

    read_direct = False

    def __init__(self, inner: PagedKV, skip: int) -> None:
        self.inner, self.fp = inner, inner.fp
        self.skip = skip - skip % inner.fp.page_tokens

    def capacity(self) -> int:
        return self.inner.capacity()

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        drop = min(max(0, self.skip - token_start), n_tokens)
        drop -= drop % page_tokens
        if drop < n_tokens:
            tb = self.fp.token_bytes
            self.inner.write_pages(
                token_start + drop, n_tokens - drop, data[drop * tb :], page_tokens
            )
