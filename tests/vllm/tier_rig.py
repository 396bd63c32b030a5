"""vLLM 0.32's own offload tiering, driven as its scheduler drives it, on this CPU: the
``TieringOffloadingSpec`` builds a ``TieringOffloadingManager`` with its
``CPUPrimaryTierOffloadingManager`` on a ``SharedOffloadRegion`` (an mmap in /dev/shm) and the
secondary tiers of the ``secondary_tiers`` entries, exactly as ``OffloadingConnector`` does
(``get_manager()`` has no platform check; only its GPU worker refuses this CPU). The GPU
worker's copies are copies into the region's worker view (``SharedOffloadRegion(rank=0)``),
and the keys are vLLM's: block hashes chained by ``hash_block_tokens`` (sha256) packed by
``make_offload_key``.

Also runnable as a script (a fresh process: a restart, a kill -9)::

    python -m tests.vllm.tier_rig store TIER_JSON FIRST COUNT  # store; print "acked R" each
    python -m tests.vllm.tier_rig serve TIER_JSON FIRST COUNT  # print "served N" (right bytes)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import time
import uuid
from typing import Any

import numpy as np
import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

BLOCK_TOKENS = 16
#: the tier's entry as a user writes it, without its levels
STRATA_TIER = {"type": "StrataTier", "module_path": "stratastore.adapters.vllm.tier"}
DEADLINE_S = 120.0  #: how long a transfer may take before the rig calls it hung

init_none_hash(sha256)


def chunk_bytes(key: bytes, n: int) -> np.ndarray:
    """The K/V the "GPU" writes for the chunk of ``key``: ``n`` bytes derived from the key."""
    seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def request_keys(request: int, chunks: int) -> list[OffloadKey]:
    """vLLM's offload keys of a prompt of ``chunks`` blocks (one block a chunk), its tokens
    drawn from ``request``."""
    rng = np.random.default_rng(request)
    parent = None
    keys = []
    for _ in range(chunks):
        tokens = tuple(int(t) for t in rng.integers(0, 32000, BLOCK_TOKENS))
        parent = hash_block_tokens(sha256, parent, tokens)
        keys.append(make_offload_key(bytes(parent), 0))
    return keys


class Rig:
    """One scheduler's offload manager with ``tiers`` as its secondary tiers."""

    def __init__(
        self,
        tiers: list[dict[str, Any]],
        *,
        primary_chunks: int = 8,
        block_bytes: int = 4096,
        layers: int = 2,
        events: bool = False,
    ) -> None:
        self.engine_id = f"strata-tier-test-{uuid.uuid4().hex[:12]}"
        config = OffloadingConfig(
            groups=(
                OffloadingGroupConfig(
                    tokens_per_block=BLOCK_TOKENS,
                    layer_names=tuple(f"layers.{i}" for i in range(layers)),
                    group_id=0,
                ),
            ),
            worker_kv_bytes_per_block=block_bytes,
            enable_kv_cache_events=events,
            extra_config={
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": primary_chunks * block_bytes,
                "secondary_tiers": [dict(t) for t in tiers],
            },
            engine_id=self.engine_id,
            model=OffloadingModelConfig(name="strata-tier-test-model", dtype="bfloat16"),
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
        self.spec = OffloadingSpecFactory.create_spec(config)
        self.manager = self.spec.get_manager()
        self.tiers = self.manager.secondary_tiers
        self.row_bytes = self.spec.kv_bytes_per_chunk
        # the GPU worker's side of the region: what its DMA copies write and read
        self.worker_region = SharedOffloadRegion(
            engine_id=self.engine_id,
            num_chunks=self.spec.num_chunks,
            rank=0,
            kv_bytes_per_chunk=self.spec.kv_bytes_per_chunk,
            cpu_page_size=self.spec.cpu_page_size_per_worker,
        )
        self.worker_view = self.worker_region.create_next_worker_view(
            self.spec.cpu_page_size_per_worker
        )
        self._n = 0
        self.closed = False

    # -- one scheduler step -----------------------------------------------------------------
    def step(self) -> None:
        self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def settle(self) -> None:
        """Step until no transfer is in flight (bounded by :data:`DEADLINE_S`)."""
        deadline = time.monotonic() + DEADLINE_S
        while self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise TimeoutError("the offload manager's transfers did not finish")
            self.step()
            time.sleep(0.001)
        self.step()

    def _ctx(self) -> ReqContext:
        self._n += 1
        ctx = ReqContext(req_id=f"req-{self._n}")
        self.manager.on_new_request(ctx)
        return ctx

    # -- what the scheduler and the GPU worker do -------------------------------------------
    def store(self, keys: list[OffloadKey], *, settle: bool = True) -> int:
        """A request whose K/V the GPU computed: primary slots prepared, written by the worker,
        completed (the cascade into every secondary tier starts), the request finished.
        Returns how many chunks went into the primary tier."""
        ctx = self._ctx()
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None, "the primary tier refused the store"
        for key, cid in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
            data = chunk_bytes(key, self.spec.cpu_page_size_per_worker)
            self.worker_view[int(cid)].copy_(torch.from_numpy(data.view(np.int8)))
        self.manager.complete_store(out.keys_to_store, ctx)
        self.manager.on_request_finished(ctx)
        if settle:
            self.settle()
        return len(out.keys_to_store)

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> LookupResult:
        """The scheduler's lookup of one chunk, stepping while it is RETRY / HIT_PENDING."""
        deadline = time.monotonic() + DEADLINE_S
        while True:
            r = self.manager.lookup(key, ctx)
            if r in (LookupResult.HIT, LookupResult.MISS):
                return r
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup stuck at {r}")
            self.step()
            time.sleep(0.001)

    def serve(self, keys: list[OffloadKey]) -> list[bytes]:
        """A new request with this prompt: its chunks looked up in order until the first miss
        (promoted from a secondary tier where the primary lost them), then loaded "to the
        GPU": the bytes of each chunk served, in order."""
        ctx = self._ctx()
        hits = []
        for key in keys:
            if self.lookup(key, ctx) is not LookupResult.HIT:
                break
            hits.append(key)
        rows = []
        if hits:
            spec = self.manager.prepare_load(hits, ctx)
            rows = [self.worker_view[int(c)].numpy().tobytes() for c in spec.chunk_ids]
            self.manager.complete_load(hits, ctx)
        self.manager.on_request_finished(ctx)
        self.settle()
        return rows

    def served_right(self, keys: list[OffloadKey]) -> int:
        """How many chunks :meth:`serve` served, checking each is the bytes stored (an
        AssertionError on any wrong byte)."""
        rows = self.serve(keys)
        for key, row in zip(keys, rows, strict=False):
            want = chunk_bytes(key, self.spec.cpu_page_size_per_worker).tobytes()
            assert row == want, "a chunk was served with wrong bytes"
        return len(rows)

    def evict_primary(self) -> None:
        """Fill the primary tier with other requests' chunks so it lets go of everything."""
        for r in range(2):
            self.store(request_keys(10_000 + self._n * 7 + r, self.spec.num_chunks))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.settle()
        self.worker_view = None
        self.worker_region.cleanup()
        self.manager.shutdown()


def tier_entry(**settings: Any) -> dict[str, Any]:
    """The tier's ``secondary_tiers`` entry with ``settings`` (``levels`` and the rest)."""
    return {**STRATA_TIER, **settings}


def leftover_regions(engine_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/vllm_offload_{engine_id}*")


def _main(argv: list[str]) -> int:
    what, tier, first, count = argv[0], json.loads(argv[1]), int(argv[2]), int(argv[3])
    rig = Rig([tier])
    print(f"engine {rig.engine_id}", flush=True)
    if what == "store":
        for r in range(first, first + count):
            keys = request_keys(r, 4)
            rig.store(keys)
            print(f"acked {r}", flush=True)  # the cascade finished: acknowledged, durable
    else:
        served = sum(rig.served_right(request_keys(r, 4)) for r in range(first, first + count))
        print(f"served {served}", flush=True)
    rig.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(_main(sys.argv[1:]))
