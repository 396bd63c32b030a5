"""Benchmark: what opening a RAM level costs, and what a populated arena buys.

Measures and prints ratios of one run; asserts no time.

* ``open``: ``Store.open`` with a RAM level of ``STRATA_BENCH_OPEN_MIB`` (512 MiB by default)
  and no disk level, the old behaviour (``ram_prefault = open``: every page faulted in before
  ``open`` returns) against the new default (``background``: address space at open, and once
  the arena is used a slot's share populated ahead by a thread) and ``lazy``: the time ``open``
  takes and how much
  the process's RSS grew by the time it returned, interleaved round by round.
* ``capture``: a capture of ``STRATA_BENCH_CAPTURE_MIB`` (256 MiB) written into arena chunks
  already populated (what reuse and the background thread give) against the same capture into
  chunks never touched: the lazy arena's first use (its allocation populates the chunks, then
  the copy) and plain first touch (a copy into fresh ``np.empty`` memory, the baseline of the
  arena benchmark).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stratastore import ModelFingerprint, Store
from stratastore.tiers.arena import Arena

MIB = 1 << 20
OPEN_MIB = int(os.environ.get("STRATA_BENCH_OPEN_MIB", "512"))
CAPTURE = int(os.environ.get("STRATA_BENCH_CAPTURE_MIB", "256")) * MIB
FP = ModelFingerprint.create("bench/open", n_layers=4, n_kv_heads=4, head_dim=64, page_tokens=16)
MODES = ("open", "background", "lazy")


def vm_rss() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def median(xs: list[float]) -> float:
    return statistics.median(xs[1:] if len(xs) > 1 else xs)  # the first round warms up


def say(capsys: pytest.CaptureFixture[str], lines: list[str]) -> None:
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def settled(store: Store) -> None:
    """Wait (at most 30 s) until the background thread has populated its window ahead; at
    once when the arena has not been used (its thread populates nothing before the first
    allocation: a store that parks nothing to RAM takes no RAM)."""
    arena = store._tiers.ram.arena
    assert arena is not None
    window = OPEN_MIB * MIB // 4  # a slot's share, slots = 4
    thread = arena._thread
    if not arena._allocs:
        return
    for _ in range(3000):
        if thread is None or not thread.is_alive() or arena.populated_ahead_bytes >= window:
            return
        time.sleep(0.01)


def test_open_time_and_rss(benchmark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    secs: dict[str, list[float]] = {m: [] for m in MODES}
    rss: dict[str, list[float]] = {m: [] for m in MODES}
    later: dict[str, list[float]] = {m: [] for m in MODES}

    def one_round() -> None:
        for mode in MODES:
            cfg = {"ram_mib": OPEN_MIB, "ram_prefault": mode}
            before = vm_rss()
            t = time.perf_counter()
            store = Store.open(FP, cfg)
            secs[mode].append(time.perf_counter() - t)
            rss[mode].append(vm_rss() - before)
            settled(store)
            later[mode].append(vm_rss() - before)
            store.close()

    benchmark.group = "open"
    benchmark.pedantic(one_round, rounds=5, warmup_rounds=0)
    t = {m: median(secs[m]) for m in MODES}
    r = {m: median(rss[m]) / MIB for m in MODES}
    r2 = {m: median(later[m]) / MIB for m in MODES}
    lines = [
        f"Store.open with ram_mib={OPEN_MIB}, slots=4 (medians of {len(secs['open'])} "
        "rounds; RSS growth when open returns, then once the background window is full):"
    ]
    for m in MODES:
        lines.append(
            f"  ram_prefault={m:<10} {t[m] * 1e3:9.1f} ms   RSS +{r[m]:7.1f} MiB, "
            f"then +{r2[m]:7.1f} MiB"
        )
    speed = t["open"] / t["background"]
    lines.append(
        f"  old (open) / new default (background): open time {speed:.0f}x; RSS at "
        f"return +{r['open']:.0f} MiB against +{r['background']:.1f} MiB"
    )
    say(capsys, lines)


def _capture_rounds(src: np.ndarray, warm: Arena) -> dict[str, Callable[[], float]]:
    """Each way of capturing ``src``: a function that does it once and returns its seconds
    (``warm``: an arena populated at open)."""

    def populated() -> float:
        a = warm.alloc(src.nbytes)
        assert a is not None
        t = time.perf_counter()
        warm.write(a, src)
        dt = time.perf_counter() - t
        warm.release(a)
        return dt

    def lazy_first_use() -> float:
        arena = Arena(CAPTURE, prefault="lazy")
        t = time.perf_counter()
        a = arena.alloc(src.nbytes)  # populates the never-used chunks
        assert a is not None
        arena.write(a, src)
        dt = time.perf_counter() - t
        arena.close()
        return dt

    def first_touch() -> float:
        t = time.perf_counter()
        fresh = np.empty(src.nbytes, dtype=np.uint8)
        fresh[:] = src
        dt = time.perf_counter() - t
        del fresh
        return dt

    return {"populated": populated, "lazy first use": lazy_first_use, "first touch": first_touch}


def test_capture_into_populated_chunks_vs_first_touch(
    benchmark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src = np.random.default_rng(0).integers(0, 256, CAPTURE, dtype=np.uint8)
    warm = Arena(CAPTURE, prefault="open")
    ways = _capture_rounds(src, warm)
    secs: dict[str, list[float]] = {k: [] for k in ways}

    def one_round() -> None:
        for name, fn in ways.items():
            secs[name].append(fn())

    benchmark.group = "capture"
    benchmark.pedantic(one_round, rounds=5, warmup_rounds=0)
    warm.close()
    gbs = {k: CAPTURE / median(v) / 1e9 for k, v in secs.items()}
    lines = [f"capture of {CAPTURE // MIB} MiB (medians of {len(secs['populated'])} rounds):"]
    lines += [f"  {k:<16} {v:6.2f} GB/s" for k, v in gbs.items()]
    ratio = gbs["populated"] / gbs["first touch"], gbs["populated"] / gbs["lazy first use"]
    lines.append(
        f"  populated / first touch: {ratio[0]:.1f}x; populated / lazy first use: {ratio[1]:.1f}x"
    )
    say(capsys, lines)
