"""vLLM's K/V pool as the store sees it: each attention layer's cache tensor as a numpy view of
the same memory (never a copy), in layer order, checked against the model's fingerprint when
vLLM registers it. A restore lands in it in place (:meth:`Pool.destination`), a park gathers
from it (:meth:`Pool.gather`), both in whole blocks: a page of the store is one block.

Two layouts, told apart by the tensors' shape:

* vLLM's CPU attention backend: per layer ``[num_blocks, n_kv_heads, block_size, 2 x head_dim]``,
  each block per head its ``block_size`` K rows then its V rows (``[..., 2 x block_size,
  head_dim]`` in memory): :class:`CpuBlocks`;
* the paged layout of the GPU backends, ``[2, num_blocks, block_size, n_kv_heads, head_dim]``:
  :class:`~stratastore.restore.PagedKV`.

A block's K/V is moved to and from the stored page layout (spec F-SEG-4: per layer K then V,
each ``[block_size, n_kv_heads, head_dim]``) as a permutation of its elements, so a restore
gives back exactly the bytes a park took, whatever the backend keeps inside a row (the
attention ISA is in the fingerprint: :func:`.plan.fingerprint`). Only torch is imported here
(vLLM's tensors), lazily."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.restore import DestinationRefused, PagedKV

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


class CpuBlocks:
    """A restore destination on the CPU backend's blocks (see the module): the pages of tokens
    ``[i x block_size, ...)`` land in block ``block_ids[i]`` of every layer, never a token
    below ``skip`` (vLLM's own prefix cache holds those, in blocks other requests may share).
    Whole pages only; staged (validated pages are copied in, one permutation per layer)."""

    read_direct = False

    def __init__(
        self,
        fp: ModelFingerprint,
        blocks: Sequence[npt.NDArray[Any]],
        block_ids: Sequence[int],
        skip: int = 0,
    ) -> None:
        self.fp, self.blocks, self.skip = fp, blocks, skip
        self.ids = np.asarray(block_ids, dtype=np.int64)
        self.bs = fp.page_tokens

    def capacity(self) -> int:
        return int(self.ids.size) * self.bs

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        bs, fp = self.bs, self.fp
        if token_start % bs or n_tokens % bs or page_tokens != bs:
            end = token_start + n_tokens
            raise DestinationRefused(
                f"StrataConnector: a restore of tokens [{token_start}, "
                f"{end}) is not whole blocks of {bs}"
            )
        drop = min(max(0, self.skip - token_start), n_tokens)
        first, n = (token_start + drop) // bs, (n_tokens - drop) // bs
        if n <= 0:
            return
        item = self.blocks[0].dtype
        pages = data[drop * fp.token_bytes : (drop + n * bs) * fp.token_bytes].view(item)
        pages = pages.reshape(n, fp.n_layers, 2, bs, fp.n_kv_heads, fp.head_dim)
        ids = self.ids[first : first + n]
        for layer, blk in enumerate(self.blocks):  # [blocks, heads, 2, bs, dim]
            blk[ids] = pages[:, layer].transpose(0, 3, 1, 2, 4)

    def gather(self, n_blocks: int) -> npt.NDArray[np.uint8]:
        """The first ``n_blocks`` blocks as stored pages (a copy)."""
        fp, ids = self.fp, self.ids[:n_blocks]
        out = np.empty(
            (n_blocks, fp.n_layers, 2, self.bs, fp.n_kv_heads, fp.head_dim),
            dtype=self.blocks[0].dtype,
        )
        for i, b in enumerate(ids.tolist()):  # one strided copy a block and layer, no temporary
            for layer, blk in enumerate(self.blocks):
                np.copyto(out[i, layer], blk[b].transpose(1, 2, 0, 3))
        return out.reshape(-1).view(np.uint8)


class Pool:
    """The engine's pool (see the module), refused with a typed error at start-up when its
    tensors are not the model's (another shape, dtype or device)."""

    def __init__(self, fp: ModelFingerprint, caches: Mapping[str, Any]) -> None:
        import torch

        self.fp = fp
        names = layer_order(list(caches))
        if len(names) != fp.n_layers:
            raise ConfigError(
                f"StrataConnector: vLLM registered {len(names)} KV caches; the "
                f"model has {fp.n_layers} attention layers ({fp.describe()}): "
                "models with layers of other kinds (sliding windows, mamba, MLA) "
                "are not supported"
            )
        tensors = [caches[n] for n in names]
        bs, h, d = fp.page_tokens, fp.n_kv_heads, fp.head_dim
        shape = tuple(tensors[0].shape)
        self.cpu = len(shape) == 4 and shape[1:] == (h, bs, 2 * d)
        paged = len(shape) == 5 and shape[0] == 2 and shape[2:] == (bs, h, d)
        for name, t in zip(names, tensors, strict=True):
            if not (self.cpu or paged) or tuple(t.shape) != shape:
                raise ConfigError(
                    f"StrataConnector: vLLM's KV cache {name!r} is {tuple(t.shape)} of "
                    f"{t.dtype}; {fp.describe()} needs [blocks, {h}, {bs}, {2 * d}] (the CPU "
                    f"backend) or [2, blocks, {bs}, {h}, {d}], every layer alike"
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

    def destination(self, block_ids: Sequence[int], skip: int = 0) -> Any:
        """Where a restore into a request's blocks ``block_ids`` lands, never below ``skip``."""
        if self.cpu:
            return CpuBlocks(self.fp, self.arrays, block_ids, skip)
        if skip:  # its pages below skip go to blocks vLLM's prefix cache shares: staged
            return _SkipBelow(PagedKV(self.fp, self.arrays, list(block_ids)), skip)
        return PagedKV(self.fp, self.arrays, list(block_ids))

    def gather(self, block_ids: Sequence[int], n_blocks: int) -> npt.NDArray[np.uint8]:
        """The first ``n_blocks`` blocks of a request as stored pages (a copy: the blocks are
        free to be reused once it returns)."""
        if self.cpu:
            return CpuBlocks(self.fp, self.arrays, block_ids).gather(n_blocks)
        fp, ids = self.fp, np.asarray(block_ids[:n_blocks], dtype=np.int64)
        out = np.empty(
            (n_blocks, fp.n_layers, 2, fp.page_tokens, fp.n_kv_heads, fp.head_dim),
            dtype=self.arrays[0].dtype,
        )
        for layer, a in enumerate(self.arrays):
            out[:, layer] = a[:, ids].transpose(1, 0, 2, 3, 4)
        return out.reshape(-1).view(np.uint8)


class _SkipBelow:
    """A restore into a :class:`PagedKV` that never writes tokens below ``skip`` (staged)."""

    read_direct = False

    def __init__(self, inner: PagedKV, skip: int) -> None:
        self.inner, self.skip, self.fp = inner, skip, inner.fp

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
