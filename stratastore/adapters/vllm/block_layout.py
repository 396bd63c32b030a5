"""Where a token's K and V lie inside one block of vLLM's CPU attention cache.

vLLM's CPU backend keeps per layer ``[num_blocks, n_kv_heads, block_size, 2 x head_dim]``:
per block and head a region of ``block_size x head_dim`` K items, then one of V items. Inside
a region the order is the attention ISA's own: token-major rows for some, tiles for others
(the ``vec`` ISAs keep K dim-major, one column of ``block_size`` items a dim, and V in rows;
AMX keeps K in tiles of 16 tokens with pairs of dims side by side, V in tiles of 16 tokens by
16 dims with pairs of tokens side by side). A whole block can be moved as it is, but a page of
the store (``page_tokens``, 16 by default) is part of a block, so the connector must know
which items are whose. :class:`BlockLayout` says it, as measured from vLLM's own kernel when the
pool is registered (:mod:`.cpu_layout`): for K and for V, the offset of item ``(t, d)`` in its
region.

A page is moved by :class:`Mover`, by a compiled kernel (:mod:`numba_kernels.block_moves`) for
the order this module knows it to be (token-major rows, dim-major columns, or AMX's tiles:
:data:`KNOWN`, each checked against the measured offsets, never assumed), else by the offsets
themselves (correct for any order). The numpy reference (:meth:`Mover.put_numpy`: a strided
view of the region for a known order, a gather by index for any other) moves what no kernel
takes (a negative stride, ids numpy alone would accept, a read-only destination) and is what
the kernels are tested equal to. Either way a page lands in, and is taken from, exactly the
items vLLM's kernel wrote for its tokens. No vLLM import."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from numba_kernels import block_moves

__all__ = ["KNOWN", "BlockLayout", "Kernel", "Mover", "Strided"]


@dataclass(frozen=True)
class BlockLayout:
    """Per kind (``k``, ``v``), ``[block_size, head_dim]`` offsets: where item ``(t, d)`` of a
    head's region of one block lies (a permutation of ``0 .. block_size x head_dim - 1``)."""

    k: npt.NDArray[np.int64]
    v: npt.NDArray[np.int64]

    @classmethod
    def rows(cls, block_size: int, head_dim: int) -> BlockLayout:
        """Token-major: item ``(t, d)`` at ``t x head_dim + d`` (K rows, then V rows)."""
        offsets = np.arange(block_size * head_dim, dtype=np.int64).reshape(block_size, head_dim)
        return cls(offsets, offsets)


@dataclass(frozen=True)
class Strided:
    """A region's order as a view: the region reshaped to ``shape`` and transposed by
    ``axes`` is ``[block_size / tile, *tile_t, *tile_d]``, where ``tile_t`` splits a tile's
    ``tile`` tokens and ``tile_d`` the head's dims (both in C order)."""

    tile: int
    shape: tuple[int, ...]
    axes: tuple[int, ...]
    tile_t: tuple[int, ...]
    tile_d: tuple[int, ...]

    def offsets(self) -> npt.NDArray[np.int64]:
        """The ``[block_size, head_dim]`` offsets this order gives."""
        size, head_dim = int(np.prod(self.shape)), int(np.prod(self.tile_d))
        tiles = np.arange(size, dtype=np.int64).reshape(self.shape).transpose(self.axes)
        return tiles.reshape(-1, head_dim)


