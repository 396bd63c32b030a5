"""Layout conversion as strided copies (``pack_pages``, ``recut_pages``, ``LayerKV`` and
``PagedKV`` writes), bit-exact against a page-by-page reference of spec F-SEG-4, with segments
whose last page is short and a permuted block table."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratastore import ModelFingerprint
from stratastore.restore import DestinationRefused, LayerKV, PagedKV, pack_pages, recut_pages

FP = ModelFingerprint.create(
    "t/layout", n_layers=3, n_kv_heads=2, head_dim=8, page_tokens=4, dtype="float16"
)
ROW = 2 * 8 * 2


def reference_pack(
    k: list[npt.NDArray[np.uint16]], v: list[npt.NDArray[np.uint16]], n: int, cuts: list[int]
) -> npt.NDArray[np.uint8]:
    """F-SEG-4 page by page: each segment in pages of page_tokens from its own start; a page
    holds, per layer, K then V, each [p, heads, dim]."""
    out = []
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    for lo, hi in itertools.pairwise(bounds):
        for t in range(lo, hi, FP.page_tokens):
            e = min(t + FP.page_tokens, hi)
            for layer in range(FP.n_layers):
                out += [k[layer][t:e].tobytes(), v[layer][t:e].tobytes()]
    return np.frombuffer(b"".join(out), np.uint8)


@pytest.mark.parametrize(
    "n, cuts",
    [
        (1, [0]),
        (4, [0]),
        (23, [0, 5, 6, 17]),
        (64, [0, 30]),
        (4099, [0, 1000, 4097]),
        (50001, [0, 7, 30001]),
    ],
)
def test_pack_and_write_back_match_the_page_by_page_layout(n: int, cuts: list[int]) -> None:
    rng = np.random.default_rng(n)
    k = [rng.integers(0, 1 << 16, (n + 3, 2, 8), dtype=np.uint16) for _ in range(3)]
    v = [rng.integers(0, 1 << 16, (n + 3, 2, 8), dtype=np.uint16) for _ in range(3)]
    flat = pack_pages(FP, k, v, n, cuts)
    assert np.array_equal(flat, reference_pack(k, v, n, cuts))
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    k2 = [np.zeros((n, 2, 8), np.uint16) for _ in range(3)]
    v2 = [np.zeros((n, 2, 8), np.uint16) for _ in range(3)]
    layer_kv = LayerKV(FP, k2, v2)
    bs = 4
    nb = -(-n // bs) + 2
    pools = [np.zeros((2, nb, bs, 2, 8), np.uint16) for _ in range(3)]
    table = rng.permutation(nb)[: -(-n // bs)]
    paged = PagedKV(FP, pools, table)
    tb = FP.token_bytes
    for lo, hi in itertools.pairwise(bounds):
        layer_kv.write_pages(lo, hi - lo, flat[lo * tb : hi * tb], FP.page_tokens)
        paged.write_pages(lo, hi - lo, flat[lo * tb : hi * tb], FP.page_tokens)
    t = np.arange(n)
    slots = table[t // bs] * bs + t % bs
    for layer in range(3):
        assert np.array_equal(k2[layer], k[layer][:n]) and np.array_equal(v2[layer], v[layer][:n])
        pool = pools[layer].reshape(2, nb * bs, 2, 8)
        assert np.array_equal(pool[0, slots], k[layer][:n])
        assert np.array_equal(pool[1, slots], v[layer][:n])


def test_pack_pages_into_a_caller_buffer() -> None:
    rng = np.random.default_rng(5)
    k = [rng.integers(0, 1 << 16, (9, 2, 8), dtype=np.uint16) for _ in range(3)]
    v = [rng.integers(0, 1 << 16, (9, 2, 8), dtype=np.uint16) for _ in range(3)]
    buf = np.full(9 * FP.token_bytes + 5, 7, np.uint8)
    got = pack_pages(FP, k, v, 9, [0, 6], out=buf)
    assert np.shares_memory(got, buf) and np.array_equal(got, reference_pack(k, v, 9, [0, 6]))
    assert (buf[9 * FP.token_bytes :] == 7).all()  # nothing past the packed bytes
    with pytest.raises(DestinationRefused, match=r"tokens need"):
        pack_pages(FP, k, v, 9, out=np.zeros(10, np.uint8))
    with pytest.raises(DestinationRefused, match="read-only"):
        ro = np.zeros(9 * FP.token_bytes, np.uint8)
        ro.flags.writeable = False
        pack_pages(FP, k, v, 9, out=ro)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 80),
    cuts=st.lists(st.integers(1, 79), max_size=4),
    more=st.lists(st.integers(1, 79), max_size=5),
)
def test_a_recut_capture_is_the_capture_packed_with_the_new_cuts(
    n: int, cuts: list[int], more: list[int]
) -> None:
    """Cutting a capture at more points in place gives exactly what packing the engine's K/V
    with all the cuts gives; the segments reported changed are those a new cut fell in."""
    rng = np.random.default_rng(n)
    k = [rng.integers(0, 1 << 16, (n, 2, 8), dtype=np.uint16) for _ in range(3)]
    v = [rng.integers(0, 1 << 16, (n, 2, 8), dtype=np.uint16) for _ in range(3)]
    bounds = sorted({0, *(c for c in cuts if c < n), n})
    new = sorted({*bounds, *(c for c in more if c < n)})
    kv = reference_pack(k, v, n, bounds).copy()  # writable: the capture the store holds
    changed = recut_pages(FP, kv, bounds, new)
    assert np.array_equal(kv, reference_pack(k, v, n, new))
    assert changed == [(s, e) for s, e in itertools.pairwise(bounds) if any(s < c < e for c in new)]


def test_a_recut_holds_two_pages_aside_whatever_the_capture() -> None:
    """Cutting 4 MiB of capture near its start moves almost all of it, holding at most two
    pages aside (tracemalloc sees numpy's buffers)."""
    import tracemalloc

    n = 4 * (1 << 20) // FP.token_bytes  # 4 MiB: 21,845 tokens of 192 bytes
    rng = np.random.default_rng(9)
    k = [rng.integers(0, 1 << 16, (n, 2, 8), dtype=np.uint16) for _ in range(3)]
    v = [rng.integers(0, 1 << 16, (n, 2, 8), dtype=np.uint16) for _ in range(3)]
    kv = pack_pages(FP, k, v, n, [0])
    tracemalloc.start()
    try:
        changed = recut_pages(FP, kv, [0, n], [0, 5, 7, n // 2, n])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert changed == [(0, n)]
    assert peak < 2 * FP.page_tokens * FP.token_bytes + (256 << 10)  # pages, and bookkeeping
    assert np.array_equal(kv, pack_pages(FP, k, v, n, [0, 5, 7, n // 2]))
