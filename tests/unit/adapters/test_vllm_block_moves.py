"""The compiled block moves (numba_kernels/block_moves.py) against the numpy reference
(``Mover.put_numpy`` / ``take_numpy``), bit for bit: every order a block's region may keep
(token-major rows, dim-major columns, AMX's K and V tiles, any permutation by its offsets),
blocks of 32 to 128 tokens, pages of 8 to 32 tokens at any position in a block, block ids in
any order, pages taken from and put into strided views of the stored layout as the pool's
callers hand them; nothing outside the pages' items is written on either side. The kernel a
move uses is the one its order names; what no kernel can take (negative strides, strides that
are not whole units, ids numpy alone would accept, a read-only destination) goes to the numpy
reference and moves exactly as it always did."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ModelFingerprint
from stratastore.adapters.vllm.block_layout import KNOWN, Mover
from stratastore.adapters.vllm.pool import CpuBlocks

H, D, L, NB = 3, 32, 2, 9


def _offsets(order: str, bs: int, page: int, d: int = D) -> npt.NDArray[np.int64]:
    """``[bs, d]`` offsets of ``order``: a known view's, or a permutation (of items, or of
    pairs of items: a pair kept side by side is moved as one 4-byte unit)."""
    made = {name: make(bs, d, page).offsets() for name, make, _ in KNOWN}
    if order in made:
        return made[order]
    rng = np.random.default_rng(bs * 7 + page)
    if order == "permutation":
        return rng.permutation(bs * d).reshape(bs, d).astype(np.int64)
    pairs = rng.permutation(bs * d // 2).astype(np.int64)
    return (2 * pairs[:, None] + np.arange(2)).reshape(bs, d)


ORDERS = ["rows", "columns", "amx K", "amx V", "permutation", "pair permutation"]
#: the kernel each order moves 2-byte items by, when its view fits the page
OWN = {
    "rows": "rows",
    "columns": "columns",
    "amx K": "amx K",
    "amx V": "amx V",
    "permutation": "offsets x1",
    "pair permutation": "offsets x2",
}
#: and when it does not (AMX's tiles hold 16 tokens: a page of 8 is part of one)
BY_OFFSETS = {"amx K": "offsets x2", "amx V": "offsets x1"}


def _slots(bs: int, page: int, n: int, seed: int) -> tuple[npt.NDArray[np.int64], ...]:
    """``n`` distinct (block, page of the block) slots in random order: ids out of order,
    pages at any position of their block, a block's pages apart."""
    rng = np.random.default_rng(seed)
    per = bs // page
    chosen = rng.choice(NB * per, size=n, replace=False)
    return (chosen // per).astype(np.int64), (chosen % per).astype(np.int64)


def _arrays(
    bs: int, page: int, n: int, dtype: type[np.integer[Any]] = np.int16, seed: int = 0
) -> tuple[npt.NDArray[np.generic], npt.NDArray[np.generic]]:
    """A layer pool (``[blocks, heads, 2, bs, dim]``) and stored pages (``[n, layers, 2,
    page, heads, dim]``) of random items."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    pool = rng.integers(info.min, info.max, (NB, H, 2, bs, D), dtype=dtype, endpoint=True)
    stored = rng.integers(info.min, info.max, (n, L, 2, page, H, D), dtype=dtype, endpoint=True)
    return pool, stored


def _region(pool: npt.NDArray[np.generic], kind: int) -> npt.NDArray[np.generic]:
    nb, h, _, bs, d = pool.shape
    return pool[:, :, kind].reshape(nb, h, bs * d)


def _check_both_ways(
    mover: Mover,
    pool: npt.NDArray[np.generic],
    stored: npt.NDArray[np.generic],
    bids: npt.NDArray[np.int64],
    subs: npt.NDArray[np.int64],
    want: str | None,
) -> None:
    """Put and take by :meth:`Mover.by_kernel` (the kernel ``want``, or none) equal the numpy
    reference on the whole pool and the whole stored buffer, K and V."""
    for kind in (0, 1):
        got_pool, ref_pool = pool.copy(), pool.copy()
        used = mover.by_kernel(_region(got_pool, kind), bids, subs, stored[:, 1, kind], True)
        assert (used.name if used else None) == want
        mover.put_numpy(_region(ref_pool, kind), bids, subs, stored[:, 1, kind])
        assert np.array_equal(got_pool, ref_pool)
        got, ref = stored.copy(), stored.copy()
        used = mover.by_kernel(_region(pool, kind), bids, subs, got[:, 0, kind], False)
        assert (used.name if used else None) == want
        mover.take_numpy(_region(pool, kind), bids, subs, ref[:, 0, kind])
        assert np.array_equal(got, ref)


@pytest.mark.parametrize(("bs", "page"), [(32, 16), (128, 16), (128, 32), (64, 8)])
@pytest.mark.parametrize("order", ORDERS)
def test_a_kernel_moves_what_numpy_moves(order: str, bs: int, page: int) -> None:
    mover = Mover(_offsets(order, bs, page), page)
    fits = {name: fit(bs, D, page) for name, _, fit in KNOWN}
    want = OWN[order] if fits.get(order, True) else BY_OFFSETS[order]
    n = min(7, NB * bs // page)
    pool, stored = _arrays(bs, page, n, seed=bs + page)
    bids, subs = _slots(bs, page, n, seed=page)
    _check_both_ways(mover, pool, stored, bids, subs, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
@pytest.mark.parametrize("order", ORDERS)
def test_items_of_other_sizes_move_by_rows_or_by_offsets(
    order: str, dtype: type[np.integer[Any]]
) -> None:
    """The tiles' kernels pack 2-byte items; 1- and 4-byte items move by rows (in 4- or 8-byte
    units) or by the offsets (in units of the run of items an order keeps side by side)."""
    bs, page = 32, 16
    mover = Mover(_offsets(order, bs, page), page)
    item = np.dtype(dtype).itemsize
    run = {"rows": 8 // item, "amx K": 2, "pair permutation": 2}.get(order, 1)
    want = "rows" if order == "rows" else f"offsets x{run}"
    pool, stored = _arrays(bs, page, 5, dtype=dtype, seed=3)
    bids, subs = _slots(bs, page, 5, seed=4)
    _check_both_ways(mover, pool, stored, bids, subs, want)


@pytest.mark.parametrize("order", ["amx K", "amx V", "columns"])
def test_full_heads_of_128_dims(order: str) -> None:
    """Llama's head of 128 dims: eight of AMX V's 16-dim tiles, 64 of AMX K's pairs."""
    bs, page, d = 128, 16, 128
    mover = Mover(_offsets(order, bs, page, d), page)
    rng = np.random.default_rng(9)
    pool = rng.integers(-(2**15), 2**15, (4, 2, 2, bs, d), dtype=np.int16)
    stored = rng.integers(-(2**15), 2**15, (5, L, 2, page, 2, d), dtype=np.int16)
    bids = np.array([3, 0, 3, 2, 1], np.int64)
    subs = np.array([7, 0, 2, 5, 3], np.int64)
    for kind in (0, 1):
        got, ref = pool.copy(), pool.copy()
        mover.put(_region(got, kind), bids, subs, stored[:, 1, kind])
        mover.put_numpy(_region(ref, kind), bids, subs, stored[:, 1, kind])
        assert np.array_equal(got, ref)
        out, want = np.zeros_like(stored), np.zeros_like(stored)
        mover.take(_region(pool, kind), bids, subs, out[:, 0, kind])
        mover.take_numpy(_region(pool, kind), bids, subs, want[:, 0, kind])
        assert np.array_equal(out, want)


