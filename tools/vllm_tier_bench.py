"""stratastore's vLLM offload tier (``StrataTier``) side by side with vLLM's own ``fs`` tier,
through the same harness: vLLM 0.32's ``TieringOffloadingManager`` and its CPU primary tier on a
``SharedOffloadRegion``, driven as its scheduler drives it, the same chunks for both (Llama-3-8B's
K/V geometry by default: 32 layers x 8 kv heads x 128 dims x K and V in bf16, one 16-token block a
chunk = 2 MiB). Needs vLLM (``make .venv-vllm/.installed``)::

    .venv-vllm/bin/python tools/vllm_tier_bench.py --dir /nvme/bench --chunks 576

For each tier, in a fresh directory: **store** GB/s (the cascade of every chunk from primary
slots, submit to the last job's completion; stratastore's are fsynced, the fs tier's are not),
**load hot** and **load cold** GB/s (the primary tier emptied with ``reset_cache``, every chunk
looked up and promoted back; cold: the files dropped from the page cache first with
``posix_fadvise(DONTNEED)``; vLLM's fs tier writes and reads with ``O_DIRECT`` where the
filesystem allows it, so its hot and cold loads both read the disk; stratastore reads from the
page cache what is there and past it what is not), then **one flipped byte** in one stored
chunk and the wrong bytes each tier delivers into primary slots, and **files per GiB** stored.
One JSON line a tier, then a table. Restart and kill -9 behaviour are held by
tests/vllm/test_offload_tier.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from strata_harness.bench_files import drop_cache, flip_one

BLOCK_TOKENS = 16


def _manager(tier: dict[str, Any], chunks: int, block_bytes: int, layers: int) -> Any:
    config = OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                tokens_per_block=BLOCK_TOKENS,
                layer_names=tuple(f"layers.{i}" for i in range(layers)),
                group_id=0,
            ),
        ),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": chunks * block_bytes,
            "secondary_tiers": [tier],
        },
        engine_id=f"strata-tier-bench-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name="meta-llama/Meta-Llama-3-8B", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=BLOCK_TOKENS, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )
    return OffloadingSpecFactory.create_spec(config).get_manager()


def _keys(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    parent = None
    out = []
    for _ in range(n):
        parent = hash_block_tokens(
            sha256, parent, tuple(int(t) for t in rng.integers(0, 32000, 16))
        )
        out.append(make_offload_key(bytes(parent), 0))
    return out


def _data(key: bytes, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _settle(m: Any) -> None:
    while m.has_pending_work():
        m.on_schedule_end(ScheduleEndContext((), ()))
        time.sleep(0.0005)
    m.on_schedule_end(ScheduleEndContext((), ()))


def _rows(m: Any) -> np.ndarray:
    view = m.primary_tier.get_kv_memoryview()
    return np.frombuffer(view, dtype=np.uint8).reshape(view.shape[0], view.strides[0])


def _store(m: Any, keys: list[bytes], row: int) -> float:
    ctx = ReqContext(req_id="store")
    m.on_new_request(ctx)
    out = m.prepare_store(keys, ctx)
    rows = _rows(m)
    for k, cid in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
        rows[int(cid), :row] = _data(k, row)  # the GPU worker's copy
    t0 = time.perf_counter()
    m.complete_store(out.keys_to_store, ctx)
    m.on_request_finished(ctx)
    _settle(m)
    return time.perf_counter() - t0


def _load(m: Any, keys: list[bytes], row: int, name: str) -> tuple[float, int, int]:
    """Every chunk promoted from the tier: (seconds, chunks served, wrong bytes served)."""
    m.reset_cache()  # the primary tier lets go of everything
    ctx = ReqContext(req_id=name)
    m.on_new_request(ctx)
    t0 = time.perf_counter()
    pending = list(keys)
    while pending:  # lookups until each is HIT or MISS (promotions batched per step)
        still = []
        for k in pending:
            r = m.lookup(k, ctx)
            if r in (LookupResult.RETRY, LookupResult.HIT_PENDING):
                still.append(k)
        pending = still
        m.on_schedule_end(ScheduleEndContext((), ()))
        if pending:
            time.sleep(0.0005)
    seconds = time.perf_counter() - t0
    served = [k for k in keys if m.primary_tier.lookup(k, ctx) is LookupResult.HIT]
    wrong = 0
    if served:
        spec = m.prepare_load(served, ctx)
        rows = _rows(m)
        for k, cid in zip(served, spec.chunk_ids, strict=True):
            wrong += int(np.count_nonzero(rows[int(cid), :row] != _data(k, row)))
        m.complete_load(served, ctx)
    m.on_request_finished(ctx)
    _settle(m)
    return seconds, len(served), wrong


def run_one(
    name: str, tier: dict[str, Any], root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    block = args.layers * 2 * args.kv_heads * args.head_dim * 2 * BLOCK_TOKENS
    m = _manager(tier, args.chunks, block, args.layers)
    keys = _keys(args.chunks)
    gb = args.chunks * block / 1e9
    try:
        store_s = _store(m, keys, block)
        hot_s, hot_n, _ = _load(m, keys, block, "hot")
        drop_cache(root)
        cold_s, cold_n, _ = _load(m, keys, block, "cold")
        flip_one(root, block)
        _, flip_n, wrong = _load(m, keys, block, "flipped")
    finally:
        m.shutdown()
    files = sum(1 for p in root.rglob("*") if p.is_file())
    return {
        "tier": name,
        "chunks": args.chunks,
        "chunk_bytes": block,
        "store_gbps": round(gb / store_s, 3),
        "load_hot_gbps": round(gb * hot_n / args.chunks / hot_s, 3),
        "load_cold_gbps": round(gb * cold_n / args.chunks / cold_s, 3),
        "served_hot": hot_n,
        "served_cold": cold_n,
        "served_after_flip": flip_n,
        "wrong_bytes_after_flip": wrong,
        "files_per_gib": round(files / (args.chunks * block / 2**30), 1),
        "threads": args.threads or "defaults",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", required=True, help="a scratch directory on the disk to measure")
    ap.add_argument("--chunks", type=int, default=576)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="I/O threads each way, both tiers (default: each tier's own defaults: stratastore's "
        "store_threads 4 / load_threads 16, vLLM fs's n_write_threads / n_read_threads 16)",
    )
    args = ap.parse_args()
    init_none_hash(sha256)
    base = Path(args.dir)
    rows = []
    for name in ("strata", "fs"):
        root = base / f"tier-{name}-{uuid.uuid4().hex[:8]}"
        root.mkdir(parents=True)
        if name == "strata":
            tier = {
                "type": "StrataTier",
                "module_path": "stratastore.adapters.vllm.tier",
                "levels": [{"spec": str(root), "budget_bytes": 4 * args.chunks * (4 << 20)}],
                "max_pending_stores": 2 * args.chunks,
            }
            if args.threads:
                tier.update(store_threads=args.threads, load_threads=args.threads)
        else:
            tier = {"type": "fs", "root_dir": str(root)}
            if args.threads:
                tier.update(n_read_threads=args.threads, n_write_threads=args.threads)
        try:
            row = run_one(name, tier, root, args)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(row), flush=True)
        rows.append(row)
    cols = ["store_gbps", "load_hot_gbps", "load_cold_gbps", "served_after_flip",
            "wrong_bytes_after_flip", "files_per_gib"]  # fmt: skip
    print("| tier | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for row in rows:
        print(f"| {row['tier']} | " + " | ".join(str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
