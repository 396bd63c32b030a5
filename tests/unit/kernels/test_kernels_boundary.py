"""Every kernel entry point checks its arguments before anything runs, on the host and on the device
alike (the CUDA kernels run in numba's simulator here). Before, a 2-D pool raised ``IndexError``
from inside the device ladder copy (the host path took it), and a block id outside the pool was a
write out of bounds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numba import cuda

from numba_kernels import (
    KernelArgumentError,
    first_bad_page,
    ladder_copy,
    page_hashes,
    scatter_rows,
    zero_rows,
)

PB = 256


def _src(pages: int = 4) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, pages * PB, dtype=np.uint8)


def _both(
    src: np.ndarray, pool: np.ndarray, table: np.ndarray, n: int, dev_pool: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    host = pool.copy()
    ladder_copy(src, PB, n, host, table, device="cpu")
    d_pool = cuda.to_device(pool) if dev_pool is None else dev_pool
    ladder_copy(cuda.to_device(src), PB, n, d_pool, cuda.to_device(table))
    return host, d_pool.copy_to_host()


def test_a_2d_pool_on_the_device_is_taken_as_on_the_host() -> None:
    src, table = _src(), np.array([5, 0, 2], np.int32)
    pool = np.zeros((8, PB), np.uint8)  # [blocks, page bytes]
    host, dev = _both(src, pool, table, 3)
    assert np.array_equal(host, dev)
    assert np.array_equal(dev[5], src[:PB]) and np.array_equal(dev[2], src[2 * PB : 3 * PB])
    assert not dev[[1, 3, 4, 6, 7]].any()


def test_a_paged_pool_of_five_dimensions() -> None:
    src, table = _src(), np.array([3, 1], np.int64)
    pool = np.zeros((4, 2, 2, 4, 16), np.uint8)  # [blocks, K/V, slots, heads, dim bytes]
    host, dev = _both(src, pool, table, 2)
    assert np.array_equal(host, dev)
    assert np.array_equal(dev[3].reshape(-1), src[:PB])


@pytest.mark.parametrize("where", ["cpu", "cuda"])
@pytest.mark.parametrize(
    "case",
    [
        "dtype",
        "strided",
        "outside",
        "negative",
        "twice",
        "short table",
        "too many pages",
        "partial block",
        "page_bytes",
    ],
)
def test_bad_ladder_arguments_are_refused_before_anything_is_written(where: str, case: str) -> None:
    src, pool, table, n, pb = _src(), np.zeros((8, PB), np.uint8), np.array([1, 2, 3]), 3, PB
    if case == "dtype":
        src = src.view(np.float32)
    elif case == "strided":
        pool = np.zeros((8, 2 * PB), np.uint8)[:, ::2]
    elif case == "outside":
        table = np.array([1, 8, 3])
    elif case == "negative":
        table = np.array([1, -1, 3])
    elif case == "twice":
        table = np.array([1, 2, 1])
    elif case == "short table":
        table = np.array([1, 2])
    elif case == "too many pages":
        n = 5
    elif case == "partial block":
        pool = np.zeros(8 * PB + 1, np.uint8)
    elif case == "page_bytes":
        pb = 0
    if where == "cuda" and case == "strided":
        d_pool: Any = cuda.to_device(np.zeros((8, 2 * PB), np.uint8))[:, ::2]
    elif where == "cuda":
        d_pool = cuda.to_device(pool)
    with pytest.raises(KernelArgumentError):
        if where == "cpu":
            ladder_copy(src, pb, n, pool, table, device="cpu")
        else:
            ladder_copy(cuda.to_device(src), pb, n, d_pool, cuda.to_device(table))
    after = pool if where == "cpu" else d_pool.copy_to_host()
    assert not np.asarray(after).any()  # nothing was written


@pytest.mark.parametrize("where", ["cpu", "cuda"])
def test_digests_of_another_shape_are_refused(where: str) -> None:
    a, e = np.zeros((4, 32), np.uint8), np.zeros((3, 32), np.uint8)

    def dev(x: np.ndarray) -> Any:
        return cuda.to_device(x) if where == "cuda" else x

    with pytest.raises(KernelArgumentError, match="differ in shape"):
        first_bad_page(dev(a), dev(e))
    with pytest.raises(KernelArgumentError, match=r"\(pages, 32\) uint8"):
        first_bad_page(dev(np.zeros((4, 16), np.uint8)), dev(np.zeros((4, 16), np.uint8)))


def test_page_hashes_take_bytes_in_any_contiguous_shape_on_the_device() -> None:
    data = _src(3)
    want = page_hashes(data, PB, device="cpu")
    assert np.array_equal(page_hashes(cuda.to_device(data.reshape(3, PB)), PB), want)
    with pytest.raises(KernelArgumentError, match="uint8"):
        page_hashes(cuda.to_device(data.view(np.int32)), PB)
    with pytest.raises(KernelArgumentError, match="page_bytes"):
        page_hashes(cuda.to_device(data), 0)


# -- the row scatter and zeroing of the device restore ------------------------------------------
LAYERS, ROW, PT = 3, 24, 4


@pytest.mark.parametrize("n", [1, 4, 7, 12])  # less than a page, one page, a short last page
def test_scatter_rows_is_bit_exact_on_the_device_and_the_host(n: int) -> None:
    """Each layer's K and V rows of stored pages (spec F-SEG-4) land in the rows ``slots``
    names, the same on both paths; rows not named are untouched."""
    rng = np.random.default_rng(n)
    src = rng.integers(0, 256, n * LAYERS * 2 * ROW, dtype=np.uint8)
    slots = rng.permutation(16)[:n]
    for layer in range(LAYERS):
        k, v = np.full(16 * ROW, 7, np.uint8), np.full(16 * ROW, 9, np.uint8)
        dk, dv = cuda.to_device(k), cuda.to_device(v)
        scatter_rows(src, n, PT, LAYERS, ROW, layer, k, v, slots, device="cpu")
        scatter_rows(cuda.to_device(src), n, PT, LAYERS, ROW, layer, dk, dv, slots)
        assert np.array_equal(dk.copy_to_host(), k) and np.array_equal(dv.copy_to_host(), v)
        full = n // PT
        for j, slot in enumerate(slots):  # the stored layout, token by token
            page, within = divmod(j, PT)
            p = PT if page < full else n - full * PT
            at = (page * PT * LAYERS * 2 + layer * 2 * p) * ROW + within * ROW
            assert np.array_equal(k.reshape(16, ROW)[slot], src[at : at + ROW])
            assert np.array_equal(v.reshape(16, ROW)[slot], src[at + p * ROW : at + p * ROW + ROW])
        untouched = np.setdiff1d(np.arange(16), slots)
        assert (k.reshape(16, ROW)[untouched] == 7).all()
        zero_rows(dk, ROW, slots[:2])
        zero_rows(k, ROW, slots[:2], device="cpu")
        assert np.array_equal(dk.copy_to_host(), k) and not k.reshape(16, ROW)[slots[:2]].any()


@pytest.mark.parametrize("where", ["cpu", "cuda"])
@pytest.mark.parametrize(
    "case", ["slot-out", "slot-twice", "short-src", "layer", "same-kv", "odd-rows", "dtype"]
)
def test_bad_scatter_arguments_are_refused_before_anything_is_written(
    where: str, case: str
) -> None:
    src = np.zeros(4 * LAYERS * 2 * ROW, np.uint8)
    k, v = np.full(8 * ROW, 5, np.uint8), np.full(8 * ROW, 5, np.uint8)
    slots, layer, n = np.arange(4), 0, 4
    if case == "slot-out":
        slots = np.array([0, 1, 2, 8])
    elif case == "slot-twice":
        slots = np.array([0, 1, 1, 2])
    elif case == "short-src":
        src = src[:-1]
    elif case == "layer":
        layer = LAYERS
    elif case == "odd-rows":
        k = np.full(8 * ROW + 3, 5, np.uint8)
    elif case == "dtype":
        src = src.view(np.uint16)
    dk, dv = (cuda.to_device(k), cuda.to_device(v)) if where == "cuda" else (k, v)
    s = cuda.to_device(src) if where == "cuda" else src
    if case == "same-kv":
        dv = dk
    with pytest.raises(KernelArgumentError):
        scatter_rows(s, n, PT, LAYERS, ROW, layer, dk, dv, slots, device=where)  # type: ignore[arg-type]
    got = dk.copy_to_host() if where == "cuda" else dk
    assert (got == 5).all(), "nothing was written"