def test_unaligned_and_read_only_pages_still_move_by_the_kernel() -> None:
    """Pages that start 2 bytes past a 4- or 8-byte boundary (a slice of a read buffer) and
    read-only pages to put: the kernel reads them as they are."""
    bs, page = 128, 16
    pool, stored = _arrays(bs, page, 4, seed=5)
    raw = np.empty(stored.nbytes + 2, np.uint8)
    shifted = raw[2:].view(np.int16).reshape(stored.shape)
    shifted[...] = stored
    shifted.flags.writeable = False
    bids, subs = _slots(bs, page, 4, seed=6)
    for order in ("amx K", "amx V", "rows"):
        mover = Mover(_offsets(order, bs, page), page)
        got, ref = pool.copy(), pool.copy()
        assert mover.by_kernel(_region(got, 1), bids, subs, shifted[:, 1, 1], True) is not None
        mover.put_numpy(_region(ref, 1), bids, subs, shifted[:, 1, 1])
        assert np.array_equal(got, ref)


def test_strides_that_are_not_whole_units_fall_to_narrower_kernels() -> None:
    """Rows of 33 items apart (a view of wider rows): AMX K's pairs are not whole 4-byte
    units, so the move goes by the offsets item by item, and moves the same."""
    bs, page = 32, 16
    pool, stored = _arrays(bs, page, 3, seed=7)
    wide = np.zeros((*stored.shape[:-1], D + 1), np.int16)
    wide[..., :D] = stored
    pages = wide[..., :D]
    bids, subs = _slots(bs, page, 3, seed=8)
    mover = Mover(_offsets("amx K", bs, page), page)
    got, ref = pool.copy(), pool.copy()
    used = mover.by_kernel(_region(got, 0), bids, subs, pages[:, 0, 0], True)
    assert used is not None and used.name == "offsets x1"
    mover.put_numpy(_region(ref, 0), bids, subs, pages[:, 0, 0])
    assert np.array_equal(got, ref)


