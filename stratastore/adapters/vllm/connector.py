"""``StrataConnector``: vLLM's KV connector (``KVConnectorBase_V1``) on a stratastore Store.

vLLM makes one connector on its scheduler and one on each worker (often in two processes);
each opens the Store of the same settings (a store is shared by processes, spec F-CAT), once
per process. The scheduler side decides, the worker side moves the bytes. The store's page
(16 tokens by default, :func:`.plan.page_tokens`) is the unit of both, whatever vLLM's block:

* a new request: :meth:`get_num_new_matched_tokens` looks its prompt up in the store and
  promises the stored prefix, in whole pages, never the whole prompt (:func:`.plan.loadable`);
  :meth:`update_state_after_alloc` and :meth:`build_connector_meta` tell the worker which
  blocks to fill; the worker's :meth:`start_load_kv` starts the restore into vLLM's blocks on
  the connector's own thread (:class:`.loader.Loader`), and the first attention layer of the
  forward waits for it (:meth:`wait_for_layer_load`); vLLM's CPU layout, or the paged layouts
  of the GPU backends on the host or on a CUDA device (:class:`.pool.Pool`), every page
  validated in the memory it is delivered from (on a device, by the BLAKE3 kernel there), the
  last block possibly in part. A restore that stops short (a damaged page, a segment gone) reports
  the blocks it did not fill (:meth:`get_block_ids_with_load_errors`): vLLM recomputes them,
  so the tokens are a recompute's. The connector asks vLLM for that
  (``kv_load_failure_policy = "recompute"``): a store's damage is never a failed request.
* a request whose prompt vLLM has just computed, at least half of it here (not restored):
  the step's metadata names its whole pages (:meth:`build_connector_meta`), and the worker's
  :meth:`wait_for_save` copies them out of the blocks after the forward (the request still
  runs: its blocks are not held; :meth:`.pool.Pool.copy`) and hands them to the saver thread
  (:class:`.saver.Saver`), which parks them; the Store's spill writer writes them. A stop
  loses at most what was in flight, never a computed prompt's K/V that had time to land.
* a finished request: :meth:`request_finished` keeps its blocks (vLLM frees them when the
  worker says so) and parks every whole page vLLM computed, the reply's included, under the
  same conversation (the prompt's segments are shared, not rewritten); the saver parks them
  straight out of the held blocks (``Store.park`` with the blocks as its source: the store's
  streamed park) and gives the blocks back once the park is durable
  (:meth:`get_finished`). :meth:`shutdown` waits for the parks handed over, and the Store's
  close for their writes.

What the connector did is in vLLM's own metrics (:mod:`.metrics`: ``/metrics`` of ``vllm
serve``), and in one line at shutdown. Nothing here is vLLM policy: what is kept, where, for
how long and how it degrades is the Store's (its levels, budgets, floors and the remote
level), configured through ``kv_connector_extra_config`` (:func:`.plan.store_config`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from stratastore.adapters.vllm.cpu_layout import measure
from stratastore.adapters.vllm.loader import Loader
from stratastore.adapters.vllm.metrics import StrataPromMetrics, StrataStats
from stratastore.adapters.vllm.plan import (
    LoadJob,
    SaveJob,
    conversation_id,
    keyable,
    load_unit,
    loadable,
    page_tokens,
    save_cuts,
    saved_tokens,
)
from stratastore.adapters.vllm.plugin import OWN_RESERVATION_ENV, RESERVED_CPU_ENV, register
from stratastore.adapters.vllm.pool import Pool
from stratastore.adapters.vllm.saver import Saver
from stratastore.adapters.vllm.stores import cpu_isa, engine_fingerprint, open_store, release_store
from stratastore.adapters.vllm.tally import COUNTS, Tally
from stratastore.errors import ConfigError, StrataError
from stratastore.io.system import env_default, env_var

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["StrataConnector", "StrataMetadata"]

log = logging.getLogger("stratastore.vllm")


def _keep_vllms_threads() -> None:
    """Keep vLLM's CPU threads what they are without a connector. vLLM on the CPU reserves one
    more core per worker when any KV connector is configured (for a transfer thread:
    ``vllm/utils/ompmultiprocessing.py``), so its workers would compute with other OMP thread
    counts, and so other bits of K/V and logits, than vLLM alone: greedy tokens could differ.
    This connector needs no core of its own (its load and park threads run on whichever of the
    process's cores is free while the forward waits: :mod:`.loader`), so unless the user set
    ``VLLM_CPU_NUM_OF_RESERVED_CPU``, it is set to vLLM's own reservation without a connector
    (one core), and vLLM's warning about it is left out of its log (:mod:`.plugin`, which
    vLLM's processes load as a general plugin before they log it). vLLM imports this module
    while it checks its config, before it starts the engine and its workers, which inherit
    the setting. A user who wants vLLM's reservation for a connector (on 2 cores: none, so the
    worker computes on both, with other bits than vLLM alone) sets the variable
    (docs/engine.md)."""
    if env_var(RESERVED_CPU_ENV) is None:
        env_default(RESERVED_CPU_ENV, "1")
        env_default(OWN_RESERVATION_ENV, "1")
    register()


_keep_vllms_threads()


@dataclass
class StrataMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the worker: the requests to load before the forward, the pages to
    park after it."""

    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)


