"""Benchmark: the moves between the stored pages and vLLM's CPU blocks (``Mover.put``, the
restore's, and ``Mover.take``, the park's gather; numba_kernels/block_moves.py) for each order
a block may keep (token-major rows, the ``vec`` ISAs' columns for K, AMX's tiles, a random
permutation moved by its offsets), beside the numpy reference (``put_numpy`` / ``take_numpy``)
and a plain copy of the same bytes into a touched buffer, in interleaved rounds of one run.
Driven as ``CpuBlocks`` drives them: one call per layer and kind over every page, pages of 16
tokens in blocks of 128 given in shuffled order. Prints GB/s and ratios; asserts nothing of
time.

``STRATA_BENCH_MOVES_MIB`` sizes it (default 512: 4,096 tokens of Llama-3.1-8B K/V, 32 layers
x 8 kv heads x 128 x bf16); ``make test`` runs one round each."""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore.adapters.vllm.block_layout import KNOWN, Mover
from tests.bench.rounds import interleaved_rounds

LAYERS, HEADS, DIM, PAGE, BLOCK = 32, 8, 128, 16, 128
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 2
MIB = int(os.environ.get("STRATA_BENCH_MOVES_MIB", "512"))
TOKENS = max(BLOCK, (MIB << 20) // TOKEN_BYTES // BLOCK * BLOCK)


def _movers(order: str) -> tuple[Mover, Mover]:
    """K's and V's movers of ``order``."""
    made = {name: make(BLOCK, DIM, PAGE).offsets() for name, make, _ in KNOWN}
    if order == "permutation":
        rng = np.random.default_rng(1)
        k, v = (rng.permutation(BLOCK * DIM).reshape(BLOCK, DIM) for _ in range(2))
        return Mover(k.astype(np.int64), PAGE), Mover(v.astype(np.int64), PAGE)
    k_name, v_name = {"rows": ("rows", "rows"), "columns": ("columns", "rows")}.get(
        order, ("amx K", "amx V")
    )
    return Mover(made[k_name], PAGE), Mover(made[v_name], PAGE)


@functools.cache
def _arrays() -> dict[str, Any]:
    """Per layer a pool of a quarter more blocks than the request holds (touched), the stored
    pages, a touched buffer of their size, and the request's page slots."""
    rng = np.random.default_rng(0)
    blocks = TOKENS // BLOCK
    total = blocks + blocks // 4 + 1
    pools = [np.ones((total, HEADS, 2, BLOCK, DIM), np.int16) for _ in range(LAYERS)]
    n = TOKENS // PAGE
    table = rng.permutation(total)[:blocks]
    return {
        "regions": [[p[:, :, k].reshape(total, HEADS, BLOCK * DIM) for k in (0, 1)] for p in pools],
        "stored": rng.integers(-(2**15), 2**15, (n, LAYERS, 2, PAGE, HEADS, DIM), dtype=np.int16),
        "out": np.ones((n, LAYERS, 2, PAGE, HEADS, DIM), np.int16),
        "bids": np.repeat(table, BLOCK // PAGE).astype(np.int64),
        "subs": np.tile(np.arange(BLOCK // PAGE), blocks).astype(np.int64),
    }


def _each_layer(movers: tuple[Mover, Mover], how: str, pages: npt.NDArray[Any]) -> None:
    a = _arrays()
    for layer, regions in enumerate(a["regions"]):
        for kind, (mover, region) in enumerate(zip(movers, regions, strict=True)):
            getattr(mover, how)(region, a["bids"], a["subs"], pages[:, layer, kind])


@pytest.mark.parametrize("order", ["rows", "columns", "amx", "permutation"])
def test_block_moves_vs_numpy_and_memcpy(benchmark: Any, order: str) -> None:
    a, movers = _arrays(), _movers(order)
    stored, out = a["stored"], a["out"]
    src, dst = stored.reshape(-1), out.reshape(-1)
    ops: dict[str, Callable[[], object]] = {
        "memcpy": lambda: np.copyto(dst, src),
        "put": lambda: _each_layer(movers, "put", stored),
        "put numpy": lambda: _each_layer(movers, "put_numpy", stored),
        "take": lambda: _each_layer(movers, "take", out),
        "take numpy": lambda: _each_layer(movers, "take_numpy", out),
    }
    benchmark.group = f"block moves: {order}"
    times = interleaved_rounds(benchmark, ops)
    out[...] = 0
    _each_layer(movers, "take", out)  # what the puts wrote, taken back by the kernels
    assert np.array_equal(out, stored)
    if benchmark.stats is not None:
        gbs = {name: stored.nbytes / statistics.median(t) / 1e9 for name, t in times.items()}
        kernels = " / ".join(m.kernels(2)[0].name for m in movers)
        print(
            f"\nblock moves, {order} (K / V by {kernels}), {stored.nbytes / 2**20:,.0f} MiB "
            f"({TOKENS:,} tokens, blocks of {BLOCK}, pages of {PAGE}):"
        )
        for name, rate in gbs.items():
            line = f"  {name:<11} {rate:6.2f} GB/s  {rate / gbs['memcpy']:.2f}x memcpy"
            if name in ("put", "take"):
                line += f"  {rate / gbs[f'{name} numpy']:.1f}x numpy"
            print(line)
