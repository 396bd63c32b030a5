"""A validated restore beside the machine's own rates (:mod:`strata_harness.restore_rates`: a
cold and a hot restore into the engine's pool beside the raw cold read, numpy's load + scatter,
BLAKE3 on both cores and a read + BLAKE3 on both cores; a durable park beside a raw write +
fsync; medians of ``--rounds`` with their spread), or with ``--profile`` ``--rounds`` cold and
hot restores traced stage by stage (the median round shown): per thread, CPU seconds reading
(the kernel's copy), hashing, asking for read-ahead and applying, the rest of its CPU
(bookkeeping, and the tracer's own cost), seconds waiting in a read (the disk), waiting for a
CPU, and idle (waiting for another thread or the GIL).

    .venv/bin/python tools/cold_restore.py [--rounds 5] [--tokens 8192] [--dir D] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata_harness.peer_protocol import evict, warm
from strata_harness.restore_rates import Bench, measure, render


# -- the per-stage profile (--profile) ---------------------------------------------------------
class _Trace:
    """Seconds each thread spends in each stage of a restore (wall and the thread's own CPU),
    from wrappers around the functions that do the work; off outside the traced call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wall: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.cpu: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.on = False

    def wrap(self, fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def traced(*a: Any, **k: Any) -> Any:
            if not self.on:
                return fn(*a, **k)
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                w, c = time.perf_counter() - w0, time.thread_time() - c0
                key = (threading.current_thread().name, stage)
                with self.lock:
                    self.wall[key] += w
                    self.cpu[key] += c

        return traced


def _schedstat() -> dict[str, tuple[float, float]]:
    """Per live thread of this process: seconds on a CPU and seconds waiting for one
    (``/proc/self/task/*/schedstat``), by thread name."""
    out = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue
        out[t.name] = (int(run) / 1e9, int(wait) / 1e9)
    return out


def _trace_stages(trace: _Trace) -> None:
    """Wrap the functions that do each stage's work (whichever of them this version has)."""
    import numba_kernels
    import stratastore.io.files as files
    from stratastore.format.level_key import PageHasher
    from stratastore.levels.reader import SegmentReader
    from stratastore.restore.delivery import Delivery

    for cls, name, stage in (
        (SegmentReader, "_read_at", "read"),
        (SegmentReader, "_readv_at", "read"),
        (files, "advise_range", "advise"),
        (numba_kernels, "hash_page", "hash"),
        (Delivery, "take", "apply"),
    ):
        if hasattr(cls, name):
            setattr(cls, name, trace.wrap(getattr(cls, name), stage))
    new = PageHasher.new

    class _Timed:
        def __init__(self, h: Any) -> None:
            self.h, self.update = h, trace.wrap(h.update, "hash")

        def digest(self) -> bytes:
            return bytes(self.h.digest())

    PageHasher.new = lambda self: _Timed(new(self))  # type: ignore[method-assign]


STAGES = ("read", "hash", "advise", "apply")


def profile(run: Callable[[], int], nbytes: int, title: str, trace: _Trace) -> tuple[float, str]:
    """One traced restore: its wall seconds and its table: per thread, seconds on a CPU in each
    stage, the rest of its CPU (bookkeeping and the tracer's own cost), seconds waiting in a
    read (the disk), waiting for a CPU, and idle (waiting for another thread or the GIL)."""
    trace.wall.clear()
    trace.cpu.clear()
    s0, c0 = _schedstat(), os.times()
    trace.on = True
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    trace.on = False
    s1, c1 = _schedstat(), os.times()
    process = (c1.user - c0.user) + (c1.system - c0.system)
    head = "".join(f"{s + ' cpu':>12}" for s in STAGES)
    lines = [
        f"{title}: {wall:.3f} s, {nbytes / wall / 1e9:.2f} GB/s",
        f"  {'thread':<26}{'on CPU':>8}{head}{'other cpu':>11}{'read wait':>11}"
        f"{'runqueue':>10}{'idle':>8}",
    ]
    for name in sorted(s1):
        run0, q0 = s0.get(name, (0.0, 0.0))
        on, queued = s1[name][0] - run0, s1[name][1] - q0
        cpu = {s: trace.cpu.get((name, s), 0.0) for s in STAGES}
        if on < 0.002 and not any(cpu.values()):
            continue
        read_wait = max(0.0, trace.wall.get((name, "read"), 0.0) - cpu["read"])
        other = max(0.0, on - sum(cpu.values()))
        idle = max(0.0, wall - on - queued - read_wait)
        cells = "".join(f"{cpu[s]:12.3f}" for s in STAGES)
        lines.append(
            f"  {name[:26]:<26}{on:8.3f}{cells}{other:11.3f}{read_wait:11.3f}"
            f"{queued:10.3f}{idle:8.3f}"
        )
        process -= on
    lines.append(f"  {'(threads ended by now)':<26}{max(0.0, process):8.2f}")
    return wall, "\n".join(lines)


def profiles(bench: Bench, rounds: int) -> None:
    """``rounds`` traced cold and hot restores, alternating; prints, for each, the round whose
    wall time is the median, and every round's GB/s."""
    trace = _Trace()
    _trace_stages(trace)
    bench.restore()  # the threads and the code warmed up, not traced
    got: dict[str, list[tuple[float, str]]] = {"cold": [], "hot": []}
    for _ in range(rounds):
        if evict(bench.paths) > 0.01:
            raise SystemExit("the data files stayed in the page cache: not a cold read")
        got["cold"].append(profile(bench.restore, bench.nbytes, "restore cold", trace))
        if warm(bench.paths) < 0.99:
            raise SystemExit("the data files did not stay in the page cache")
        got["hot"].append(profile(bench.restore, bench.nbytes, "restore hot", trace))
    for runs in got.values():
        runs.sort()
        each = ", ".join(f"{bench.nbytes / w / 1e9:.2f}" for w, _ in runs)
        print(f"{runs[len(runs) // 2][1]}\n  (the median of {rounds} rounds: GB/s {each})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=8192, help="128 KiB each (default: 1 GiB)")
    ap.add_argument("--dir", default=None, help="where the store lives (default: a temp dir)")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="instead: --rounds cold and hot restores traced stage by stage (the median shown)",
    )
    args = ap.parse_args()
    if not args.profile:
        rates = measure(args.dir or tempfile.gettempdir(), tokens=args.tokens, rounds=args.rounds)
        print(render(rates))
        return
    root = tempfile.mkdtemp(prefix="strata-profile-", dir=args.dir)
    bench: Bench | None = None
    try:
        bench = Bench(root, args.tokens)
        bench.open_store()
        profiles(bench, args.rounds)
    finally:
        if bench is not None:
            bench.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
