"""stratastore's SGLang HiCache backend (``StrataHiCacheStorage``) side by side with SGLang's own
``file`` backend, through the same harness: SGLang 0.5.23's ``StorageBackendFactory`` builds each
(the ``dynamic`` backend for stratastore, ``file`` for SGLang's), both driven as its
``HiCacheController`` drives a backend (``strata_harness/sglang_hicache.py``: page hashes from
SGLang's ``get_hash_str``, ``batch_exists``, then the zero-copy calls for stratastore and the
generic ones for ``file``), on the same pages of a CPU host pool (Llama-3-8B's K/V geometry by
default: 32 layers x 8 kv heads x 128 dims x K and V in bf16, 64-token pages = 8 MiB a page), in
batches of SGLang's ``STORAGE_BATCH_SIZE`` (128). Needs SGLang (``make .venv-sglang/.installed``)::

    .venv-sglang/bin/python tools/sglang_hicache_bench.py --dir /nvme/bench --pages 128

For each backend, in a fresh directory: **set** GB/s (every page backed up; stratastore's are
fsynced, the ``file`` backend's are not; a ``sync`` after, untimed, so that their writeback is
not in the gets), **get hot** and **get cold** GB/s (every page
prefetched into other slots of the pool; cold: the files dropped from the page cache first with
``posix_fadvise(DONTNEED)``), the pages a **reopened** backend serves (a new backend object on
the same directory: what a restart finds; a restart in a fresh process is held by
tests/sglang), then **one flipped byte** in one stored page and the pages each backend reads and
the wrong pages among them, and **files per GiB** stored. One JSON line a backend, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strata_harness.bench_files import drop_cache, flip_one
from strata_harness.sglang_hicache import backend, backup, hashes, prefetch
from strata_harness.sglang_host_pool import CpuHostPool

BATCH = 128  #: SGLang's STORAGE_BATCH_SIZE


def _get(b: Any, pool: CpuHostPool, keys: list[str], n: int) -> tuple[float, int, int]:
    """Prefetch ``keys`` into the pool's pages ``n..2n-1`` (zeroed first): seconds, pages
    read, pages among them that differ from the pages ``0..n-1`` they were written from."""
    for i in range(n):
        pool.get_data_page((n + i) * pool.page_size).zero_()
    start = time.perf_counter()
    read = 0
    for i in range(0, len(keys), BATCH):
        got = prefetch(b, pool, keys[i : i + BATCH], n + i)
        read += got
        if got < len(keys[i : i + BATCH]):
            break
    seconds = time.perf_counter() - start
    wrong = sum(
        not pool.get_data_page((n + i) * pool.page_size).equal(
            pool.get_data_page(i * pool.page_size)
        )
        for i in range(read)
    )
    return seconds, read, wrong


def run_one(kind: str, root: Path, model: str, args: argparse.Namespace) -> dict[str, Any]:
    n = args.pages
    pool = CpuHostPool(
        layout="page_first",
        size=2 * n * args.page_tokens,
        page_size=args.page_tokens,
        layer_num=args.layers,
        head_num=args.kv_heads,
        head_dim=args.head_dim,
        dtype=torch.bfloat16,
    )
    for i in range(n):
        pool.fill(i * args.page_tokens, i)
    page_bytes = pool.get_size_per_token() * args.page_tokens
    gb = n * page_bytes / 1e9
    keys = hashes(list(range(3, 3 + n * args.page_tokens)), args.page_tokens)
    where: Any = [{"spec": str(root), "budget_bytes": 4 * n * page_bytes}]
    if kind == "file":
        where = root
    b = backend(kind, where, pool, model)
    try:
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            assert backup(b, pool, keys[i : i + BATCH], i)
        set_s = time.perf_counter() - start
        os.sync()  # the file backend's writes are not fsynced: their writeback not in the gets
        hot_s, hot_n, hot_wrong = _get(b, pool, keys, n)
        drop_cache(root)
        cold_s, cold_n, cold_wrong = _get(b, pool, keys, n)
    finally:
        if hasattr(b, "close"):
            b.close()
    b = backend(kind, where, pool, model)  # reopened: what a restart finds
    try:
        _, reopen_n, _ = _get(b, pool, keys, n)
        flip_one(root, page_bytes)
        _, flip_n, flip_wrong = _get(b, pool, keys, n)
    finally:
        if hasattr(b, "close"):
            b.close()
    files = sum(1 for p in root.rglob("*") if p.is_file())
    return {
        "backend": kind,
        "pages": n,
        "page_bytes": page_bytes,
        "set_gbps": round(gb / set_s, 3),
        "get_hot_gbps": round(gb * hot_n / n / hot_s, 3),
        "get_cold_gbps": round(gb * cold_n / n / cold_s, 3),
        "wrong_pages_hot_cold": hot_wrong + cold_wrong,
        "served_after_reopen": reopen_n,
        "served_after_flip": flip_n,
        "wrong_pages_after_flip": flip_wrong,
        "files_per_gib": round(files / (n * page_bytes / 2**30), 1),
        "read_threads": (args.read_threads or "default") if kind == "strata" else "-",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", required=True, help="a scratch directory on the disk to measure")
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--read-threads",
        type=int,
        default=None,
        help="stratastore's reader threads a batch (default: the backend's READ_THREADS, 4)",
    )
    args = ap.parse_args()
    if args.read_threads:
        import stratastore.adapters.sglang.backend as strata_backend

        strata_backend.READ_THREADS = args.read_threads
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    model = base / "weights.bin"
    model.write_bytes(b"bench weights")
    rows = []
    for kind in ("strata", "file"):
        root = base / f"hicache-{kind}-{uuid.uuid4().hex[:8]}"
        root.mkdir(parents=True)
        try:
            row = run_one(kind, root, str(model), args)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
    cols = ["set_gbps", "get_hot_gbps", "get_cold_gbps", "served_after_reopen",
            "served_after_flip", "wrong_pages_after_flip", "files_per_gib"]  # fmt: skip
    print("| backend | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for row in rows:
        print(f"| {row['backend']} | " + " | ".join(str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
