"""Measure a validated restore into vLLM's CPU block layout alone and beside one other Python
thread that only spins (what an engine's own Python threads can do to a library whose every
read and page hash releases the GIL and then waits to take it back).

    .venv/bin/python tools/restore_beside_a_busy_thread.py [--pin]

512 MiB (4,096 tokens of Llama-3-8B's K/V geometry, bfloat16), parked to disk and restored
hot; ``--pin`` pins the process to one core first, as vLLM pins its CPU worker. Prints GB/s."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stratastore import ModelFingerprint, Store
from stratastore.adapters.vllm.pool import CpuBlocks
from stratastore.chain import Checkpoint, Conversation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pin", action="store_true", help="pin this process to one core first")
    args = ap.parse_args()
    fp = ModelFingerprint.create(
        "bench/llama-3-8b-geometry",
        n_layers=32,
        n_kv_heads=8,
        head_dim=128,
        page_tokens=16,
        dtype="bfloat16",
    )
    tokens = 4096
    blocks = tokens // 16
    pool = [np.ones((blocks + 8, 8, 2, 16, 128), np.uint16) for _ in range(fp.n_layers)]
    ids = list(range(blocks))
    root = tempfile.mkdtemp(prefix="strata-busy-")
    nbytes = tokens * fp.token_bytes
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": f"{root}/cold", "page_resume": True}
    store = Store.open(fp, {**cfg, "cold_mib": 2 * nbytes // 2**20 + 64})
    try:
        conv = Conversation("c", np.arange(tokens, dtype=np.uint32), [Checkpoint(tokens)])
        store.park(conv, CpuBlocks(fp, pool, ids).gather(tokens))
        store.flush()
        prompt = np.arange(tokens, dtype=np.uint32)
        if args.pin:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

        def restore(label: str) -> None:
            t = time.perf_counter()
            got = store.restore(prompt, CpuBlocks(fp, pool, ids))
            assert got.tokens == tokens
            print(f"{label:<32} {nbytes / (time.perf_counter() - t) / 1e9:6.2f} GB/s")

        restore("warmup")
        restore("alone")
        stop = threading.Event()

        def spin() -> None:
            x = 0
            while not stop.is_set():
                x += 1

        busy = threading.Thread(target=spin, daemon=True)
        busy.start()
        restore("beside a spinning Python thread")
        restore("beside a spinning Python thread")
        stop.set()
        busy.join()
    finally:
        store.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
