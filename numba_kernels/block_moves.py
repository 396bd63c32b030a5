"""Host kernels that move pages of tokens between the stored page layout and the regions of
vLLM's CPU cache blocks. :class:`stratastore.adapters.vllm.block_layout.Mover` calls them; its
numpy views are the reference they are tested equal to (tests/unit/adapters/
test_vllm_block_moves.py).

Every kernel takes flat, contiguous 1-D arrays of unsigned *units* (:func:`units`: an item, or
a run of 2 or 4 items that an order keeps side by side, moved as one integer) and strides in
units:

* ``region``: unit ``o`` of head ``h`` of block ``b`` at ``b * rb + h * rh + o``;
* ``pages``: unit ``x`` of head ``h`` of token ``t`` of page ``i`` at ``i * pn + t * pt + h *
  ph + x`` (a head's row of ``dim`` items is contiguous);
* ``bids[i]``, ``subs[i]``: page ``i`` is page ``subs[i]`` (of ``page`` tokens) of block
  ``bids[i]``.

``put_*`` writes the pages into the regions, ``take_*`` the regions' items into the pages: two
kernels an order, so that the side only read may be a read-only array. The kernels index
without bounds checks (the caller checks every id and shape first) and run without the GIL,
one layer and kind a call, so a caller may move layers on threads. Their loop orders are the
fastest of those measured (tests/bench/test_bench_block_moves.py, 512 MiB): a page's items of
one head lie within a few KiB on either side, so the side read out of order is in L1, and what
decides is how the far memory is walked. Numba leaves these loops scalar (they are short and
the arrays may alias), so the tiles' kernels move wide units and shift 2-byte halves in
registers instead of moving items one by one.

The orders, for a block of ``block`` tokens and heads of ``dim`` 2-byte items (``T``: a token
of the block, ``x``: a dim):

* rows (:func:`put_rows`): ``(T, x)`` at ``T * dim + x``; any item size, units of up to 8
  bytes;
* columns (:func:`put_columns`, the ``vec`` ISAs' K): at ``x * block + T``; 4-byte units on
  both sides (two tokens of a column; two dims of a token);
* AMX's K (:func:`put_amx_k`): tiles of 16 tokens, pairs of dims side by side: a pair ``j``
  (4 bytes, one unit on both sides) at ``(T // 16) * 16 * (dim / 2) + j * 16 + T % 16``;
* AMX's V (:func:`put_amx_v`): tiles of 16 tokens by 16 dims, pairs of tokens side by side:
  ``(T, x)`` at ``(x // 16) * block * 16 + (T // 16) * 256 + (T % 16 // 2) * 32 + (x % 16) *
  2 + T % 2``; 8-byte region units (two dims of a pair of tokens), 4-byte page units (a
  token's pair of dims);
* any other (:func:`put_by_offsets`): unit ``x`` of token ``t`` of page ``p`` of a block at
  ``index[p, t, x]``; any item size.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit
from numpy.lib.stride_tricks import as_strided

__all__ = [
    "put_amx_k",
    "put_amx_v",
    "put_by_offsets",
    "put_columns",
    "put_rows",
    "take_amx_k",
    "take_amx_v",
    "take_by_offsets",
    "take_columns",
    "take_rows",
    "units",
]

#: unsigned integer of each unit width in bytes
_UNIT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def units(a: npt.NDArray[np.generic], nbytes: int) -> tuple[npt.NDArray[np.generic], list[int]]:
    """``a``'s memory from its first item to its last as one contiguous 1-D array of
    ``nbytes``-byte units, and ``a``'s strides in units (the last, contiguous axis counts units
    too). Raises :class:`ValueError` when ``a`` cannot be seen so: a negative stride or one
    that is not whole units, a last axis that is not contiguous or not whole units. (A start
    that is not a multiple of ``nbytes`` is allowed: numba reads such an array unaligned.)"""
    item = a.itemsize
    *outer, last = a.strides
    if (
        a.size == 0
        or a.ndim == 0
        or last != item
        or (a.shape[-1] * item) % nbytes
        or any(s < 0 or s % nbytes for s in outer)
    ):
        raise ValueError(f"an array of strides {a.strides} is not whole {nbytes}-byte units")
    span = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True)) + item
    flat = as_strided(a, shape=(span // item,), strides=(item,))
    return flat.view(_UNIT[nbytes]), [s // nbytes for s in outer] + [1]


# -- rows ------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def put_rows(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, dim):  # type: ignore[no-untyped-def]
    """Rows: a page is ``page * dim`` consecutive units of each head's region."""
    for i in range(bids.size):
        r0 = bids[i] * rb + subs[i] * page * dim
        for t in range(page):
            for h in range(heads):
                r, s = r0 + h * rh + t * dim, i * pn + t * pt + h * ph
                for x in range(dim):
                    region[r + x] = pages[s + x]