def _rows(bs: int, d: int, page: int) -> Strided:
    return Strided(page, (bs // page, page, d), (0, 1, 2), (page,), (d,))


def _columns(bs: int, d: int, page: int) -> Strided:
    return Strided(page, (d, bs // page, page), (1, 2, 0), (page,), (d,))


def _amx_k(bs: int, d: int, page: int) -> Strided:
    return Strided(16, (bs // 16, d // 2, 16, 2), (0, 2, 1, 3), (16,), (d // 2, 2))


def _amx_v(bs: int, d: int, page: int) -> Strided:
    return Strided(16, (d // 16, bs // 16, 8, 16, 2), (1, 2, 4, 0, 3), (8, 2), (d // 16, 16))


#: the orders a region may have, tried in turn: (name, its view for a block size, head dim and
#: page, when those allow it)
KNOWN: tuple[
    tuple[str, Callable[[int, int, int], Strided], Callable[[int, int, int], bool]], ...
] = (
    ("rows", _rows, lambda bs, d, p: bs % p == 0),
    ("columns", _columns, lambda bs, d, p: bs % p == 0),
    ("amx K", _amx_k, lambda bs, d, p: bs % 16 == 0 and d % 2 == 0 and p % 16 == 0),
    ("amx V", _amx_v, lambda bs, d, p: bs % 16 == 0 and d % 16 == 0 and p % 16 == 0),
)


@dataclass(frozen=True)
class Kernel:
    """How :class:`Mover` moves a layer's pages for one item size: the kernels of
    :mod:`numba_kernels.block_moves` (``put``, ``take``), the unit width in bytes each side is
    seen in (``region_unit``, ``pages_unit``) and the kernel's arguments after the ids."""

    name: str
    put: Callable[..., None]
    take: Callable[..., None]
    region_unit: int
    pages_unit: int
    args: tuple[Any, ...]


class Mover:
    """Moves pages of ``page`` tokens between the stored layout and one kind's regions of a
    layer's blocks (``region``: ``[num_blocks, n_kv_heads, block_size x head_dim]``, a view of
    vLLM's memory), by the kernel of the :data:`KNOWN` order that matches ``offsets``, else by
    the offsets."""

    def __init__(self, offsets: npt.NDArray[np.int64], page: int) -> None:
        bs, d = offsets.shape
        self.page, self.bs, self.d = page, bs, d
        self.view: Strided | None = None
        self.name = "offsets"
        for name, make, fits in KNOWN:
            if fits(bs, d, page) and np.array_equal(make(bs, d, page).offsets(), offsets):
                self.view, self.name = make(bs, d, page), name
                break
        #: per page of a block, its items' offsets ([pages of a block, page, head_dim])
        self.index = offsets.reshape(bs // page, page, d)
        self._kernels: dict[int, tuple[Kernel, ...]] = {}

    def kernels(self, itemsize: int) -> tuple[Kernel, ...]:
        """The kernels that move items of ``itemsize`` bytes, fastest first: this order's own
        (for 2-byte items), then by the offsets in the widest unit they allow, then by the
        offsets item by item (which any array with positive strides allows)."""
        if itemsize not in self._kernels:
            self._kernels[itemsize] = (*self._own(itemsize), *self._by_offsets(itemsize))
        return self._kernels[itemsize]

    def _own(self, itemsize: int) -> tuple[Kernel, ...]:
        bm, p, bs, d = block_moves, self.page, self.bs, self.d
        if self.name == "rows":
            run = max(k for k in (1, 2, 4) if k * itemsize <= 8 and d % k == 0)
            unit = run * itemsize
            return (Kernel("rows", bm.put_rows, bm.take_rows, unit, unit, (p, d // run)),)
        if itemsize != 2:  # the tiles' kernels pack 2-byte items into wider units
            return ()
        if self.name == "columns" and d % 2 == 0 and p % 2 == 0:
            args = (p, bs, d // 2)
            return (Kernel("columns", bm.put_columns, bm.take_columns, 4, 4, args),)
        if self.name == "amx K":
            return (Kernel("amx K", bm.put_amx_k, bm.take_amx_k, 4, 4, (p, d // 2)),)
        if self.name == "amx V":
            return (Kernel("amx V", bm.put_amx_v, bm.take_amx_v, 8, 4, (p, bs, d // 16)),)
        return ()

    def _by_offsets(self, itemsize: int) -> tuple[Kernel, ...]:
        """Offsets in units of the widest run of items every row keeps side by side and
        aligned (pairs of dims in AMX's K, whole rows in token-major ones), then of items."""
        out = []
        for run in (4, 2, 1):
            if run * itemsize > 8 or self.d % run:
                continue
            first = self.index[..., ::run]
            if first.size and (first % run).any():
                continue
            if not all(np.array_equal(self.index[..., k::run], first + k) for k in range(run)):
                continue
            index = np.ascontiguousarray(first // run, dtype=np.int32)
            unit = run * itemsize
            put, take = block_moves.put_by_offsets, block_moves.take_by_offsets
            out.append(Kernel(f"offsets x{run}", put, take, unit, unit, (index,)))
        return tuple(out)

    def by_kernel(
        self,
        region: npt.NDArray[Any],
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        pages: npt.NDArray[Any],
        put: bool,
    ) -> Kernel | None:
        """:meth:`put` (or :meth:`take`, ``put=False``) by the first kernel that takes these
        arrays, and that kernel; None, having moved nothing, when none does (ids, shapes or
        flags that a kernel's unchecked indexing must not see, arrays no unit view fits)."""
        written = region if put else pages
        if (
            region.ndim != 3
            or bids.ndim != 1
            or bids.dtype.kind not in "iu"
            or subs.dtype.kind not in "iu"
            or region.shape[2] != self.bs * self.d
            or pages.shape != (bids.shape[0], self.page, region.shape[1], self.d)
            or subs.shape != bids.shape
            or pages.itemsize != region.itemsize
            or not written.flags.writeable
        ):
            return None
        if bids.size and (
            min(bids.min(), subs.min()) < 0
            or bids.max() >= region.shape[0]
            or subs.max() >= self.bs // self.page
        ):
            return None
        h = region.shape[1]
        b, s = bids.astype(np.int64, copy=False), subs.astype(np.int64, copy=False)
        for k in self.kernels(region.itemsize):
            try:
                rflat, (rb, rh, _) = block_moves.units(region, k.region_unit)
                pflat, (pn, pt, ph, _) = block_moves.units(pages, k.pages_unit)
            except ValueError:
                continue
            (k.put if put else k.take)(rflat, rb, rh, pflat, pn, pt, ph, b, s, h, *k.args)
            return k
        return None

    def _tiles(self, region: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """``region`` as ``[blocks, heads, tiles, *tile_t, *tile_d]`` (a view)."""
        assert self.view is not None
        v = self.view
        shaped = region.reshape(*region.shape[:2], *v.shape)
        return shaped.transpose(0, 1, *(2 + a for a in v.axes))

    def _split(self, pages: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """Stored pages of one kind, ``[n, page, heads, head_dim]``, as ``[n, tiles of a page,
        heads, *tile_t, *tile_d]`` (a view)."""
        assert self.view is not None
        v, n, h = self.view, pages.shape[0], pages.shape[2]
        m = self.page // v.tile
        split = pages.reshape(n, m, *v.tile_t, h, *v.tile_d)
        nt, nd = len(v.tile_t), len(v.tile_d)
        order = (0, 1, 2 + nt, *range(2, 2 + nt), *range(3 + nt, 3 + nt + nd))
        return split.transpose(order)

    def _where(
        self, bids: npt.NDArray[np.int64], subs: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        assert self.view is not None
        m = self.page // self.view.tile
        return bids[:, None], subs[:, None] * m + np.arange(m)

    def put(
        self,
        region: npt.NDArray[Any],
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        pages: npt.NDArray[Any],
    ) -> None:
        """Write ``pages`` (``[n, page, heads, head_dim]``, this kind's stored items) to page
        ``subs[i]`` of block ``bids[i]``."""
        if self.by_kernel(region, bids, subs, pages, put=True) is None:
            self.put_numpy(region, bids, subs, pages)

    def take(
        self,
        region: npt.NDArray[Any],
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        out: npt.NDArray[Any],
    ) -> None:
        """Page ``subs[i]`` of block ``bids[i]`` into ``out`` (``[n, page, heads, head_dim]``,
        this kind's stored items; a view of the park's pages)."""
        if self.by_kernel(region, bids, subs, out, put=False) is None:
            self.take_numpy(region, bids, subs, out)

    def put_numpy(
        self,
        region: npt.NDArray[Any],
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        pages: npt.NDArray[Any],
    ) -> None:
        """:meth:`put` by numpy alone (the reference the kernels are tested equal to)."""
        if self.view is not None:
            b, t = self._where(bids, subs)
            self._tiles(region)[b, :, t] = self._split(pages)
        else:
            region[bids[:, None, None], :, self.index[subs]] = pages.transpose(0, 1, 3, 2)

    def take_numpy(
        self,
        region: npt.NDArray[Any],
        bids: npt.NDArray[np.int64],
        subs: npt.NDArray[np.int64],
        out: npt.NDArray[Any],
    ) -> None:
        """:meth:`take` by numpy alone (the reference the kernels are tested equal to)."""
        if self.view is not None:
            b, t = self._where(bids, subs)
            self._split(out)[...] = self._tiles(region)[b, :, t]
        else:
            out[...] = region[bids[:, None, None], :, self.index[subs]].transpose(0, 1, 3, 2)
