"""Benchmark: durable put and validated get of a 1 GiB segment set against the raw limits of the
same directory, on the same bytes, in one run. Benchmarks measure; they never assert a time. ``make
bench`` runs 5 rounds (after a warmup) and prints GB/s and ratios from the medians
(tests/bench/conftest.py); ``make test`` runs one round (``--benchmark-disable``) so the code path
stays tested.

The set is 8 segments of 1,024 tokens of Llama-3.1-8B's K/V geometry (32 layers x 8 kv heads x
128 dims, fp16: 128 MiB a segment, 2 MiB pages). Size with STRATA_BENCH_MIB (default 1024).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ModelFingerprint
from stratastore.levels.local import SegmentStore

MIB = int(os.environ.get("STRATA_BENCH_MIB", "1024"))
SEGMENTS = 8
FP = ModelFingerprint.create(
    "bench/llama-3.1-8b-geometry", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
)
TOKENS = max(1, MIB * (1 << 20) // SEGMENTS // FP.token_bytes)
SEG_BYTES = TOKENS * FP.token_bytes
TOTAL = SEG_BYTES * SEGMENTS
ROUNDS = 5
CHUNK = 16 << 20
#: seconds per operation, every round (warmup included: dropped when printing)
SAMPLES: dict[str, list[float]] = {}


class BenchSet:
    def __init__(self, root: Path) -> None:
        self.root = root
        rng = np.random.default_rng(0)
        self.payload = rng.integers(0, 256, TOTAL, dtype=np.uint8)
        self.out = np.ones(TOTAL, dtype=np.uint8)  # touched once, reused: as engine buffers are
        self.raw_file = root / "raw.bin"
        self.store_dir = root / "store"
        self.tokens = [np.arange(i * TOKENS, (i + 1) * TOKENS) for i in range(SEGMENTS)]
        self.keys: list[bytes] = []

    def segment(self, i: int) -> np.ndarray:
        return self.payload[i * SEG_BYTES : (i + 1) * SEG_BYTES]

    def raw_write_fsync(self) -> None:
        fd = os.open(self.raw_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(self.payload)
            for i in range(0, TOTAL, CHUNK):
                os.write(fd, view[i : i + CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)

    def drop_raw(self) -> None:
        self.raw_file.unlink(missing_ok=True)

    def raw_read(self) -> None:
        with open(self.raw_file, "rb", buffering=0) as f:
            view = memoryview(self.out)
            for i in range(0, TOTAL, CHUNK):
                f.readinto(view[i : i + CHUNK])

    def fresh_store(self) -> None:
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def put_all(self) -> None:
        with SegmentStore.open(self.store_dir, FP) as store:
            parent, self.keys = store.root_key, []
            for i in range(SEGMENTS):
                r = store.put_kv(parent, self.tokens[i], self.segment(i), token_start=i * TOKENS)
                self.keys.append(r.key)
                parent = r.key

    def get_all(self) -> None:
        with SegmentStore.open(self.store_dir, FP) as store:
            for i, key in enumerate(self.keys):
                store.get_into(key, self.out[i * SEG_BYTES : (i + 1) * SEG_BYTES])

    def view_all(self) -> None:
        with SegmentStore.open(self.store_dir, FP) as store:
            for key in self.keys:
                store.view(key)


@pytest.fixture(scope="module")
def bench_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchSet]:
    bs = BenchSet(tmp_path_factory.mktemp("bench"))
    bs.raw_write_fsync()
    bs.put_all()
    yield bs
    shutil.rmtree(bs.root, ignore_errors=True)


def timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def test_store_vs_raw_interleaved(benchmark: Any, bench_set: BenchSet) -> None:
    """One benchmark round = each operation once, store and raw alternating first, so drift
    on this noisy machine hits both sides alike. Per-operation times go to ``SAMPLES``."""
    bs = bench_set
    rnd = [0]

    def one_round() -> None:
        writes = [
            ("raw write+fsync", bs.raw_write_fsync, bs.drop_raw),
            ("put (durable)", bs.put_all, bs.fresh_store),
        ]
        reads = [
            ("raw read (hot)", bs.raw_read),
            ("get_into (validated, hot)", bs.get_all),
            ("view (validated, hot)", bs.view_all),
        ]
        if rnd[0] % 2:
            writes.reverse()
            reads.reverse()
        rnd[0] += 1
        for name, fn, reset in writes:
            reset()
            SAMPLES.setdefault(name, []).append(timed(fn))
        bs.raw_read()  # both files hot before timing reads
        bs.get_all()
        for name, fn in reads:
            SAMPLES.setdefault(name, []).append(timed(fn))

    benchmark.group = f"store {TOTAL >> 20} MiB"
    benchmark.extra_info["bytes"] = TOTAL
    benchmark.pedantic(one_round, rounds=ROUNDS, warmup_rounds=1)
    assert np.array_equal(bs.out, bs.payload)  # what was put reads back, validated
