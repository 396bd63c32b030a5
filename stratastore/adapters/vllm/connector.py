"""``StrataConnector``: vLLM's KV connector (``KVConnectorBase_V1``) on a stratastore Store.

vLLM makes one connector on its scheduler and one on each worker (often in two processes);
each opens the Store of the same settings (a store is shared by processes, spec F-CAT), once
per process. The scheduler side decides, the worker side moves the bytes:

* a new request: :meth:`get_num_new_matched_tokens` looks its prompt up in the store and
  promises the stored prefix, in whole blocks, never the whole prompt (:func:`.plan.loadable`);
  :meth:`update_state_after_alloc` and :meth:`build_connector_meta` tell the worker which
  blocks to fill; the worker's :meth:`start_load_kv` restores into vLLM's blocks before the
  forward that reads them (:class:`.pool.Pool`: vLLM's CPU layout, or the paged layout through
  :class:`~stratastore.restore.PagedKV`), every page validated before it is delivered. A
  restore that stops short (a damaged page, a segment gone) reports the blocks it did not fill
  (:meth:`get_block_ids_with_load_errors`): vLLM recomputes them, so the tokens are a
  recompute's. The connector asks vLLM for that (``kv_load_failure_policy = "recompute"``): a
  store's damage is never a failed request.
* a finished request: :meth:`request_finished` keeps its blocks (vLLM frees them when the
  worker says so) and the next step's metadata carries them to the worker, whose
  :meth:`wait_for_save` hands them to a saver thread: it copies every computed whole block out
  of them and parks it, then hands the blocks back (:meth:`get_finished`); the disk write and
  its fsyncs run on the Store's spill writer. No step waits for a park. :meth:`shutdown`
  waits for the parks handed over, and the Store's close for their writes.

Nothing here is vLLM policy: what is kept, where, for how long and how it degrades is the
Store's (its levels, budgets, floors and the remote level), configured through
``kv_connector_extra_config`` (:func:`.plan.store_config`)."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from stratastore.adapters.vllm.plan import (
    LoadJob,
    SaveJob,
    fingerprint,
    loadable,
    save_cuts,
    saved_tokens,
    store_config,
)
from stratastore.adapters.vllm.pool import Pool
from stratastore.chain import Checkpoint, Conversation
from stratastore.errors import ConfigError, StrataError
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.io.system import env_default

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["StrataConnector", "StrataMetadata"]

log = logging.getLogger("stratastore.vllm")

#: vLLM's CPU setting of the cores it keeps from its workers' OMP threads
RESERVED_CPU_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def _keep_vllms_threads() -> None:
    """Keep vLLM's CPU threads what they are without a connector. vLLM on the CPU reserves one
    more core per worker when any KV connector is configured (for a transfer thread:
    ``vllm/utils/ompmultiprocessing.py``), so its workers would compute with other OMP thread
    counts, and so other bits of K/V and logits, than vLLM alone: greedy tokens could differ.
    This connector needs no core of its own (a load runs on the worker's thread before the
    forward, a park's write on the Store's writer), so unless the user set
    ``VLLM_CPU_NUM_OF_RESERVED_CPU``, it is set to vLLM's own reservation without a connector
    (one core). vLLM imports this module while it checks its config, before it starts the
    engine and its workers, which inherit it."""
    env_default(RESERVED_CPU_ENV, "1")


_keep_vllms_threads()

_STORES: dict[tuple[str, bytes], tuple[Store, int]] = {}  #: this process's open stores
_STORES_LOCK = threading.Lock()


def _open_store(vllm_config: VllmConfig, fp: ModelFingerprint) -> tuple[Store, tuple[str, bytes]]:
    """The Store of this engine's settings, opened once per process (both roles share it)."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    cfg, said = store_config(extra)
    key = (repr(cfg), fp.digest())
    with _STORES_LOCK:
        if key in _STORES:
            store, users = _STORES[key]
            _STORES[key] = (store, users + 1)
            return store, key
        store = Store.open(fp, cfg, warn=lambda msg: log.warning("stratastore: %s", msg))
        _STORES[key] = (store, 1)
        atexit.register(_close_all)
    log.warning("stratastore: StrataConnector on %s, for %s", said, fp.describe())
    return store, key


def _release_store(key: tuple[str, bytes]) -> None:
    with _STORES_LOCK:
        found = _STORES.pop(key, None)
        if found is None:
            return
        store, users = found
        if users > 1:
            _STORES[key] = (store, users - 1)
            return
    store.close()  # waits for the parks in flight: each durable once it returns


def _close_all() -> None:
    with _STORES_LOCK:
        stores = [s for s, _ in _STORES.values()]
        _STORES.clear()
    for store in stores:
        try:
            store.close()
        except StrataError as e:
            log.warning("stratastore: closing the store: %s", e)


