"""Benchmark: a restore right after another conversation's park, and restores from several threads.
Measures and prints ratios of one run; asserts no time.

* ``after a park``: conversation B (``STRATA_BENCH_ENGINE_MIB``, 16 MiB by default, on disk,
  hot in the page cache) restored into a touched flat buffer right after the engine parked
  another conversation A of the same size to disk (A's write and fsync in flight), against the
  same restore with nothing pending; interleaved round by round, medians. Once, every
  restore first waited for every pending write (the ratio was the fsync's cost); now the ratio
  is what A's write costs B in CPU and disk bandwidth on this machine.
* ``threads``: 1, 2 and 4 engine threads, each restoring a conversation of its own in a loop
  (hot), total GB/s against 1 thread. A restore already reads and hashes on the store's worker
  threads, so on a machine with few cores the threads share those cores; what this shows is
  that no lock serialises them (once, one lock held every restore, I/O included).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store

MIB = 1 << 20
SIZE = int(os.environ.get("STRATA_BENCH_ENGINE_MIB", "16")) * MIB
FP = ModelFingerprint.create(
    "bench/engine-path", n_layers=8, n_kv_heads=8, head_dim=128, page_tokens=16
)
TOKENS = SIZE // FP.token_bytes
ROUNDS = 9


def conversation(i: int) -> tuple[Conversation, np.ndarray]:
    toks = np.arange(i * 10_000_000, i * 10_000_000 + TOKENS, dtype=np.uint32)
    kv = np.random.default_rng(i).integers(0, 256, TOKENS * FP.token_bytes, dtype=np.uint8)
    return Conversation(f"c{i}", toks, [Checkpoint(TOKENS)]), kv


def open_store(root: Path) -> Store:
    return Store.open(
        FP,
        {
            "ram_mib": 0,
            "park": "disk",
            "cold_dir": str(root / "cold"),
            "cold_mib": 64 * SIZE // MIB + 64,
        },
    )


def test_restore_right_after_another_conversations_park(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "engine path: restore after a park"
    rounds = 2 if benchmark.disabled else ROUNDS
    with open_store(tmp_path) as store:
        b, kvb = conversation(0)
        store.park(b, kvb.copy())
        store.flush()
        out = np.ones(kvb.size, np.uint8)  # touched once and reused, as an engine's K/V
        store.restore(b.tokens, out)  # warm: B hot in the page cache
        idle, after, flush = [], [], []
        for r in range(rounds):
            t = time.perf_counter()
            assert store.restore(b.tokens, out).tokens == TOKENS
            idle.append(time.perf_counter() - t)
            a, kva = conversation(1 + r)
            store.park(a, kva)  # its write and fsync are now in flight on the spill writer
            t = time.perf_counter()
            got = store.restore(b.tokens, out)
            after.append(time.perf_counter() - t)
            assert (got.source, got.tokens) == ("disk", TOKENS)
            t = time.perf_counter()
            store.flush()
            flush.append(time.perf_counter() - t)
        assert np.array_equal(out, kvb)
        benchmark.pedantic(store.restore, (b.tokens, out), rounds=1, iterations=1)
    med = {k: statistics.median(v) for k, v in (("idle", idle), ("after", after), ("flush", flush))}
    benchmark.extra_info.update({f"{k}_ms": v * 1e3 for k, v in med.items()})
    print(
        f"\nrestore of {SIZE / MIB:.0f} MiB (hot), medians of {rounds}: nothing pending "
        f"{med['idle'] * 1e3:.1f} ms; right after another conversation's park "
        f"{med['after'] * 1e3:.1f} ms ({med['after'] / med['idle']:.2f}x); that park's "
        f"write still took {med['flush'] * 1e3:.1f} ms to flush after the restore returned"
    )


def test_restores_from_several_threads(benchmark: Any, tmp_path: Path) -> None:
    benchmark.group = "engine path: threads"
    loops = 1 if benchmark.disabled else 6
    with open_store(tmp_path) as store:
        convs = [conversation(i) for i in range(4)]
        for c, kv in convs:
            store.park(c, kv.copy())
        store.flush()
        outs = [np.ones(kv.size, np.uint8) for _, kv in convs]

        def run(n: int) -> float:
            errors: list[BaseException] = []

            def work(i: int) -> None:
                try:
                    for _ in range(loops):
                        assert store.restore(convs[i][0].tokens, outs[i]).tokens == TOKENS
                except BaseException as e:  # reported by the caller, not lost in the thread
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            secs = time.perf_counter() - t
            if errors:
                raise errors[0]
            return n * loops * SIZE / secs / 1e9

        run(4)  # warm: every conversation hot
        rates: dict[int, list[float]] = {1: [], 2: [], 4: []}
        for _ in range(1 if benchmark.disabled else 3):
            for n in rates:
                rates[n].append(run(n))
        for i, (_, kv) in enumerate(convs):
            assert np.array_equal(outs[i], kv)
        benchmark.pedantic(run, (1,), rounds=1, iterations=1)
    gbs = {n: statistics.median(v) for n, v in rates.items()}
    benchmark.extra_info.update({f"threads_{n}_gbs": v for n, v in gbs.items()})
    print(
        f"\nrestores of {SIZE / MIB:.0f} MiB (hot) from 1/2/4 threads on {os.cpu_count()} "
        f"cores: "
        + ", ".join(f"{n} thread(s) {v:.2f} GB/s ({v / gbs[1]:.2f}x)" for n, v in gbs.items())
    )
