"""The chunk store's own rates, without an engine, against the same work done with plain
system calls on the same disk: what a vLLM tier's stores and loads can reach at most.

    .venv/bin/python tools/chunk_store_rates.py --dir /var/tmp/strata-chunk-rates [--rounds 3]

For ``--chunks`` chunks of ``--chunk-mib`` MiB (576 x 2 MiB: Llama-3-8B's K/V, one 16-token
block a chunk), ``--threads`` threads each way, per round, GB/s:

- **plain store, fsynced**: each chunk a data file and a 4 KiB sidecar written and fsynced,
  renamed in groups of 32 with the directory fsynced twice a group (the durable protocol's
  system calls, spec F-DUR-2, without the store's early writeback);
- **plain store, no fsync**: each chunk one file written and renamed (what vLLM's ``fs`` tier does);
- **put_many**: ``ChunkStore.put_many`` of 32 chunks at a time a thread;
- **load cold / hot, raw**: ``preadv`` of each data file's payload (cold: the files dropped from
  the page cache first with ``posix_fadvise(DONTNEED)``);
- **load cold / hot**: the chunk store's validated read (``open_chunk`` + ``read_into``);
- **hot beside a spinning thread**: the hot loads again while one more Python thread runs a
  loop and sleeps 0.5 ms, as an engine's scheduler does in the same process (a GIL-bound read
  path slows down; a raw read barely does).
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from strata_harness.peer_protocol import evict
from stratastore.chunks import ChunkLevel, ChunkStore, stored_key
from stratastore.format import ModelFingerprint, data_name

GROUP = 32


def _rate(nbytes: int, run: Callable[[], object]) -> float:
    t = time.perf_counter()
    run()
    return nbytes / (time.perf_counter() - t) / 1e9


def _drop(root: Path) -> None:
    """Evict every file under ``root`` from the page cache (the peers benchmark's probe:
    fsync + ``POSIX_FADV_DONTNEED``); a cold round whose files stayed resident says so."""
    left = evict([str(p) for p in root.rglob("*") if p.is_file()])
    if left > 0.01:
        print(f"warning: {left:.0%} of the files stayed in the page cache", flush=True)


def _raw_store(d: Path, n: int, data: bytes, threads: int, sync: bool) -> None:
    lock = threading.Lock()
    side = os.urandom(4096)

    def dirsync() -> None:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(path: Path, b: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def work(t: int) -> None:
        mine = list(range(t, n, threads))
        for g in range(0, len(mine), GROUP):
            names = mine[g : g + GROUP]
            for i in names:
                write(d / f"tmp-{i}.seg", data)
                if sync:
                    write(d / f"tmp-{i}.side", side)
            with lock:
                for i in names:
                    os.replace(d / f"tmp-{i}.seg", d / f"{i}.seg")
                if sync:
                    dirsync()
                    for i in names:
                        os.replace(d / f"tmp-{i}.side", d / f"{i}.side")
                    dirsync()

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(work, range(threads)))


def _round(base: Path, n: int, size: int, th: int, pages: list[np.ndarray]) -> dict[str, float]:
    total = n * size
    row: dict[str, float] = {}
    for name, sync in (("plain store, fsynced", True), ("plain store, no fsync", False)):
        d = base / ("fsynced" if sync else "unsynced")
        d.mkdir(parents=True)
        data = pages[0].tobytes()
        row[name] = _rate(total, lambda: _raw_store(d, n, data, th, sync))  # noqa: B023
        shutil.rmtree(d)
    d = base / "chunks"
    keys = [os.urandom(32) for _ in range(n)]
    fp = ModelFingerprint.create(
        "bench/chunks", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
    )
    local = threading.local()
    with ChunkStore.open([ChunkLevel(str(d), budget_bytes=2 * total + (1 << 30))], fp) as cs:

        def put(t: int) -> None:
            mine = list(range(t, n, th))
            for g in range(0, len(mine), GROUP):
                part = mine[g : g + GROUP]
                out = cs.put_many([keys[i] for i in part], [pages[i % 8] for i in part])
                assert out == ["stored"] * len(part), out

        def load(k: bytes) -> None:
            if not hasattr(local, "b"):
                local.b = np.empty(size, np.uint8)
            chunk = cs.open_chunk(k)
            assert chunk is not None and cs.read_into(chunk, local.b)

        def raw(k: bytes) -> None:
            if not hasattr(local, "c"):
                local.c = bytearray(size)
            fd = os.open(d / data_name(stored_key(k)), os.O_RDONLY)
            try:
                os.preadv(fd, [memoryview(local.c)], os.fstat(fd).st_size - size)
            finally:
                os.close(fd)

        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                x = 0
                for i in range(20_000):
                    x += i
                time.sleep(0.0005)

        with ThreadPoolExecutor(th) as ex:
            row["put_many"] = _rate(total, lambda: list(ex.map(put, range(th))))
            for label, fn in (("raw", raw), ("chunk store", load)):
                _drop(d)
                row[f"load cold, {label}"] = _rate(total, lambda: list(ex.map(fn, keys)))  # noqa: B023
                row[f"load hot, {label}"] = _rate(total, lambda: list(ex.map(fn, keys)))  # noqa: B023
            spinner = threading.Thread(target=spin, daemon=True)
            spinner.start()
            try:
                for label, fn in (("raw", raw), ("chunk store", load)):
                    row[f"load hot beside a spinning thread, {label}"] = _rate(
                        total,
                        lambda: list(ex.map(fn, keys)),  # noqa: B023
                    )
            finally:
                stop.set()
                spinner.join()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", required=True, help="a scratch directory on the disk to measure")
    ap.add_argument("--chunks", type=int, default=576)
    ap.add_argument("--chunk-mib", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    size = args.chunk_mib << 20
    pages = [np.random.default_rng(i).integers(0, 256, size, np.uint8) for i in range(8)]
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        base = Path(args.dir) / f"round-{r}"
        shutil.rmtree(base, ignore_errors=True)
        try:
            row = _round(base, args.chunks, size, args.threads, pages)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
