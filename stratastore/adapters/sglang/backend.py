"""SGLang HiCache's storage backend on stratastore's chunk store: ``StrataHiCacheStorage``, loaded
by SGLang's ``dynamic`` backend (``--hicache-storage-backend dynamic`` and
``--hicache-storage-backend-extra-config`` naming this module and class: docs/engine.md,
"SGLang HiCache: a storage backend").

SGLang's ``HiCacheController`` keeps K/V in GPU memory, then in its host pool (``HostKVCache``),
then in a storage backend, page by page, each page named by a chain of SHA-256 hashes over its
tokens and every token before it (``get_storage_hash_str``). A backend sees host memory only.
This one (the ``HiCacheStorage`` contract of SGLang 0.5.23):

- **Keys.** SGLang's page hashes carry no model, so a page's chunk key is its hash under the
  namespace ``sglang-hicache-v1``, the pool (``kv``), the shard it holds (the TP rank of
  ``tp_size``, or ``mla`` where every rank holds the same page; the pipeline and
  context-parallel ranks) and, once SGLang registers its host pool (``register_mem_pool_host``,
  right after it builds the backend), the pool's dtype (with ``kv_cache_dtype`` for a pool of
  bytes: SGLang keeps every fp8 format as ``uint8``), layout, page size, bytes a token and
  layers, through :func:`~stratastore.chunks.chunk_key`: a page written for another shard,
  format or layout is another key, never read into this pool. The levels are opened when the
  backend is built, for a fingerprint of the weights (every byte of the weight files:
  :func:`~stratastore.adapters.vllm.identity.weights_identity`; a model name with no weight
  files found is the identity by itself, with a warning naming the ``model`` setting), so a
  level written for another model refuses to open
  (:class:`~stratastore.format.IncompatibleFingerprint`); deployments of every parallel
  layout share a level.
- **Reads are validated.** ``get``, ``batch_get``, ``batch_get_v1`` read a page into host
  memory only after every byte of it was BLAKE3-checked in the memory it is read into
  (:meth:`~stratastore.chunks.ChunkStore.get_into`) and found the page's size; a damaged page
  is a miss (``None`` / ``False``: SGLang recomputes it) and is removed from its level; a batch
  starts no read after its first miss, as SGLang counts only the leading pages read, and
  every read of a batch has ended when the call returns.
- **Writes are durable when they return True** where the first level is a directory: ``set``,
  ``batch_set``, ``batch_set_v1`` put the pages with one group commit a batch (written,
  fsynced, renamed in, the directory fsynced: spec F-DUR); a page already held (on any
  level) is not written again; a page the levels cannot fit is ``False``. A first level in
  memory or on Redis is as durable as that level.
- ``batch_exists`` is the leading pages held on some level (a Redis level asked once for the
  batch); ``exists`` one page.
- ``get_stats`` gives SGLang's ``StorageMetrics`` (pages and GB/s of each batch read and write
  since the last call) where SGLang collects them (``enable_storage_metrics``) and its metrics
  module imports; ``clear`` raises ``NotImplementedError`` (a page acknowledged is never
  deleted: the levels' budgets and ``strata gc`` age pages out), so SGLang reports it failed;
  ``close`` closes the store.
- The host pool is used through the methods every ``HostKVCache`` has (``get_data_page``,
  ``get_dummy_flat_data_page``, ``set_from_flat_data_page``): any layout SGLang's pool
  supports (``layer_first``, ``page_first``, ``page_first_direct``) is a flat page of bytes
  here, read into a buffer each reader thread keeps and copied into the pool after its check.
- The sidecar pools of hybrid models (Mamba and sliding-window state, ``batch_*_v2``) are not
  served: SGLang's attach of such a model fails at ``on_host_pools_registered`` with a
  :class:`ConfigError` naming them, rather than losing every backup to ``NotImplementedError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stratastore.adapters.sglang.settings import BackendSettings
from stratastore.adapters.vllm.identity import weights_identity
from stratastore.chunks import ChunkStore, ChunkStoreClosed, chunk_key
from stratastore.errors import ConfigError, StrataError
from stratastore.format import DType, ModelFingerprint

__all__ = ["READ_THREADS", "StrataHiCacheStorage", "page_namespace"]

#: threads reading a batch's pages at once (each read and BLAKE3 check releases the GIL): a
#: cold batch is as fast as the reads the device is given at once
READ_THREADS = 4

log = logging.getLogger("stratastore.adapters.sglang")

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except ImportError:  # the package imports without SGLang; the class needs it
    _Base = object


def page_namespace(config: Any, pool: str = "kv") -> str:
    """The chunk-key namespace of ``pool``'s pages under SGLang's ``HiCacheStorageConfig``
    ``config`` (see the module): the pages one shard of one pool holds."""
    shard = "mla" if config.is_mla_model else f"tp{config.tp_rank}/{config.tp_size}"
    if config.pp_size > 1:
        shard += f";pp{config.pp_rank}/{config.pp_size}"
    if config.attn_cp_size > 1:
        shard += f";cp{config.attn_cp_rank}/{config.attn_cp_size}"
    return f"sglang-hicache-v1;pool={pool};{shard}"


def _bytes_of(tensor: Any) -> memoryview:
    """A CPU tensor's bytes, without a copy where it is contiguous."""
    return memoryview(tensor.contiguous().view(-1).view(_uint8()).numpy())


