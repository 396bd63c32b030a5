"""stratastore as a secondary tier of vLLM's ``OffloadingConnector`` (vLLM 0.32's
``TieringOffloadingSpec``, ``vllm/v1/kv_offload/tiering/``), on
:class:`~stratastore.chunks.ChunkStore`. Loaded by vLLM out of tree::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 68719476736,
        "secondary_tiers": [{"type": "StrataTier",
                             "module_path": "stratastore.adapters.vllm.tier",
                             "levels": [{"spec": "/nvme/strata-kv", "budget_gib": 500}]}]}}'

vLLM moves K/V between the GPU and its CPU primary tier; this tier only touches host memory:
a store reads primary slots, a load writes them (docs/engine.md, "vLLM: a tier of
``OffloadingConnector``"). What it guarantees:

- **Validated loads**: a chunk is read into its primary slot and BLAKE3-checked there before
  vLLM is told it loaded (spec F-SC-3); one that fails is left out of the job's
  ``successful_keys`` with the chunks after it, its slot zeroed, and vLLM recomputes them.
- **Durable stores**: a store job reported successful is on disk (spec F-DUR): a crash, a
  kill -9 or a power loss after it keeps every chunk of it.
- **The scheduler never waits**: lookups read an index (a level shared over the network is
  asked on a thread, the lookup saying RETRY meanwhile: vLLM's own ``AsyncLookupManager``), a
  key whose store is in flight is RETRY, transfers run on the tier's threads
  (:mod:`.tier_jobs`), and a full store queue drops the job (counted).
- **Keys and identity** (:mod:`.tier_identity`): vLLM's ``OffloadKey`` under the prefix-hash
  algorithm, on levels whose model fingerprint covers the weights, config, dtype, layout and
  chunk geometry; a hash setting that is not stable across processes is a
  :class:`~stratastore.errors.ConfigError` at start.
- **Levels** (:mod:`.tier_settings`): the chunk store's levels, budgets and cascade from the
  tier's entry or a TOML file it names.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.config import get_current_vllm_config_or_none
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.core.kv_cache_utils import DEFAULT_NONE_HASH_SEED, get_none_hash_seed
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from stratastore.adapters.vllm.tier_identity import (
    TierModel,
    hash_problem,
    offload_chunk_key,
    unstable_seed_problem,
)
from stratastore.adapters.vllm.tier_jobs import Finished, TierCounters, TierJobs
from stratastore.adapters.vllm.tier_settings import TierSettings
from stratastore.chunks import ChunkStore, stored_key
from stratastore.errors import ConfigError, StrataError
from stratastore.io.system import env_var
from stratastore.levels.backend import SharedBackend

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

__all__ = ["StrataTier", "TierMetrics"]

log = logging.getLogger("stratastore.adapters.vllm.tier")


class TierMetrics:
    """The tier's Prometheus metrics (vLLM's naming, ``vllm:kv_offload_strata_*``)."""

    LOADS = "vllm:kv_offload_strata_loaded_chunks"
    LOAD_BYTES = "vllm:kv_offload_strata_load_bytes"
    LOAD_TIME = "vllm:kv_offload_strata_load_time"
    LOAD_FAILURES = "vllm:kv_offload_strata_load_failures"
    VALIDATION_FAILURES = "vllm:kv_offload_strata_validation_failures"
    STORES = "vllm:kv_offload_strata_stored_chunks"
    STORE_BYTES = "vllm:kv_offload_strata_store_bytes"
    STORE_TIME = "vllm:kv_offload_strata_store_time"
    STORE_FAILURES = "vllm:kv_offload_strata_store_failures"
    STORES_DROPPED = "vllm:kv_offload_strata_stores_dropped"
    CHUNKS_DROPPED = "vllm:kv_offload_strata_chunks_dropped"
    LEVEL_HITS = "vllm:kv_offload_strata_level_hits"

    #: (name, documentation, label names)
    TABLE: ClassVar[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
        (LOADS, "Chunks loaded from the strata tier into the primary tier, validated.", ()),
        (LOAD_BYTES, "Bytes loaded from the strata tier into the primary tier.", ()),
        (LOAD_TIME, "Seconds of the strata tier's load jobs, submit to completion.", ()),
        (LOAD_FAILURES, "Chunks the strata tier did not load (missing, damaged, I/O).", ()),
        (VALIDATION_FAILURES, "Stored chunks that failed BLAKE3 validation (removed).", ()),
        (STORES, "Chunks written durably to the strata tier.", ()),
        (STORE_BYTES, "Bytes written durably to the strata tier.", ()),
        (STORE_TIME, "Seconds of the strata tier's store jobs, submit to completion.", ()),
        (STORE_FAILURES, "Chunks the strata tier could not store (refused, I/O).", ()),
        (STORES_DROPPED, "Store jobs dropped because the strata tier's queue was full.", ()),
        (CHUNKS_DROPPED, "Chunks of the store jobs dropped by backpressure.", ()),
        (LEVEL_HITS, "Chunks loaded from each level of the strata tier.", ("level",)),
    )


class _Lookups(AsyncLookupManager):  # type: ignore[misc]
    """vLLM's async lookup over the tier's levels (for a level shared over the network)."""

    def __init__(self, tier: StrataTier, tier_type: str) -> None:
        self._tier = tier
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[bytes], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.held(keys)


class StrataTier(SecondaryTierManager):  # type: ignore[misc]
    """A vLLM secondary tier on a :class:`~stratastore.chunks.ChunkStore` (the module docstring
    is the contract; the settings are :class:`~.tier_settings.TierSettings`)."""

    medium: ClassVar[Medium] = Medium.STORAGE

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return {
            name: OffloadingCounterMetadata(documentation=doc, labelnames=labels)
            for name, doc, labels in TierMetrics.TABLE
        }

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **settings: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.settings = TierSettings.from_kwargs(settings)
        self.locality = Locality(self.settings.locality) if self.settings.locality else None
        vcfg = get_current_vllm_config_or_none()
        self.hash_algo = _hash_algo(vcfg, self.settings.hash_algo)
        problem = hash_problem(self.hash_algo, env_var("PYTHONHASHSEED"))
        if problem is not None:
            raise problem
        self._seed_checked = False
        self._off = False
        self.model = _tier_model(offloading_spec, vcfg, self.block_size_bytes)
        self.store = ChunkStore.open(self.settings.chunks, self.model.fingerprint())
        try:
            self.jobs = TierJobs(
                self.store,
                primary_kv_view,
                self.chunk_key,
                store_threads=self.settings.store_threads,
                load_threads=self.settings.load_threads,
                max_pending=self.settings.max_pending_stores,
            )
        except BaseException:
            self.store.close()
            raise
        shared = any(isinstance(b, SharedBackend) and b.shared for b in self.store.backends)
        self._lookups = _Lookups(self, tier_type) if shared else None
        events_on = offloading_spec.kv_events_config.enable_kv_cache_events
        self.events: list[OffloadingEvent] | None = (
            [] if self.settings.enable_kv_events and events_on else None
        )
        self._stored_as: dict[bytes, bytes] = {}  #: stored key -> vLLM key (events only)
        #: stored keys the levels let go of (appended on the store threads)
        self._evicted: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        if self.events is not None:
            self.store.room.on_evicted = self._evicted.put
        self._damaged_seen = 0
        self._closed = False
        log.info(
            "stratastore vLLM tier: %d level(s) (%s), hash %s, chunks of %d bytes",
            len(self.store.levels),
            ", ".join(str(d["level"]) for d in self.store.describe()),
            self.hash_algo,
            self.block_size_bytes,
        )

    # -- keys ---------------------------------------------------------------------------------
    def chunk_key(self, key: bytes) -> bytes:
        """The chunk key of vLLM's ``OffloadKey`` (:func:`~.tier_identity.offload_chunk_key`)."""
        return offload_chunk_key(bytes(key), self.hash_algo)

    def held(self, keys: list[bytes]) -> list[bool]:
        """Whether each key is held on some level (a shared level asked once for all)."""
        ckeys = [self.chunk_key(k) for k in keys]
        held = [False] * len(ckeys)
        for lvl in self.store.levels:
            todo = [i for i, h in enumerate(held) if not h]
            if not todo:
                break
            backend = lvl.store
            skeys = [stored_key(ckeys[i]) for i in todo]
            if isinstance(backend, SharedBackend):
                got = backend.contains_many(skeys)
            else:
                got = [k in backend for k in skeys]
            for i, g in zip(todo, got, strict=True):
                held[i] = bool(g)
        return held

    def _usable(self) -> bool:
        """False once vLLM's block hashes turned out random per process (see
        :func:`~.tier_identity.unstable_seed_problem`): the tier then serves and stores
        nothing. Checked once, at the first call after vLLM seeded its hashes."""
        if not self._seed_checked:
            self._seed_checked = True
            seed = get_none_hash_seed()
            problem = unstable_seed_problem(seed, DEFAULT_NONE_HASH_SEED, env_var("PYTHONHASHSEED"))
            if problem is not None:
                log.error("%s", problem)
                self._off = True
        return not self._off

    # -- the scheduler's calls ----------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._closed or not self._usable():
            return LookupResult.MISS
        if self.jobs.storing(key):
            return LookupResult.RETRY
        if self._lookups is not None:
            found = self._lookups.lookup(key, req_context)
            if found is None:
                return LookupResult.RETRY
            return LookupResult.HIT if found else LookupResult.MISS
        return LookupResult.HIT if self.store.exists(self.chunk_key(key)) else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        if not self._usable():
            self.jobs.refuse(job_metadata.job_id, False, keys)
            return
        if self.events is not None:
            for k in keys:
                self._stored_as[stored_key(self.chunk_key(k))] = k
        self.jobs.store(job_metadata.job_id, keys, [int(c) for c in job_metadata.chunk_ids])

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = [bytes(k) for k in job_metadata.keys]
        self.jobs.load(job_metadata.job_id, keys, [int(c) for c in job_metadata.chunk_ids])

    def get_finished_jobs(self) -> Iterable[JobResult]:
        return [self._result(f) for f in self.jobs.finished()]

    def _result(self, done: Finished) -> JobResult:
        successful: tuple[bytes, ...] | None = None
        if done.is_load and not done.success:
            failed = done.keys[len(done.loaded) :]
            if self._lookups is not None:
                self._lookups.mark_miss(failed)
            successful = done.loaded or None
            if (
                self.events is not None
                and failed
                and not self.store.exists(self.chunk_key(failed[0]))
            ):
                self._event([failed[0]], removed=True)
        elif not done.is_load and done.success and self.events is not None:
            self._event(list(done.keys), removed=False)
        return JobResult(
            job_id=done.job_id,
            success=done.success,
            successful_keys=successful,
            transfer_time=done.seconds,
            transfer_bytes=done.nbytes or None,
        )

    def _event(self, keys: list[bytes], *, removed: bool) -> None:
        assert self.events is not None
        self.events.append(
            OffloadingEvent(
                keys=[OffloadKey(k) for k in keys],
                medium=self.medium,
                removed=removed,
                locality=self.locality,
            )
        )

    def has_pending_work(self) -> bool:
        return self.jobs.busy()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events is None:
            return ()
        gone = []
        while not self._evicted.empty():
            skey = self._evicted.get_nowait()
            if skey in self._stored_as:
                gone.append(self._stored_as.pop(skey))
        if gone:
            self._event(gone, removed=True)
        out, self.events = self.events, []
        return out

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Nothing to do: the levels let go of their oldest-written chunks first (vLLM 0.32's
        connector never calls ``touch``)."""
        return

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self._lookups is not None:
            self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        if self._lookups is not None:
            self._lookups.flush()

    def drain_jobs(self) -> None:
        self.jobs.drain()

    def shutdown(self) -> None:
        """Fail the transfers not started, wait for those in progress (at most
        ``shutdown_timeout_s``) and close the levels: every store acknowledged is durable.
        Raises :class:`~stratastore.errors.StrataError` when transfers are still running at
        the timeout (vLLM then keeps the primary tier's memory mapped, as they still use it)."""
        if self._closed:
            return
        self._closed = True
        if self._lookups is not None:
            self._lookups.shutdown()
        if not self.jobs.close(self.settings.shutdown_timeout_s):
            raise StrataError(
                "stratastore vLLM tier: transfers still running after "
                f"{self.settings.shutdown_timeout_s} s at shutdown; the levels are left open "
                "(raise shutdown_timeout_s if the disk is slow)"
            )
        self.store.close()

    def get_stats(self) -> OffloadingConnectorStats | None:
        c: TierCounters = self.jobs.take_counters()
        stats = OffloadingConnectorStats()
        damaged = self.store.counters.damaged
        pairs = (
            (TierMetrics.LOADS, c.loads),
            (TierMetrics.LOAD_BYTES, c.load_bytes),
            (TierMetrics.LOAD_TIME, c.load_seconds),
            (TierMetrics.LOAD_FAILURES, c.load_failures),
            (TierMetrics.VALIDATION_FAILURES, damaged - self._damaged_seen),
            (TierMetrics.STORES, c.stores),
            (TierMetrics.STORE_BYTES, c.store_bytes),
            (TierMetrics.STORE_TIME, c.store_seconds),
            (TierMetrics.STORE_FAILURES, c.store_failures),
            (TierMetrics.STORES_DROPPED, c.stores_dropped),
            (TierMetrics.CHUNKS_DROPPED, c.chunks_dropped),
        )
        self._damaged_seen = damaged
        for name, value in pairs:
            if value:
                stats.increase_counter(name, value)
        for level, n in c.hits_by_level.items():
            stats.increase_counter(TierMetrics.LEVEL_HITS, n, (str(level),))
        return None if stats.is_empty() else stats


def _hash_algo(vcfg: Any, setting: str | None) -> str:
    """vLLM's prefix-caching hash: its config's where the tier sees one (a different
    ``hash_algo`` setting is a :class:`ConfigError`), else the setting, else vLLM's default."""
    algo = getattr(getattr(vcfg, "cache_config", None), "prefix_caching_hash_algo", None)
    if algo is not None and setting is not None and algo != setting:
        raise ConfigError(
            f"StrataTier: hash_algo = {setting!r} but vLLM's prefix_caching_hash_algo is "
            f"{algo!r}; drop hash_algo from the tier's settings (vLLM's is used)"
        )
    return str(algo or setting or "sha256")


def _tier_model(spec: Any, vcfg: Any, row_bytes: int) -> TierModel:
    """What determines the chunks' bytes, from vLLM's ``OffloadingConfig`` (and its model
    config where the tier sees one)."""
    cfg = spec.config
    model_cfg = getattr(vcfg, "model_config", None)
    hf = getattr(model_cfg, "hf_config", None)
    par = cfg.parallel
    parallel = (
        "agnostic"
        if par.is_parallelism_agnostic
        else f"world={par.world_size},tp={par.tp_size},pp={par.pp_size},pcp={par.pcp_size},"
        f"dcp={par.dcp_size}"
    )
    return TierModel(
        model=str(getattr(model_cfg, "model", None) or cfg.model.name),
        revision=getattr(model_cfg, "revision", None),
        hf_config=hf.to_dict() if hf is not None else None,
        dtype=str(cfg.model.dtype),
        kv_cache_layout=str(cfg.kv_cache_layout),
        groups=tuple((g.tokens_per_block, len(g.layer_names)) for g in cfg.groups),
        tokens_per_hash=cfg.cache.tokens_per_hash,
        blocks_per_chunk=cfg.cache.blocks_per_chunk,
        worker_kv_bytes_per_block=cfg.worker_kv_bytes_per_block,
        row_bytes=row_bytes,
        parallel=parallel,
        canonical_layout=bool(cfg.canonical_layout),
        replicated_layout=bool(cfg.replicated_layout),
    )