def engine_fingerprint(vllm_config: VllmConfig) -> ModelFingerprint:
    """The fingerprint of the K/V this vLLM engine keeps (:func:`.plan.fingerprint`)."""
    mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    dtype = mc.dtype if cc.cache_dtype in ("auto", None) else cc.cache_dtype
    return fingerprint(
        str(mc.model),
        mc.revision,
        mc.hf_config.to_dict(),
        n_layers=mc.get_num_layers(pc),
        n_kv_heads=mc.get_num_kv_heads(pc),
        head_dim=mc.get_head_size(),
        block_size=cc.block_size,
        dtype=dtype,
        tp_size=pc.tensor_parallel_size,
        backend=_backend(mc.dtype, cc.block_size, mc.get_head_size(), cc.cache_dtype),
    )


def _backend(dtype: Any, block_size: int, head_size: int, cache_dtype: Any) -> str:
    """The platform, and on the CPU the attention ISA vLLM picks (it decides how a block's
    rows are kept: part of the K/V bytes' identity)."""
    from vllm.platforms import current_platform

    kind = str(current_platform.device_type)
    if kind != "cpu":
        return kind
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return f"cpu/{_get_attn_isa(dtype, block_size, head_size, str(cache_dtype))}"
    except (ImportError, NotImplementedError, AttributeError):
        return "cpu"