def test_what_no_kernel_takes_moves_as_numpy_does() -> None:
    """Negative strides, a negative id (numpy counts it from the end), a read-only destination
    and an empty move go to the reference; an id past the pool raises numpy's IndexError."""
    bs, page = 32, 16
    mover = Mover(_offsets("amx V", bs, page), page)
    pool, stored = _arrays(bs, page, 2, seed=9)
    bids, subs = np.array([4, -1], np.int64), np.array([1, 0], np.int64)
    region = _region(pool, 0)
    assert mover.by_kernel(region, bids, subs, stored[:, 0, 0], True) is None
    reversed_region = region[::-1]
    assert mover.by_kernel(reversed_region, bids[:1], subs[:1], stored[:1, 0, 0], True) is None
    got, ref = pool.copy(), pool.copy()
    mover.put(_region(got, 0), bids, subs, stored[:, 0, 0])
    mover.put_numpy(_region(ref, 0), bids, subs, stored[:, 0, 0])
    assert np.array_equal(got, ref)
    frozen = stored.copy()
    frozen.flags.writeable = False
    assert mover.by_kernel(region, bids[:1], subs[:1], frozen[:1, 0, 0], False) is None
    with pytest.raises(ValueError, match="read-only"):
        mover.take(region, bids[:1], subs[:1], frozen[:1, 0, 0])
    empty = np.zeros(0, np.int64)
    before = pool.copy()
    mover.put(region, empty, empty, stored[:0, 0, 0])
    assert np.array_equal(pool, before)
    with pytest.raises(IndexError):
        mover.put(region, np.array([NB], np.int64), subs[:1], stored[:1, 0, 0])


@pytest.mark.parametrize("order", ["amx", "permutation"])
def test_a_pool_round_trip_through_the_kernels(order: str) -> None:
    """CpuBlocks' restore (write_pages) and park gather (gather_pages) over the kernels: the
    pages come back as they went in, in blocks given out of order, ending mid-block."""
    bs, page = 64, 16
    fp = ModelFingerprint.create(
        "tiny", n_layers=L, n_kv_heads=H, head_dim=D, page_tokens=page, dtype="bfloat16"
    )
    k, v = ("amx K", "amx V") if order == "amx" else ("permutation", "pair permutation")
    movers = (Mover(_offsets(k, bs, page), page), Mover(_offsets(v, bs, page), page))
    pools = [np.zeros((NB, H, 2, bs, D), np.int16) for _ in range(L)]
    n_tokens = bs + 2 * page
    data = np.random.default_rng(11).integers(0, 256, n_tokens * fp.token_bytes, dtype=np.uint8)
    ids = [5, 1, 7]
    CpuBlocks(fp, pools, ids, 0, bs, movers).write_pages(0, n_tokens, data, page)
    untouched = [i for i in range(NB) if i not in ids[:2]]
    assert not any(p[untouched].any() for p in pools)
    back = np.empty_like(data)
    CpuBlocks(fp, pools, ids, 0, bs, movers).gather_pages(0, n_tokens, back, page)
    assert np.array_equal(back, data)
