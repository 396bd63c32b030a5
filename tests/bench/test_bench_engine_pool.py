"""Benchmark: the store in the engine's own pool, against the plain I/O an engine would do
instead, on the same bytes in one run: a validated restore into a paged pool (``PagedKV``, hot)
beside a raw read into a touched buffer plus the scatter into the same pool, and a durable park
streamed from the pool beside a raw write + fsync of the same bytes. The pool (vLLM's paged
layout, blocks of 16 tokens in a shuffled block table) is allocated and touched once. Prints
medians and ratios; asserts nothing of time (``strata bench --peers`` is the full protocol,
docs/performance.md).

``STRATA_BENCH_POOL_MIB`` sizes it (default 128: 1,024 tokens of Llama-3.1-8B K/V, 32 layers x 8
kv heads x 128 x fp16); ``make test`` runs one round."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from strata_harness.peer_protocol import fsync_dir
from stratastore import ModelFingerprint, Store
from stratastore.chain import Checkpoint, Conversation
from stratastore.restore import PagedKV
from tests.bench.rounds import interleaved_rounds

FP = ModelFingerprint.create(
    "bench/llama-3.1-8b-geometry", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
)
MIB = int(os.environ.get("STRATA_BENCH_POOL_MIB", "128"))
BLOCK = 16
TOKENS = max(BLOCK, (MIB << 20) // FP.token_bytes // BLOCK * BLOCK)


def test_engine_pool_vs_plain_io(benchmark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    blocks = TOKENS // BLOCK
    total = blocks + blocks // 4 + 1
    per_layer = (2, total, BLOCK, FP.n_kv_heads, FP.head_dim)
    pools = [rng.integers(0, 1 << 16, per_layer, dtype=np.uint16) for _ in range(FP.n_layers)]
    table = rng.permutation(total)[:blocks]
    want = [p[:, table].copy() for p in pools]
    nbytes = TOKENS * FP.token_bytes
    raw = np.ones(nbytes, np.uint8)  # the plain read's touched buffer, and the raw write's bytes
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "page_resume": True}
    store = Store.open(FP, {**cfg, "cold_mib": 64 * MIB + 64})
    prompt = np.arange(TOKENS, dtype=np.uint32)
    dest = PagedKV(FP, pools, table)
    parks = [0]

    def park() -> None:  # new tokens each time: a park of stored tokens writes nothing
        parks[0] += 1
        tokens = prompt + np.uint32(parks[0] * TOKENS)
        store.park(Conversation(f"c{parks[0]}", tokens, [Checkpoint(TOKENS)]), dest)
        store.flush()

    def raw_write() -> None:  # a new file each time, as each park is (new page-cache pages)
        path = tmp_path / f"raw-{len(list(tmp_path.glob('raw-*')))}.bin"
        with open(path, "wb", buffering=0) as f:
            f.write(raw.data)
            os.fsync(f.fileno())
        fsync_dir(str(tmp_path))

    def raw_read_scatter() -> None:
        with open(tmp_path / "raw-0.bin", "rb", buffering=0) as f:
            f.readinto(raw.data)
        kv = raw.view(np.uint16).reshape(blocks, FP.n_layers, 2, BLOCK, FP.n_kv_heads, -1)
        for layer, pool in enumerate(pools):
            pool[:, table] = kv[:, layer].transpose(1, 0, 2, 3, 4)

    def restore() -> None:
        got = store.restore(prompt + np.uint32(TOKENS), dest)  # the first park's tokens
        assert got.tokens == TOKENS

    park()  # what the restores read, its bytes in the page cache
    raw_write()
    ops: dict[str, Callable[[], object]] = {
        "raw write+fsync": raw_write,
        "durable park from the pool": park,
        "raw read + scatter into the pool": raw_read_scatter,
        "validated restore into the pool": restore,
    }
    benchmark.group = "engine pool"
    try:
        times = interleaved_rounds(benchmark, ops)
        restore()
        assert all(np.array_equal(p[:, table], w) for p, w in zip(pools, want, strict=True))
    finally:
        store.close()
    if benchmark.stats is not None:
        gbs = {n: nbytes / statistics.median(t) / 1e9 for n, t in times.items()}
        print(f"\nthe engine's pool, {nbytes / 2**20:,.0f} MiB ({TOKENS:,} tokens), hot:")
        for name, base in (
            ("durable park from the pool", "raw write+fsync"),
            ("validated restore into the pool", "raw read + scatter into the pool"),
        ):
            print(
                f"  {name:<32} {gbs[name]:6.2f} GB/s   {base:<33} {gbs[base]:6.2f} GB/s   "
                f"{gbs[name] / gbs[base]:.2f}x"
            )