@dataclass
class StrataMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the worker: the requests to load before the forward, the finished
    requests to park."""

    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)


@dataclass
class Counters:
    """What this side of the connector did (:meth:`StrataConnector.stats`)."""

    lookups: int = 0
    hits: int = 0
    tokens_promised: int = 0
    loads: int = 0
    tokens_loaded: int = 0
    load_shortfalls: int = 0
    blocks_recomputed: int = 0
    saves: int = 0
    tokens_saved: int = 0
    save_errors: int = 0
    load_seconds: float = 0.0  #: in start_load_kv, the restores (the forward waits on them)
    save_seconds: float = 0.0  #: on the saver thread: the copies out of the blocks, the parks


class StrataConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """See the module. Loaded by vLLM from ``kv_connector="StrataConnector"`` and
    ``kv_connector_module_path="stratastore.adapters.vllm"``."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: Any = None
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.fp = engine_fingerprint(vllm_config)
        self.block_size = vllm_config.cache_config.block_size
        self.counters = Counters()
        # a block the store cannot deliver valid is recomputed, never a failed request
        self._kv_transfer_config.kv_load_failure_policy = "recompute"
        self.store, key = _open_store(vllm_config, self.fp)
        self._store_key: tuple[str, bytes] | None = key
        # scheduler side
        self._promised: dict[str, int] = {}  #: request -> tokens it loads from the store
        self._loads: dict[str, LoadJob] = {}
        self._saves: list[SaveJob] = []
        # worker side
        self.pool: Pool | None = None
        self._load_errors: set[int] = set()
        self._saves_done: set[str] = set()  #: parks whose blocks vLLM may free now
        self._saves_lock = threading.Lock()
        self._save_queue: queue.SimpleQueue[SaveJob | None] = queue.SimpleQueue()
        self._saver: threading.Thread | None = None

    # -- scheduler side -------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """The tokens past vLLM's own ``num_computed_tokens`` this request loads from the
        store (:func:`.plan.loadable`), loaded before its first forward (not async)."""
        prompt = np.asarray(request.prompt_token_ids or (), dtype=np.uint32)
        if len(prompt) < 2:
            return 0, False
        self.counters.lookups += 1
        try:
            hit = self.store.lookup(prompt[: len(prompt) - 1])
        except StrataError as e:  # the store cannot answer: vLLM computes, as without it
            log.warning("stratastore: lookup of request %s: %s", request.request_id, e)
            return 0, False
        upto = loadable(hit[1] if hit else 0, len(prompt), self.block_size)
        if upto <= num_computed_tokens:
            self._promised.pop(request.request_id, None)
            return 0, False
        self.counters.hits += 1
        self._promised[request.request_id] = upto
        return upto - num_computed_tokens, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        upto = self._promised.get(request.request_id, 0)
        block_ids = blocks.get_block_ids()[0]
        prompt = np.asarray(request.prompt_token_ids, dtype=np.uint32)
        self.counters.tokens_promised += num_external_tokens
        self._loads[request.request_id] = LoadJob(
            request.request_id,
            prompt[:upto],
            tuple(block_ids[: upto // self.block_size]),
            upto - num_external_tokens,
        )

    def build_connector_meta(self, scheduler_output: Any) -> StrataMetadata:
        meta = StrataMetadata(list(self._loads.values()), self._saves)
        self._loads, self._saves = {}, []
        return meta

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Park the finished request: every token whose K/V vLLM computed. Its blocks stay
        vLLM's to free once the worker has copied them (True: vLLM waits for
        :meth:`get_finished`)."""
        loaded = self._promised.pop(request.request_id, 0)
        tokens = np.asarray(request.all_token_ids, dtype=np.uint32)
        computed = min(int(request.num_computed_tokens), len(tokens))
        n = saved_tokens(computed, len(block_ids), self.block_size)
        if n == 0:
            return False, None
        self._saves.append(
            SaveJob(
                request.request_id,
                tokens[:n],
                tuple(block_ids[: n // self.block_size]),
                save_cuts(n, loaded, self.block_size),
            )
        )
        return True, None

    # -- worker side ----------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """vLLM's pool, checked against the model (a typed error at start-up otherwise)."""
        self.pool = Pool(self.fp, kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Restore each request of this step's metadata into its blocks, validated, before
        the forward that reads them; the blocks a restore did not fill are load errors."""
        meta = self._connector_metadata
        if not isinstance(meta, StrataMetadata) or not meta.loads:
            return
        pool = self._need_pool()
        started = time.perf_counter()
        for job in meta.loads:
            self._load(pool, job)
        self.counters.load_seconds += time.perf_counter() - started

    def _load(self, pool: Pool, job: LoadJob) -> None:
        want = len(job.tokens)
        dest = pool.destination(job.block_ids, job.skip)
        try:
            got = self.store.restore(job.tokens, dest, max_tokens=want).tokens
        except StrataError as e:
            log.warning("stratastore: restore of request %s: %s; vLLM recomputes it", job.req_id, e)
            got = 0
        self.counters.loads += 1
        self.counters.tokens_loaded += max(0, got - job.skip)
        if got < want:
            self.counters.load_shortfalls += 1
            failed = job.block_ids[max(got, job.skip) // self.block_size :]
            self.counters.blocks_recomputed += len(failed)
            self._load_errors.update(failed)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # every load finished in start_load_kv

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # a request is parked whole when it finishes (wait_for_save)

    def wait_for_save(self) -> None:
        """Hand each finished request of this step's metadata to the saver thread, which
        copies its K/V out of the blocks and parks it (the disk write on the Store's spill
        writer); nothing of it runs in the step. The blocks stay vLLM's until the copy is done
        (:meth:`get_finished`)."""
        meta = self._connector_metadata
        if not isinstance(meta, StrataMetadata) or not meta.saves:
            return
        self._need_pool()
        if self._saver is None:
            self._saver = threading.Thread(
                target=self._save_loop, name="strata-vllm-saver", daemon=True
            )
            self._saver.start()
        for job in meta.saves:
            self._save_queue.put(job)

    def _save_loop(self) -> None:
        pool = self._need_pool()
        while (job := self._save_queue.get()) is not None:
            started = time.perf_counter()
            try:
                self._park(pool, job)
            except Exception as e:  # never a failed request: the conversation is recomputed
                self.counters.save_errors += 1
                what = str(e) if isinstance(e, StrataError) else f"{type(e).__name__}: {e}"
                log.warning("stratastore: park of request %s: %s", job.req_id, what)
            with self._saves_lock:
                self.counters.save_seconds += time.perf_counter() - started
                self._saves_done.add(job.req_id)

    def _park(self, pool: Pool, job: SaveJob) -> None:
        n = len(job.tokens)
        kv = pool.gather(job.block_ids, n // self.block_size)
        marks = sorted({c for c in job.cuts if c} | {n})
        conv = Conversation(
            _conversation_id(job.tokens),
            job.tokens,
            [Checkpoint(m) for m in marks],
            cuts=list(job.cuts),
        )
        self.store.park(conv, kv)
        self.counters.saves += 1
        self.counters.tokens_saved += n

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """The requests whose K/V the saver has copied out of their blocks (parked, or given
        up on: the blocks are vLLM's again either way)."""
        with self._saves_lock:
            done, self._saves_done = self._saves_done, set()
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        """Release this side's hold on the Store; the last one closes it, waiting for every
        park in flight to be durable."""
        key, self._store_key = self._store_key, None
        if key is None:
            return
        if self._saver is not None:  # the parks handed over so far, then the thread ends
            self._save_queue.put(None)
            self._saver.join()
        c = self.counters
        if self.role == KVConnectorRole.WORKER:
            log.warning(
                "stratastore: StrataConnector worker: %d loads, %d tokens loaded, %d "
                "short (%d blocks recomputed) in %.3f s; %d parks, %d tokens, %d not "
                "parked, %.3f s on the saver thread",
                c.loads,
                c.tokens_loaded,
                c.load_shortfalls,
                c.blocks_recomputed,
                c.load_seconds,
                c.saves,
                c.tokens_saved,
                c.save_errors,
                c.save_seconds,
            )
        _release_store(key)

    def _need_pool(self) -> Pool:
        if self.pool is None:
            raise ConfigError(
                "StrataConnector: vLLM ran a step before registering its KV "
                "caches (register_kv_caches)"
            )
        return self.pool

    def stats(self) -> dict[str, Any]:
        """This side's counters and the Store's (``Store.stats()``)."""
        return {"connector": vars(self.counters).copy(), "store": self.store.stats()}


def _conversation_id(tokens: np.ndarray[Any, Any]) -> str:
    """A finished request's conversation id: its tokens' digest (vLLM requests carry no
    conversation id; a request parked again with the same tokens is the same conversation)."""
    import hashlib

    return "vllm-" + hashlib.blake2b(tokens.tobytes(), digest_size=16).hexdigest()