@dataclass
class _Running:
    """A request the scheduler follows until its prompt is parked: its prompt, its blocks so
    far, where it resumed (vLLM's cache and the store's load) and how much is computed."""

    prompt: npt.NDArray[np.uint32]
    conv_id: str
    blocks: list[int]
    resumed: int
    computed: int = 0
    prefilled: bool = False  #: its prompt is computed (and parked, when worth it)
    parked: int = 0  #: tokens of it parked already (its prompt's whole pages)


#: the store's sources (``Store.lookup``) as vLLM's cache tiers
_TIERS = {
    "ram": CacheHitSource.HOST,
    "pending": CacheHitSource.HOST,
    "disk": CacheHitSource.DISK,
    "prompt_cache": CacheHitSource.DISK,
    "remote": CacheHitSource.EXTERNAL_UNSPECIFIED,
}


class StrataConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """See the module. Loaded by vLLM from ``kv_connector="StrataConnector"`` and
    ``kv_connector_module_path="stratastore.adapters.vllm"``."""

    _cache_hit_source = CacheHitSource.DISK

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        pc = vllm_config.parallel_config
        if pc.tensor_parallel_size * pc.pipeline_parallel_size > 1:
            raise ConfigError(
                f"StrataConnector: tensor-parallel size {pc.tensor_parallel_size} x "
                f"pipeline-parallel size {pc.pipeline_parallel_size}: each rank keeps its "
                "own heads or layers, and the store's keys do not name the rank yet; run "
                "the connector with one worker (tensor and pipeline parallel size 1)"
            )
        self.block_size = int(vllm_config.cache_config.block_size)
        self.page = page_tokens(extra, self.block_size)
        self.load_unit = load_unit(extra, self.block_size, self.page)
        self.fp = engine_fingerprint(vllm_config, self.page)
        self.tally = Tally()
        # a block the store cannot deliver valid is recomputed, never a failed request
        self._kv_transfer_config.kv_load_failure_policy = "recompute"
        side = "worker" if role == KVConnectorRole.WORKER else "scheduler"
        self.store, key = open_store(vllm_config, self.fp, side)
        self._store_key: tuple[str, bytes] | None = key
        # scheduler side
        #: request -> (tokens it loads up to, the store's source, vLLM's own computed tokens)
        self._promised: dict[str, tuple[int, str, int]] = {}
        self._looked_up: set[str] = set()  #: requests counted in ``lookups`` already
        self._loads: dict[str, LoadJob] = {}
        self._saves: list[SaveJob] = []
        self._running: dict[str, _Running] = {}
        # worker side
        self.pool: Pool | None = None
        self._loader: Loader | None = None
        self._saver: Saver | None = None

    # -- scheduler side -------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """The tokens past vLLM's own ``num_computed_tokens`` this request loads from the
        store (:func:`.plan.loadable`: whole pages, perhaps part of a block), loaded before its
        first forward (not async)."""
        if not keyable(request):  # its K/V is not a function of its token ids alone
            return 0, False
        prompt = np.asarray(request.prompt_token_ids, dtype=np.uint32)
        if len(prompt) < 2:
            return 0, False
        if request.request_id not in self._looked_up:  # vLLM asks again while it waits
            self._looked_up.add(request.request_id)
            self.tally.add(lookups=1)
        try:
            hit = self.store.lookup(prompt[: len(prompt) - 1])
        except StrataError as e:  # the store cannot answer: vLLM computes, as without it
            log.warning("stratastore: lookup of request %s: %s", request.request_id, e)
            return 0, False
        upto = loadable(hit[1] if hit else 0, len(prompt), self.load_unit)
        if hit is None or upto <= num_computed_tokens:
            self._promised.pop(request.request_id, None)
            return 0, False
        if request.request_id not in self._promised:
            self.tally.add(lookup_hits=1)
        self._promised[request.request_id] = (upto, hit[0], num_computed_tokens)
        return upto - num_computed_tokens, False

    def get_external_cache_hit_sources(
        self, request: Any, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        """The promised tokens by the store's level they come from (vLLM's cache tiers)."""
        if num_external_tokens <= 0:
            return {}
        _, source, _ = self._promised.get(request.request_id, (0, "disk", 0))
        return {_TIERS.get(source, CacheHitSource.EXTERNAL_UNSPECIFIED): num_external_tokens}

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        _, _, local = self._promised.get(request.request_id, (0, "", 0))
        upto = local + num_external_tokens  # what vLLM accepted of the promise
        block_ids = blocks.get_block_ids()[0]
        prompt = np.asarray(request.prompt_token_ids, dtype=np.uint32)
        self._loads[request.request_id] = LoadJob(
            request.request_id,
            prompt[:upto],
            tuple(block_ids[: -(-upto // self.block_size)]),
            local,
        )

    def build_connector_meta(self, scheduler_output: Any) -> StrataMetadata:
        """The loads promised since the last step, the finished requests' parks, and the
        prompts this step computes to the end (:meth:`_follow`)."""
        meta = StrataMetadata(list(self._loads.values()), self._saves)
        self._loads, self._saves = {}, []
        meta.saves.extend(self._follow(scheduler_output))
        return meta

    def _follow(self, so: Any) -> list[SaveJob]:
        """Follow each scheduled request's blocks and computed tokens; a prompt whose last
        token this step computes parks its whole pages past where it resumed."""
        scheduled: dict[str, int] = so.num_scheduled_tokens
        for new in so.scheduled_new_reqs:
            if not keyable(new):
                continue
            prompt = np.asarray(new.prompt_token_ids, dtype=np.uint32)
            promised = self._promised.get(new.req_id, (0, "", 0))[0]
            resumed = max(promised, new.num_computed_tokens)
            self._running[new.req_id] = _Running(
                prompt,
                conversation_id(prompt, new.req_id),
                list(new.block_ids[0]),
                resumed,
                computed=new.num_computed_tokens,
            )
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            run = self._running.get(req_id)
            if run is None:
                continue
            added = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids and added is not None:
                run.blocks = list(added[0])  # preempted and resumed: its blocks anew
            elif added is not None:
                run.blocks.extend(added[0])
            run.computed = cached.num_computed_tokens[i]
        saves = []
        for req_id, run in self._running.items():
            if run.prefilled or req_id not in scheduled:
                continue
            if run.computed + scheduled[req_id] < len(run.prompt):
                continue  # its prefill goes on in a later step
            run.prefilled = True
            n = saved_tokens(len(run.prompt), len(run.blocks) * self.block_size, self.page)
            # copied in the step: worth it for a prompt mostly computed here (its recompute is
            # what a stop would cost), not for one mostly restored (its finish parks the rest)
            if 2 * (n - run.resumed) >= n > run.resumed:
                run.parked = n
                saves.append(
                    SaveJob(
                        req_id,
                        run.conv_id,
                        run.prompt[:n],
                        tuple(run.blocks[: -(-n // self.block_size)]),
                        save_cuts(n, self.page, run.resumed),
                        held=False,
                    )
                )
        return saves

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Park the finished request: every whole page whose K/V vLLM computed, past what its
        prompt's park holds. Its blocks stay vLLM's to free once the worker has copied them
        (True: vLLM waits for :meth:`get_finished`)."""
        loaded, _, _ = self._promised.pop(request.request_id, (0, "", 0))
        self._looked_up.discard(request.request_id)
        run = self._running.pop(request.request_id, None)
        if not keyable(request):
            return False, None
        tokens = np.asarray(request.all_token_ids, dtype=np.uint32)
        computed = min(int(request.num_computed_tokens), len(tokens))
        n = saved_tokens(computed, len(block_ids) * self.block_size, self.page)
        prompt = np.asarray(request.prompt_token_ids or (), dtype=np.uint32)
        resumed, parked = (run.resumed, run.parked) if run else (loaded, 0)
        if n <= max(resumed, parked):
            return False, None  # nothing new: the store holds it all already
        self._saves.append(
            SaveJob(
                request.request_id,
                run.conv_id if run else conversation_id(prompt, request.request_id),
                tokens[:n],
                tuple(block_ids[: -(-n // self.block_size)]),
                save_cuts(n, self.page, resumed, parked),
            )
        )
        return True, None

    # -- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """vLLM's pool, checked against the model (a typed error at start-up otherwise): the
        CPU backend's blocks, whose inner order is measured from vLLM's kernel
        (:func:`.cpu_layout.measure`), or the GPU backends' paged caches (FlashAttention's
        ``[2, blocks, ...]``, FlashInfer's ``[blocks, 2, ...]``) on the host or a CUDA
        device."""
        first = next(iter(kv_caches.values()), None)
        layout = None
        # vLLM's CPU layout (host blocks of 4 dimensions): the order inside them measured
        if first is not None and first.device.type == "cpu" and first.dim() == 4:
            isa = cpu_isa(self._vllm_config)
            if isa is None:
                raise ConfigError(
                    "StrataConnector: vLLM did not say which CPU attention kernel it runs, "
                    "so the order inside its blocks cannot be measured"
                )
            layout = measure(
                isa, self.fp.n_kv_heads, self.fp.head_dim, self.block_size, first.dtype
            )
        self.pool = Pool(self.fp, kv_caches, self.block_size, layout)
        self._loader = Loader(self.store, self.pool, self.tally, self.block_size)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start restoring each request of this step's metadata into its blocks, validated,
        on the loader's thread (:class:`.loader.Loader`); the forward waits for it at its
        first attention layer (:meth:`wait_for_layer_load`)."""
        meta = self._connector_metadata
        if not isinstance(meta, StrataMetadata) or not meta.loads:
            return
        self._need_pool()
        assert self._loader is not None
        self._loader.start(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Wait for this step's loads before ``layer_name`` reads its K/V: every layer's K/V is
        whole once the last page has landed (a stored page holds all layers, spec F-SEG-4),
        so the first layer waits for the loads and the others find them done."""
        if self._loader is not None:
            self._loader.wait()

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # pages are copied out after the forward (wait_for_save)

    def wait_for_save(self) -> None:
        """Hand this step's parks to the saver thread: a prompt's pages copied out of its
        blocks now (the request runs on; vLLM may reuse blocks after the step), a finished
        request's on the thread (vLLM holds its blocks until :meth:`get_finished`). The disk
        write runs on the Store's spill writer; nothing of it in the step."""
        meta = self._connector_metadata
        if not isinstance(meta, StrataMetadata) or not meta.saves:
            return
        pool = self._need_pool()
        if self._loader is not None:  # a save may take blocks this step loaded into
            self._loader.wait()
        if self._saver is None:
            self._saver = Saver(self.store, pool, self.tally)
        for job in meta.saves:
            if job.held:
                self._saver.submit(job)
                continue
            try:
                pages = pool.copy(job.block_ids, len(job.tokens))
            except StrataError as e:  # never a failed step: the prompt is parked at its end
                self.tally.drop("error")
                log.warning("stratastore: copying request %s's prompt: %s", job.req_id, e)
                continue
            self._saver.submit(job, pages)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """The finished requests whose park is durable or given up on: their blocks are
        vLLM's again."""
        done = self._saver.finished() if self._saver is not None else set()
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The blocks this step's loads did not fill (after they ended): vLLM recomputes
        them."""
        return self._loader.errors() if self._loader is not None else set()

    def get_kv_connector_stats(self) -> StrataStats | None:
        """What this side did since the last call, for vLLM's metrics (:mod:`.metrics`)."""
        data = self.tally.take()
        return StrataStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> StrataStats:
        return StrataStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> StrataPromMetrics:
        return StrataPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        """Release this side's hold on the Store; the last one closes it, waiting for every
        park in flight to be durable."""
        key, self._store_key = self._store_key, None
        if key is None:
            return
        if self._loader is not None:
            self._loader.close()
        if self._saver is not None:  # the parks handed over so far, then the thread ends
            self._saver.close()
        if self.role == KVConnectorRole.WORKER:
            t = self.tally.snapshot()
            log.warning(
                "stratastore: StrataConnector worker: %d loads, %d tokens loaded, %d "
                "short (%d blocks recomputed) in %.3f s; %d parks durable, %d tokens, "
                "%d not kept (%s)",
                t["loads"],
                t["tokens_loaded"],
                t["load_shortfalls"],
                t["blocks_recomputed"],
                t["load_seconds_sum"],
                t["parks"],
                t["tokens_parked"],
                sum(t["dropped"].values()),
                ", ".join(f"{n} {r}" for r, n in t["dropped"].items()),
            )
        release_store(key)

    def _need_pool(self) -> Pool:
        if self.pool is None:
            raise ConfigError(
                "StrataConnector: vLLM ran a step before registering its KV "
                "caches (register_kv_caches)"
            )
        return self.pool

    def stats(self) -> dict[str, Any]:
        """This side's totals (:data:`.tally.COUNTS`, bytes, parks not kept by reason, load
        and park seconds) and the Store's (``Store.stats()``)."""
        totals = self.tally.snapshot()
        return {
            "connector": {k: totals[k] for k in (*COUNTS, *sorted(set(totals) - set(COUNTS)))},
            "store": self.store.stats(),
        }
