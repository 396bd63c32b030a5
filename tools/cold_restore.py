"""A cold validated restore into the engine's pool, with and without the read pass's read-ahead,
beside a raw cold read of the same bytes, rounds interleaved in one process: where a cold
restore's time goes (the disk, or the two passes on the cores).

The pool and the store are those of ``strata bench --peers``' engine-pool protocol
(:mod:`strata_harness.peer_pool`: 8,192 tokens of Llama-3.1-8B's K/V geometry, 1 GiB, vLLM's
paged layout, a shuffled block table, ``Store.park(conv, PagedKV(...))`` to a disk level).
Each round evicts the store's data files (fsync + ``POSIX_FADV_DONTNEED``, checked with
``mincore``) before each of:

- **raw cold read**: ``pread`` of every data file into one touched buffer, 4 MiB a call, one
  thread (the bytes a restore reads, unvalidated, in the file's order);
- **restore cold**: ``Store.restore(prompt, PagedKV(pool))``, every page validated;
- **restore cold, no read-ahead**: the same with the read pass's per-chunk ``WILLNEED``
  switched off (:func:`stratastore.restore.reads.read_ahead`), as before it existed;

and once the data is resident, **restore hot**, with and without the read-ahead (what the two
passes cost the cores with no disk, and what asking for resident pages costs).
For each restore the process's CPU seconds (user + system) over its wall seconds: 2.0 is both
cores busy. Prints GB/s, medians of ``--rounds`` after one warmup round, and the ratios.

    .venv/bin/python tools/cold_restore.py [--rounds 5] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stratastore.restore.two_pass as two_pass
from strata_harness.peer_pool import Pool
from strata_harness.peer_protocol import TOKEN_BYTES, data_files, evict, fingerprint, warm
from stratastore import Store
from stratastore.chain import Checkpoint, Conversation

TOKENS = 8192
READ_BYTES = 4 << 20


def raw_read(paths: list[str], buf: np.ndarray) -> int:
    """Every file into ``buf`` (reused from its start for each file), 4 MiB a ``pread``."""
    view, n = memoryview(buf), 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            off = 0
            while got := os.preadv(fd, [view[: min(READ_BYTES, buf.size)]], off):
                off += got
            n += off
        finally:
            os.close(fd)
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the store lives (default: a temp dir)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="strata-cold-", dir=args.dir)
    fp = fingerprint()
    nbytes = TOKENS * TOKEN_BYTES
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": root, "page_resume": True}
    cfg["cold_mib"] = 2 * nbytes // 2**20 + 64
    try:
        pool = Pool(TOKENS)
        rng = np.random.default_rng(0)
        for layer in pool.layers:  # bytes that differ page to page, as K/V does
            layer.view(np.uint16)[:] = rng.integers(0, 1 << 16, layer.shape, dtype=np.uint16)
        with Store.open(fp, cfg) as store:
            conv = Conversation("cold", np.arange(TOKENS, dtype=np.uint32), [Checkpoint(TOKENS)])
            store.park(conv, pool.destination(fp))
            store.flush()
        paths = [p for p in data_files([root]) if os.path.basename(p).startswith("strata-conv-")]
        if sum(os.path.getsize(p) for p in paths) < nbytes:
            raise SystemExit(f"the store's data files hold less than {nbytes:,} bytes")
        target = Pool(TOKENS, seed=1)
        buf = np.ones(READ_BYTES, np.uint8)
        prompt = np.arange(TOKENS, dtype=np.uint32)
        read_ahead = two_pass.read_ahead

        def restore(ahead: bool) -> Callable[[], int]:
            def run() -> int:
                two_pass.read_ahead = read_ahead if ahead else (lambda *a: None)
                try:
                    with Store.open(fp, cfg) as s:
                        return int(s.restore(prompt, target.destination(fp)).tokens) * TOKEN_BYTES
                finally:
                    two_pass.read_ahead = read_ahead

            return run

        ops: dict[str, tuple[Callable[[], int], bool]] = {
            "raw cold read (1 thread, 4 MiB preads)": (lambda: raw_read(paths, buf), True),
            "restore cold (validated)": (restore(True), True),
            "restore cold, no read-ahead": (restore(False), True),
            "restore hot (validated)": (restore(True), False),
            "restore hot, no read-ahead": (restore(False), False),
        }
        gbps: dict[str, list[float]] = {name: [] for name in ops}
        cores: dict[str, list[float]] = {name: [] for name in ops}
        for rnd in range(args.rounds + 1):
            for name, (op, cold) in ops.items():
                if cold and evict(paths) > 0.01:
                    raise SystemExit("the data files stayed in the page cache: not a cold read")
                if not cold and warm(paths) < 0.99:
                    raise SystemExit("the data files did not stay in the page cache")
                c0, t0 = os.times(), time.perf_counter()
                got = op()
                t1, c1 = time.perf_counter(), os.times()
                if got < nbytes:
                    raise SystemExit(f"{name}: {got:,} bytes of {nbytes:,}")
                if rnd:
                    gbps[name].append(nbytes / (t1 - t0) / 1e9)
                    cpu = (c1.user - c0.user) + (c1.system - c0.system)
                    cores[name].append(cpu / (t1 - t0))
        load = os.getloadavg()[0]
        print(
            f"{nbytes / 2**30:.2f} GiB, medians of {args.rounds} rounds, 1-minute load {load:.2f}"
        )
        med = {name: statistics.median(v) for name, v in gbps.items()}
        for name in ops:
            busy = statistics.median(cores[name])
            print(f"  {name:<40} {med[name]:6.2f} GB/s   cores busy {busy:.2f}")
        raw = med["raw cold read (1 thread, 4 MiB preads)"]
        for name in ("restore cold (validated)", "restore cold, no read-ahead"):
            print(f"  {name + ' / raw cold read':<60} {med[name] / raw:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
