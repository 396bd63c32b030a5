"""Benchmark: the cost of lookup, park and capacity GC as the number of stored conversations grows
(it must not grow beyond a logarithm). Measures and prints; the one assertion is a wide ratio bound
on lookup, never a wall-clock time.

One cold-only store in tmpfs (``/dev/shm`` where there is one: fsync is nearly free there) is
grown through the public API, size after size, and measured at each: conversation ``c<i>`` is 8
tokens in two segments of one page each, the first shared by every eighth conversation (so
chains, shared segments and reference counts exist), checkpoints at 4 and 8, none pinned.

At each size, in the same run:

* ``lookup hit`` / ``lookup miss`` / ``restore``: a stored prompt, an absent one, and the
  restore of a stored one into a flat buffer (lookup included);
* ``park+flush``: one new conversation written and committed (the catalog's transactions and
  the GC's check included), on a level with room;
* ``GC park+flush``: the same on a full level, so each one removes the oldest conversation(s)
  first; the level is made full by reopening it with ``cold_mib`` just above what it holds and
  saving a session (never evicted) that fills the rest; ``lookup after GC`` is the next lookup,
  which brings this process's lookup tree in step with the removals;
* ``open`` and ``first lookup``: ``Store.open`` (which reconciles the catalog with the files)
  and the first lookup after it (which loads the lookup tree): O(n) by design, once a process.

Sizes: 1k and 4k by default (``make test``: the code path and the growth printed, in seconds);
1k, 10k and 100k with ``STRATA_BENCH_SCALE=full`` (``make bench``; populating 100k takes
minutes). Population is not measured.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from tests.conftest import tiny_fp

FULL = os.environ.get("STRATA_BENCH_SCALE", "") == "full"
SIZES = (1_000, 10_000, 100_000) if FULL else (1_000, 4_000)
FP = tiny_fp("bench/scaling")  # 64 bytes a token, pages of 4 tokens
GROUPS = 8  #: conversations share their first segment with every GROUPS-th other
MIB = 1 << 20
BIG_MIB = 1 << 20  #: the budget while growing: never full
OPS = (
    "lookup hit",
    "lookup miss",
    "restore",
    "park+flush",
    "GC park+flush",
    "lookup after GC",
    "open",
    "first lookup",
)
ONCE = ("open", "first lookup")  #: O(n) by design: reported, not judged
#: op -> size -> median seconds (filled size by size; printed as a table after the last)
ROWS: dict[str, dict[int, float]] = {op: {} for op in OPS}


def conversation(i: int) -> tuple[Conversation, np.ndarray]:
    g = 1_000_000 + 4 * (i % GROUPS)
    toks = np.array([g, g + 1, g + 2, g + 3, 4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3], np.uint32)
    conv = Conversation(f"c{i}", toks, [Checkpoint(4), Checkpoint(8)], cuts=[0, 4])
    return conv, np.full(len(toks) * FP.token_bytes, i % 251, np.uint8)


def median_s(fn: Callable[[int], object], rounds: int) -> float:
    times = []
    for k in range(rounds):
        t = time.perf_counter()
        fn(k)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Scaled:
    """The growing store: ``parked`` conversations parked so far, ``removed`` of them by GC
    (the oldest ones), so ``c<removed>`` ... ``c<parked - 1>`` are stored."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.parked = 0
        self.removed = 0
        self.store = self.open(BIG_MIB)

    @property
    def stored(self) -> int:
        return self.parked - self.removed

    def open(self, mib: int) -> Store:
        cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(self.root / "cold"), "cold_mib": mib}
        return Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda _msg: None)

    def park_next(self) -> None:
        self.store.park(*conversation(self.parked))
        self.parked += 1

    def grow_to(self, n: int) -> float:
        t = time.perf_counter()
        while self.stored < n:
            self.park_next()
        self.store.flush()
        return time.perf_counter() - t

    def hit(self, k: int) -> np.ndarray:
        """A prompt continuing a stored conversation of the newer half (GC takes the oldest)."""
        conv, _ = conversation(self.parked - 1 - (k * 7919) % (self.stored // 2))
        return np.append(conv.tokens, np.uint32(5_000_000))

    def lookup_hit(self, k: int) -> None:
        assert self.store.lookup(self.hit(k)) == ("disk", 8)

    def lookup_miss(self, k: int) -> None:
        assert self.store.lookup(np.arange(6_000_000 + k, 6_000_009 + k, dtype=np.uint32)) is None

    def restore(self, k: int) -> None:
        prompt = self.hit(k)
        out = np.empty(len(prompt) * FP.token_bytes, np.uint8)
        assert self.store.restore(prompt, out).tokens == 8

    def park_flush(self, _k: int) -> None:
        self.park_next()
        self.store.flush()

    def gc_removed(self) -> int:
        return int(self.store.stats()["gc_removed"])

    def measure(self, n: int, rounds: int) -> None:
        """Every op of :data:`OPS` at the current size into :data:`ROWS`."""
        lookups = rounds * 5
        ROWS["lookup hit"][n] = median_s(self.lookup_hit, lookups)
        ROWS["lookup miss"][n] = median_s(self.lookup_miss, lookups)
        ROWS["restore"][n] = median_s(self.restore, lookups)
        ROWS["park+flush"][n] = median_s(self.park_flush, rounds)
        used = int(self.store.stats()["levels"]["cold"]["bytes"])
        self.store.close()
        budget = used // MIB + 2
        t = time.perf_counter()
        self.store = self.open(budget)
        ROWS["open"][n] = time.perf_counter() - t
        t = time.perf_counter()
        self.lookup_hit(0)
        ROWS["first lookup"][n] = time.perf_counter() - t
        self.fill(budget * MIB - used)
        gc_parks: list[float] = []
        after: list[float] = []
        before = self.gc_removed()
        for k in range(rounds):
            t = time.perf_counter()
            self.park_flush(k)
            gc_parks.append(time.perf_counter() - t)
            t = time.perf_counter()
            self.lookup_hit(k)
            after.append(time.perf_counter() - t)
        gone = self.gc_removed() - before
        assert gone >= rounds, f"{gone} conversations removed by {rounds} parks on a full level"
        self.removed += gone
        ROWS["GC park+flush"][n] = statistics.median(gc_parks)
        ROWS["lookup after GC"][n] = statistics.median(after)
        print(f"\n{n:,} conversations: {gone} removed by {rounds} parks on a full level")
        self.store.delete_session("filler")
        self.store.close()
        self.store = self.open(BIG_MIB)

    def fill(self, free: int) -> None:
        """Save a session that leaves less room than one more conversation's ``make_room``
        asks (a page plus 8 KiB), then park until GC has run once: the level is full."""
        tokens = (free - 8192) // FP.page_bytes * FP.page_tokens
        toks = np.arange(3_000_000, 3_000_000 + tokens, dtype=np.uint32)
        self.store.save_session("filler", toks, np.zeros(tokens * FP.token_bytes, np.uint8))
        before = self.gc_removed()
        for _ in range(10):
            self.park_flush(0)
            if self.gc_removed() > before:
                self.removed += self.gc_removed() - before
                return
        raise AssertionError("the level is not full after saving the filler session")


@pytest.fixture(scope="module")
def scaled() -> Iterator[Scaled]:
    shm = "/dev/shm"
    root = Path(
        tempfile.mkdtemp(
            prefix="strata-scaling-",
            dir=shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None,
        )
    )
    s = Scaled(root)
    try:
        yield s
    finally:
        s.store.close()
        shutil.rmtree(root, ignore_errors=True)


def table() -> str:
    sizes = sorted(ROWS["lookup hit"])
    base = sizes[0]
    head = f"{'op':<16}" + "".join(f"{n:>12,}" for n in sizes) + "   growth vs " + f"{base:,}"
    lines = [head + " (median us)"]
    for op in OPS:
        us = "".join(f"{ROWS[op][n] * 1e6:>12,.0f}" for n in sizes)
        growth = " ".join(f"{ROWS[op][n] / ROWS[op][base]:6.1f}x" for n in sizes[1:])
        lines.append(f"{op:<16}{us}   {growth}{'   (O(n) by design)' if op in ONCE else ''}")
    ref = " ".join(f"{math.log(n) / math.log(base):6.2f}x" for n in sizes[1:])
    lines.append(f"{'log(N)/log(1k)':<16}{'':>{12 * len(sizes)}}   {ref}")
    return "\n".join(lines)


@pytest.mark.parametrize("n", SIZES, ids=[f"{n // 1000}k" for n in SIZES])
def test_cost_at_size(benchmark: Any, scaled: Scaled, n: int) -> None:
    took = scaled.grow_to(n)
    print(f"\npopulated to {scaled.stored:,} conversations in {took:.1f} s")
    quick = benchmark.disabled  # make test: each body once; keep the file within seconds
    benchmark.group = "scaling: lookup hit"
    benchmark.extra_info["conversations"] = scaled.stored
    benchmark(scaled.lookup_hit, 0)
    scaled.measure(n, 5 if quick else 40)
    if n == SIZES[-1]:
        print("\n" + table())
        # the lookup tree is walked from the root: a size 100x larger costs a few more levels
        # of dicts and LMDB pages, never 20x (a bound a logarithm meets with a wide margin)
        for op in ("lookup hit", "lookup miss"):
            assert ROWS[op][n] < 20 * ROWS[op][SIZES[0]], table()
