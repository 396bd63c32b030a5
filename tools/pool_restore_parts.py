"""Time the parts of a validated restore into vLLM's paged pool, each apart, on the same 1 GiB
(8,192 tokens of Llama-3.1-8B's K/V geometry, fp16, pages of 16 tokens, a shuffled block table):
the scatter ``preadv`` of each page into the pool's blocks and BLAKE3 of a page's 64 pieces, on
one thread; BLAKE3 of whole pages, for the cost of hashing in pieces; and both together over
the whole segment on the store's read threads (``--workers`` of them, 2 by default).

    .venv/bin/python tools/pool_restore_parts.py [--workers N] [--cold] [--rounds N]

``--cold`` evicts the segment from the page cache before each read (fsync +
``POSIX_FADV_DONTNEED``, checked with ``mincore``) and times only the reads. Prints GB/s,
medians of the rounds after one warmup."""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stratastore.restore.reads as reads
from strata_harness.peer_protocol import data_files, evict, fingerprint
from stratastore.levels.local import SegmentStore
from stratastore.restore import EngineCapture, PagedKV

TOKENS, BLOCK = 8192, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="the store's read threads")
    ap.add_argument("--cold", action="store_true", help="evict the segment before each read")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    fp = fingerprint()
    blocks = TOKENS // BLOCK
    total = blocks + blocks // 4 + 1
    rng = np.random.default_rng(0)
    pools = [
        rng.integers(0, 1 << 16, (2, total, BLOCK, fp.n_kv_heads, fp.head_dim), dtype=np.uint16)
        for _ in range(fp.n_layers)
    ]
    dest = PagedKV(fp, pools, rng.permutation(total)[:blocks])
    root = tempfile.mkdtemp(prefix="strata-parts-")
    try:
        store = SegmentStore.open(root, fp)
        tokens = np.arange(TOKENS, dtype=np.uint32)
        key = store.put_kv(
            fp.digest(), tokens, EngineCapture(dest, TOKENS).segment(0, TOKENS), token_start=0
        ).key
        pb, nbytes = fp.page_bytes, TOKENS * fp.token_bytes
        views = [dest.page_views(t, BLOCK) for t in range(0, TOKENS, BLOCK)]
        flat = np.ones(nbytes, np.uint8)
        reads._pool = ThreadPoolExecutor(args.workers)

        def readv() -> None:
            with store.open_reader(key) as seg:
                for i, v in enumerate(views):
                    seg.readv_into(v, i * pb)

        def hash_pieces() -> None:
            for v in views:
                h = blake3.blake3()
                for piece in v:
                    h.update(piece)
                h.digest()

        def hash_pages() -> None:
            for a in range(0, nbytes, pb):
                blake3.blake3(flat[a : a + pb].data).digest()

        def both() -> None:
            with store.open_reader(key) as seg:
                reads.read_scattered_hashed(seg, views, pb, 0)

        ops: dict[str, Callable[[], None]] = {
            "preadv into the pool, 1 thread": readv,
            f"read + BLAKE3 into the pool, {args.workers} threads": both,
        }
        if not args.cold:
            ops["BLAKE3 of 64 pieces a page, 1 thread"] = hash_pieces
            ops["BLAKE3 of whole pages, 1 thread"] = hash_pages
        times: dict[str, list[float]] = {name: [] for name in ops}
        files = data_files([root])
        for rnd in range(args.rounds + 1):
            for name, op in ops.items():
                if args.cold and evict(files) > 0.01:
                    raise SystemExit("the segment stayed in the page cache: not a cold read")
                t = time.perf_counter()
                op()
                if rnd:
                    times[name].append(time.perf_counter() - t)
        store.close()
        print(
            f"{nbytes / 2**30:.2f} GiB, {'cold' if args.cold else 'hot'}, medians of {args.rounds}"
        )
        for name, secs in times.items():
            print(f"  {name:<44} {nbytes / statistics.median(secs) / 1e9:6.2f} GB/s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