@njit(nogil=True, cache=True)
def take_rows(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, dim):  # type: ignore[no-untyped-def]
    for i in range(bids.size):
        r0 = bids[i] * rb + subs[i] * page * dim
        for t in range(page):
            for h in range(heads):
                r, s = r0 + h * rh + t * dim, i * pn + t * pt + h * ph
                for x in range(dim):
                    pages[s + x] = region[r + x]


# -- columns: 4-byte units on both sides (a column's pair of tokens; a token's pair of dims) --


@njit(nogil=True, cache=True)
def put_columns(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, block, pairs):  # type: ignore[no-untyped-def]
    """Columns: dim ``x`` of a page's tokens is ``page`` consecutive items at ``x * block +
    subs * page``. Two tokens' pairs of dims (``a``, ``b``: two page units) make the two
    tokens' items of two columns (two region units); ``page`` and ``block`` are even."""
    lo, s16 = np.uint32(0xFFFF), np.uint32(16)
    half = block // 2  # a column's units
    for i in range(bids.size):
        for h in range(heads):
            r = bids[i] * rb + h * rh + subs[i] * page // 2
            s = i * pn + h * ph
            for j in range(pairs):
                r0 = r + 2 * j * half
                for u in range(page // 2):
                    a = pages[s + 2 * u * pt + j]
                    b = pages[s + (2 * u + 1) * pt + j]
                    region[r0 + u] = (a & lo) | (b << s16)
                    region[r0 + half + u] = (a >> s16) | (b & ~lo)


@njit(nogil=True, cache=True)
def take_columns(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, block, pairs):  # type: ignore[no-untyped-def]
    lo, s16 = np.uint32(0xFFFF), np.uint32(16)
    half = block // 2
    for i in range(bids.size):
        for h in range(heads):
            r = bids[i] * rb + h * rh + subs[i] * page // 2
            s = i * pn + h * ph
            for u in range(page // 2):
                s0 = s + 2 * u * pt
                for j in range(pairs):
                    c0 = region[r + 2 * j * half + u]
                    c1 = region[r + (2 * j + 1) * half + u]
                    pages[s0 + j] = (c0 & lo) | (c1 << s16)
                    pages[s0 + pt + j] = (c0 >> s16) | (c1 & ~lo)


# -- AMX's K: 4-byte units (a pair of dims) on both sides ------------------------------------


@njit(nogil=True, cache=True)
def put_amx_k(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, pairs):  # type: ignore[no-untyped-def]
    """AMX's K: per tile of 16 tokens, ``pairs`` columns of 16 units (``page`` is a multiple
    of 16)."""
    for i in range(bids.size):
        for h in range(heads):
            base = bids[i] * rb + h * rh + subs[i] * page * pairs
            s = i * pn + h * ph
            for tt in range(0, page, 16):
                r, st = base + tt * pairs, s + tt * pt
                for j in range(pairs):
                    for t in range(16):
                        region[r + j * 16 + t] = pages[st + t * pt + j]


@njit(nogil=True, cache=True)
def take_amx_k(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, pairs):  # type: ignore[no-untyped-def]
    for i in range(bids.size):
        r0 = bids[i] * rb + subs[i] * page * pairs
        for t in range(page):
            rt = r0 + (t // 16) * 16 * pairs + t % 16
            for h in range(heads):
                r, s = rt + h * rh, i * pn + t * pt + h * ph
                for j in range(pairs):
                    pages[s + j] = region[r + j * 16]


# -- AMX's V: 8-byte region units (2 dims x 2 tokens), 4-byte page units (2 dims) ------------


@njit(nogil=True, cache=True)
def put_amx_v(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, block, groups):  # type: ignore[no-untyped-def]
    """AMX's V: per tile of 16 tokens, pair of tokens ``a`` and group ``c`` of 16 dims
    (``groups`` of them), 8 region units (dims ``2e, 2e + 1`` of tokens ``2a, 2a + 1``) from
    units ``e`` of the two tokens' rows (``page`` is a multiple of 16)."""
    lo, s16, s32, s48 = np.uint64(0xFFFF), np.uint64(16), np.uint64(32), np.uint64(48)
    for i in range(bids.size):
        for h in range(heads):
            r0 = bids[i] * rb + h * rh + subs[i] * page * 4
            s = i * pn + h * ph
            for tt in range(0, page, 16):
                for a in range(8):
                    ra, s0 = r0 + tt * 4 + a * 8, s + (tt + 2 * a) * pt
                    for c in range(groups):
                        r, sc = ra + c * block * 4, s0 + c * 8
                        for e in range(8):
                            p0 = np.uint64(pages[sc + e])
                            p1 = np.uint64(pages[sc + pt + e])
                            region[r + e] = (
                                (p0 & lo)
                                | ((p1 & lo) << s16)
                                | ((p0 >> s16) << s32)
                                | ((p1 >> s16) << s48)
                            )


@njit(nogil=True, cache=True)
def take_amx_v(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, page, block, groups):  # type: ignore[no-untyped-def]
    lo, hi = np.uint64(0xFFFF), np.uint64(0xFFFF0000)
    s16, s32 = np.uint64(16), np.uint64(32)
    for i in range(bids.size):
        for h in range(heads):
            r0 = bids[i] * rb + h * rh + subs[i] * page * 4
            s = i * pn + h * ph
            for tt in range(0, page, 16):
                for a in range(8):
                    ra, s0 = r0 + tt * 4 + a * 8, s + (tt + 2 * a) * pt
                    for c in range(groups):
                        r, sc = ra + c * block * 4, s0 + c * 8
                        for e in range(8):
                            q = region[r + e]
                            pages[sc + e] = np.uint32((q & lo) | ((q >> s16) & hi))
                            pages[sc + pt + e] = np.uint32(((q >> s16) & lo) | ((q >> s32) & hi))


# -- any order, by its offsets ---------------------------------------------------------------


@njit(nogil=True, cache=True)
def put_by_offsets(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, index):  # type: ignore[no-untyped-def]
    """Any order: ``index`` is ``[pages of a block, page, units of a head's row]``."""
    page, dim = index.shape[1], index.shape[2]
    for i in range(bids.size):
        idx = index[subs[i]]
        for t in range(page):
            for h in range(heads):
                r, s = bids[i] * rb + h * rh, i * pn + t * pt + h * ph
                for x in range(dim):
                    region[r + idx[t, x]] = pages[s + x]


@njit(nogil=True, cache=True)
def take_by_offsets(region, rb, rh, pages, pn, pt, ph, bids, subs, heads, index):  # type: ignore[no-untyped-def]
    page, dim = index.shape[1], index.shape[2]
    for i in range(bids.size):
        idx = index[subs[i]]
        for t in range(page):
            for h in range(heads):
                r, s = bids[i] * rb + h * rh, i * pn + t * pt + h * ph
                for x in range(dim):
                    pages[s + x] = region[r + idx[t, x]]
