"""Benchmark: layout conversion between the engine's per-layer K/V and the stored pages:
``pack_pages`` (the capture's one copy on the way in; into a new buffer, and into a touched one with
``out=``) and the ``LayerKV`` / ``PagedKV`` writes (the one copy on the way out), each against a
plain copy of the same bytes into a touched buffer, in one run. Measures and prints ratios; asserts
nothing of time.

``STRATA_BENCH_MIB`` sizes it (default 1024: 8,192 tokens of Llama-3.1-8B K/V, 32
layers x 8 kv heads x 128 x fp16); ``make test`` runs one round each."""

from __future__ import annotations

import itertools
import os
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from stratastore import ModelFingerprint
from stratastore.restore import LayerKV, PagedKV, pack_pages
from tests.bench.rounds import interleaved_rounds

FP = ModelFingerprint.create(
    "bench/llama-3.1-8b-geometry",
    n_layers=32,
    n_kv_heads=8,
    head_dim=128,
    page_tokens=16,
    dtype="float16",
)
MIB = int(os.environ.get("STRATA_BENCH_MIB", "1024"))
TOKENS = max(1, (MIB << 20) // FP.token_bytes)
CUTS = [0, TOKENS // 4 + 3, TOKENS // 2 + 7]  #: segments whose last page is short
BLOCK = 16


def test_layout_copies_vs_memcpy(benchmark: Any) -> None:
    rng = np.random.default_rng(0)
    shape = (TOKENS, FP.n_kv_heads, FP.head_dim)
    k = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(FP.n_layers)]
    v = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(FP.n_layers)]
    flat = pack_pages(FP, k, v, TOKENS, CUTS)
    k2 = [np.ones_like(a) for a in k]  # touched: the copies, not page faults, are measured
    v2 = [np.ones_like(a) for a in v]
    blocks = -(-TOKENS // BLOCK)
    pools = [
        np.ones((2, blocks, BLOCK, FP.n_kv_heads, FP.head_dim), np.uint16)
        for _ in range(FP.n_layers)
    ]
    table = rng.permutation(blocks)
    layer_kv, paged = LayerKV(FP, k2, v2), PagedKV(FP, pools, table)
    touched = np.ones_like(flat)
    bounds = sorted({*CUTS, TOKENS})
    tb = FP.token_bytes

    def write(dest: LayerKV | PagedKV) -> None:
        for lo, hi in itertools.pairwise(bounds):
            dest.write_pages(lo, hi - lo, flat[lo * tb : hi * tb], FP.page_tokens)

    ops: dict[str, Callable[[], object]] = {
        "memcpy": lambda: np.copyto(touched, flat),
        "pack_pages": lambda: pack_pages(FP, k, v, TOKENS, CUTS),
        "pack_pages out=": lambda: pack_pages(FP, k, v, TOKENS, CUTS, out=touched),
        "LayerKV write": lambda: write(layer_kv),
        "PagedKV write": lambda: write(paged),
    }
    benchmark.group = "layout"
    times = interleaved_rounds(benchmark, ops)
    assert all(np.array_equal(a, b) for a, b in zip(k, k2, strict=True))
    assert np.array_equal(touched, flat)
    if benchmark.stats is not None:
        gbs = {n: flat.nbytes / statistics.median(t) / 1e9 for n, t in times.items()}
        print(f"\nlayout conversion of {flat.nbytes / 2**20:,.0f} MiB ({TOKENS:,} tokens):")
        for name, rate in gbs.items():
            print(f"  {name:<14} {rate:6.2f} GB/s  {rate / gbs['memcpy']:.2f}x memcpy")