def _tensor_of(data: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _uint8() -> Any:
    import torch

    return torch.uint8


class StrataHiCacheStorage(_Base):  # type: ignore[misc]
    """A ``HiCacheStorage`` on a :class:`~stratastore.chunks.ChunkStore` (see the module), as
    SGLang's factory builds a dynamic backend: ``StrataHiCacheStorage(storage_config,
    kwargs)``. Thread-safe: SGLang's prefetch and backup threads call it at once."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        if _Base is object:
            raise ConfigError(
                "StrataHiCacheStorage needs SGLang (sglang.srt.mem_cache.hicache_storage): "
                "install SGLang beside stratastore"
            )
        self.storage_config = storage_config
        self.settings = BackendSettings.from_extra_config(storage_config.extra_config)
        self.namespace = page_namespace(storage_config)
        self.mem_pool_host: Any = None
        self._lock = threading.Lock()
        self._metrics: dict[str, list[float]] = _empty_metrics()
        self._pages = threading.local()  #: each reader's page buffer, kept between reads
        self.store: ChunkStore | None = ChunkStore.open(self.settings.chunks, self.fingerprint())
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="strata-hicache")

    # -- set-up --------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Take SGLang's host pool: its pages are what the zero-copy calls move, and its
        geometry goes into every page's key from now on (see the module).
        :class:`ConfigError` for a pool of bytes (``uint8``: SGLang keeps every fp8 K/V format
        so) without the ``kv_cache_dtype`` setting that says which format they are."""
        dtype = str(mem_pool_host.dtype).removeprefix("torch.")
        if dtype == "uint8":
            if self.settings.kv_cache_dtype is None:
                raise ConfigError(
                    f"{self.settings.source}: SGLang's host pool holds the K/V as bytes "
                    '(uint8, as it keeps every fp8 format): say which, "kv_cache_dtype": '
                    '"fp8_e4m3" (SGLang\'s --kv-cache-dtype), so that pages of another format '
                    "are never read into this pool"
                )
            dtype = f"uint8:{self.settings.kv_cache_dtype}"
        layers = ""
        if getattr(mem_pool_host, "start_layer", None) is not None:
            layers = f";layers={mem_pool_host.start_layer}-{mem_pool_host.end_layer}"
        geometry = (
            f";dtype={dtype};layout={mem_pool_host.layout};page_size="
            f"{int(mem_pool_host.page_size)};bytes_per_token="
            f"{int(mem_pool_host.get_size_per_token())}{layers}"
        )
        with self._lock:
            self.mem_pool_host = mem_pool_host
            self.namespace = page_namespace(self.storage_config) + geometry
            self._pages = threading.local()  # buffers of the pool's page shape from now on

    def on_host_pools_registered(self) -> None:
        """SGLang registered every host pool: :class:`ConfigError` (which fails the attach)
        when one is a sidecar pool (a hybrid model's Mamba or sliding-window state), whose
        calls this backend does not serve."""
        others = sorted(str(n) for n in getattr(self, "registered_pools", {}) if str(n) != "kv")
        if others:
            raise ConfigError(
                f"StrataHiCacheStorage serves the K/V pool only; SGLang registered {others} "
                "too (a hybrid model's state pools): use another HiCache storage backend for "
                "this model"
            )

    def fingerprint(self) -> ModelFingerprint:
        """The levels' fingerprint under this backend's storage config (see the module): the
        weights' identity only, so that deployments of every parallel layout share a level
        (the shard is in each page's key)."""
        cfg = self.storage_config
        model = self.settings.model or cfg.model_name
        if not model:
            raise ConfigError(
                f"{self.settings.source}: SGLang gave no model_name; name the weights "
                '("model": "/models/Llama-3.1-8B")'
            )
        identity = weights_identity(model, self.settings.revision)
        if not identity.startswith("weights:"):
            log.warning(
                "stratastore: no weight files found for %r: the HiCache pages are keyed by "
                'that name alone; give the weights\' directory as "model" in the extra '
                "config so that another model served under the same name never shares them",
                model,
            )
        return ModelFingerprint.create(
            identity,
            n_layers=1,
            n_kv_heads=1,
            head_dim=1,
            page_tokens=1,
            dtype=DType.INT8,
            extra=b"sglang-hicache-v1",
        )

    def _store(self) -> ChunkStore:
        store = self.store
        if store is None:
            raise ChunkStoreClosed("StrataHiCacheStorage: the backend is closed")
        return store

    def chunk_key_of(self, key: str) -> bytes:
        """The chunk key SGLang's page hash ``key`` is stored under here (see the module):
        :func:`~stratastore.format.data_name` of its ``state_key`` names the page's data file
        in a directory level, for an operator (or a test) looking for one page."""
        return chunk_key(key, namespace=self.namespace)

    # -- lookups -------------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self._store().exists(self.chunk_key_of(key))

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, some level holds."""
        return self._store().batch_exists([self.chunk_key_of(k) for k in keys])

    # -- reads ---------------------------------------------------------------------------------
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any | None:
        """The page into ``target_location`` (a CPU tensor of the page's size; default a new
        flat page of the host pool, or without one a new ``uint8`` tensor of the page),
        validated: that tensor, or ``None`` for a miss."""
        dst = target_location
        if dst is None and self.mem_pool_host is None:  # no pool: the page as bytes
            data = self._store().get(self.chunk_key_of(key))
            return None if data is None else _tensor_of(data)
        if dst is None:
            dst = self.mem_pool_host.get_dummy_flat_data_page()
        if not dst.is_contiguous():  # read where the bytes lie, then copy them in
            page = self.get(key, dst.contiguous())
            return None if page is None else dst.copy_(page)
        view = _bytes_of(dst)
        got = self._store().get_into(self.chunk_key_of(key), view)
        return dst if got == view.nbytes else None

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[Any | None]:
        """:meth:`get` of each key (``None`` from the first miss on)."""
        start = time.perf_counter()
        locations = list(target_locations) if target_locations is not None else [None] * len(keys)
        out: list[Any | None] = []
        for key, dst in zip(keys, locations, strict=True):
            page = self.get(key, dst) if (not out or out[-1] is not None) else None
            out.append(page)
        self._measure("prefetch", out, start)
        return out

    def batch_get_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Read each page into the host pool at ``host_indices[i * page_size]``, validated
        first and of the pool's page size (the pages read at once on :data:`READ_THREADS`
        threads, in order; none is started after the first miss, and every read has ended
        when this returns); ``False`` from the first miss on."""
        pool = self._pool()
        store = self._store()
        start = time.perf_counter()
        first_miss = [len(keys)]  # the first page that missed so far (SGLang uses none after)
        lock = threading.Lock()

        def miss(i: int) -> bool:
            with lock:
                first_miss[0] = min(first_miss[0], i)
            return False

        def read(i: int) -> bool:
            if i > first_miss[0]:  # a page before it missed: not started
                return False
            try:
                page = self._page_buffer(pool)
                view = _bytes_of(page)
                if store.get_into(self.chunk_key_of(keys[i]), view) != view.nbytes:
                    return miss(i)
                pool.set_from_flat_data_page(int(host_indices[i * pool.page_size]), page)
                return True
            except Exception as e:  # a read that fails is a miss; never a write after return
                log.warning("stratastore: the HiCache page %s was not read: %s", keys[i], e)
                return miss(i)

        futures = [self._readers.submit(read, i) for i in range(len(keys))]
        done = [f.result() for f in futures]  # read() raises nothing: every future is waited
        cut = done.index(False) if False in done else len(done)
        done[cut:] = [False] * (len(done) - cut)
        self._measure("prefetch", done, start)
        return done

    # -- writes --------------------------------------------------------------------------------
    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Put ``value`` (a CPU tensor: the page) under ``key``; True once durable."""
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Put every page, one group commit; True when all are durable (or held already)."""
        if values is None:
            return False
        return all(self._put(keys, [_bytes_of(v) for v in values]))

    def batch_set_v1(
        self, keys: list[str], host_indices: Any, extra_info: Any = None
    ) -> list[bool]:
        """Put the pages of the host pool at ``host_indices[i * page_size]``, one group commit:
        for each, whether it is durable (or held already)."""
        pool = self._pool()
        pages = [
            _bytes_of(pool.get_data_page(int(host_indices[i * pool.page_size]), flat=True))
            for i in range(len(keys))
        ]
        return self._put(keys, pages)

    def _put(self, keys: Sequence[str], pages: Sequence[memoryview]) -> list[bool]:
        start = time.perf_counter()
        try:
            outcomes = self._store().put_many([self.chunk_key_of(k) for k in keys], pages)
        except StrataError as e:  # a key or page the store refuses: nothing was put
            log.warning("stratastore: %d HiCache pages not stored: %s", len(keys), e)
            return [False] * len(keys)
        done = []
        for key, r in zip(keys, outcomes, strict=True):
            if isinstance(r, StrataError):
                log.warning("stratastore: the HiCache page %s was not stored: %s", key, r)
            done.append(r in ("stored", "present"))
        self._measure("backup", done, start)
        return done

    # -- the rest of the contract ---------------------------------------------------------------
    def clear(self) -> bool:
        """Not served (see the module): raises ``NotImplementedError``, so that SGLang reports
        the clear as failed rather than done."""
        raise NotImplementedError(
            "StrataHiCacheStorage keeps every acknowledged page: the levels' budgets and "
            "`strata gc` age pages out; remove a level's directory to drop it"
        )

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` of the batches since the last call (``None`` where
        SGLang's metrics module does not import)."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return None
        with self._lock:
            m, self._metrics = self._metrics, _empty_metrics()
        return StorageMetrics(
            prefetch_pgs=[int(x) for x in m["prefetch_pgs"]],
            backup_pgs=[int(x) for x in m["backup_pgs"]],
            prefetch_bandwidth=m["prefetch_bandwidth"],
            backup_bandwidth=m["backup_bandwidth"],
        )

    def close(self) -> None:
        """Close the store (idempotent)."""
        with self._lock:
            store, self.store = self.store, None
        self._readers.shutdown(wait=True)
        if store is not None:
            store.close()

    def _page_buffer(self, pool: Any) -> Any:
        """This thread's flat page of ``pool``'s shape and dtype (made once: a page read is
        copied into the pool from it, so it is never handed out)."""
        page = getattr(self._pages, "page", None)
        if page is None:
            import torch

            like = pool.get_dummy_flat_data_page()
            page = self._pages.page = torch.empty_like(like)
        return page

    def _pool(self) -> Any:
        if self.mem_pool_host is None:
            raise ConfigError(
                "StrataHiCacheStorage: no host pool registered (SGLang registers it right after "
                "building the backend): call register_mem_pool_host(pool) before the calls "
                "that move pages by host indices"
            )
        return self.mem_pool_host

    def _measure(self, what: str, done: Sequence[object], start: float) -> None:
        """Record a batch for :meth:`get_stats`, only where SGLang collects storage metrics
        (``enable_storage_metrics``: it calls ``get_stats`` then, which empties the lists)."""
        pages = sum(1 for d in done if d is not None and d is not False)
        if not pages or self.mem_pool_host is None:
            return
        if not self.storage_config.enable_storage_metrics:
            return
        seconds = max(time.perf_counter() - start, 1e-9)
        per_page = int(self.mem_pool_host.get_size_per_token()) * int(self.mem_pool_host.page_size)
        with self._lock:
            self._metrics[f"{what}_pgs"].append(pages)
            self._metrics[f"{what}_bandwidth"].append(pages * per_page / seconds / 1e9)


def _empty_metrics() -> dict[str, list[float]]:
    return {k: [] for k in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")}
