"""The LMCache storage plugin (:mod:`stratastore.adapters.lmcache`): the part that imports
LMCache."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from threading import Condition, Lock
from typing import Any

from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from stratastore.adapters.lmcache.chunks import ChunkLayout, PluginCounters, chunk_id
from stratastore.adapters.lmcache.config import (
    PluginSettings,
    chunk_bytes_of,
    fingerprint_of,
    key_fields,
)
from stratastore.adapters.lmcache.store import LMCacheChunks, OpenChunk, stored_bytes
from stratastore.errors import ConfigError, StrataError
from stratastore.format import FormatError

__all__ = [
    "FlushTimeout",
    "PluginSettings",
    "PutsFailed",
    "StrataStoragePlugin",
    "fingerprint_of",
    "key_fields",
]

log = logging.getLogger("stratastore.adapters.lmcache")


class PutsFailed(StrataError):
    """Puts whose write did not land (``failures``: the chunk key and the cause, each reported
    once, by the next ``flush``); those chunks are not stored."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        self.failures = failures
        first = "; ".join(f"{k}: {type(e).__name__}: {e}" for k, e in failures[:3])
        super().__init__(
            f"{len(failures)} LMCache chunk put(s) failed and are not stored "
            f"({first}); check the disk and the plugin's directory"
        )


class FlushTimeout(StrataError):
    """``flush(timeout)`` gave up waiting: ``pending`` puts had not landed (they may still
    land, or fail: the next ``flush`` reports them)."""

    def __init__(self, pending: int, timeout: float) -> None:
        self.pending = pending
        super().__init__(
            f"{pending} LMCache chunk put(s) still in flight after {timeout} s: "
            "they are not known to be durable; flush again to wait"
        )


class StrataStoragePlugin(StoragePluginInterface):  # type: ignore[misc]
    """LMCache's ``StoragePluginInterface`` over the plugin's chunks (:class:`LMCacheChunks`, a
    :class:`~stratastore.chunks.ChunkStore` on the levels of its settings: one directory, or
    ``levels`` first to last; the module docstring says what each call promises)."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: Any = None,
        metadata: Any = None,
        local_cpu_backend: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(
            dst_device=dst_device,
            config=config,
            metadata=metadata,
            local_cpu_backend=local_cpu_backend,
            loop=loop,
        )
        self.settings = PluginSettings.from_config(
            getattr(config, "extra_config", None), getattr(config, "storage_plugins", None)
        )
        fingerprint = fingerprint_of(metadata)
        self.settings.check_room(
            stored_bytes(chunk_bytes_of(metadata)),
            f"kv_shape {tuple(metadata.kv_shape)} x {metadata.kv_dtype}",
        )
        self.chunks = LMCacheChunks.open_levels(self.settings.chunks, fingerprint)
        self._writers = ThreadPoolExecutor(self.settings.put_threads, "strata-lmcache-put")
        self._readers = ThreadPoolExecutor(self.settings.read_threads, "strata-lmcache-read")
        self._lock = Lock()
        self._in_flight: dict[bytes, Future[bool]] = {}
        self._failures: list[tuple[str, BaseException]] = []
        self._lookup_pins: dict[str, list[bytes]] = {}
        self._closed = False  #: close() began
        self._refusing_puts = False  #: close() stopped accepting puts
        self._reading = 0  #: gets in flight (close waits for them)
        self._reads_done = Condition(self._lock)
        levels = self.settings.chunks.levels
        log.info(
            "stratastore: LMCache chunks in %s",
            ", ".join(f"{lv.shown} ({lv.budget_bytes >> 20} MiB)" for lv in levels),
        )

    def __str__(self) -> str:
        return self.settings.name

    # -- puts ---------------------------------------------------------------------------------
    def batched_submit_put_task(
        self,
        keys: Sequence[Any],
        objs: list[Any],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[Any], None] | None = None,
    ) -> list[Future[bool]] | None:
        """Start a durable put of each chunk not stored or in flight already; one Future a
        started put (``True``: stored or present; ``False``: refused; an exception: failed).
        Once ``close`` stopped accepting puts, each is refused: a Future done with False (no
        reference taken on its memory object), counted in ``puts_refused``."""
        started: list[Future[bool]] = []
        for key, obj in zip(keys, objs, strict=True):
            cid = chunk_id(key_fields(key))
            with self._lock:
                if self._refusing_puts:
                    self.chunks.count("puts_refused")
                    refused: Future[bool] = Future()
                    refused.set_result(False)
                    started.append(refused)
                    continue
                if cid in self._in_flight or self.chunks.contains(cid):
                    self.chunks.count("puts_deduped")
                    continue
                obj.ref_count_up()  # held until written; the storage manager drops its own
                fut = self._writers.submit(self._put, key, cid, obj, on_complete_callback)
                self._in_flight[cid] = fut
            fut.add_done_callback(partial(self._landed, cid))
            started.append(fut)
        return started or None

    def _landed(self, cid: bytes, _fut: Future[bool]) -> None:
        with self._lock:
            self._in_flight.pop(cid, None)

    def _put(self, key: Any, cid: bytes, obj: Any, done: Callable[[Any], None] | None) -> bool:
        try:
            layout = self._layout_of(obj)
            if layout is None or not self.chunks.accepts(layout):
                return False
            if self.chunks.put(cid, memoryview(obj.byte_array)) == "refused":
                return False
        except BaseException as e:
            self.chunks.count("put_errors")
            with self._lock:
                self._failures.append((key.to_string(), e))
            log.error(
                "stratastore: the put of LMCache chunk %s failed: %s: %s",
                key.to_string(),
                type(e).__name__,
                e,
            )
            raise
        finally:
            obj.ref_count_down()
        if done is not None:
            try:
                done(key)
            except Exception as e:  # the interface: callback errors are logged, not raised
                log.warning("stratastore: on_complete_callback failed for %s: %s", key, e)
        return True

    def _layout_of(self, obj: Any) -> ChunkLayout | None:
        meta = obj.metadata
        if meta.cached_positions is not None:
            self.chunks.count("puts_refused")
            return None
        shapes = meta.shapes or [meta.shape]
        dtypes = meta.dtypes or [meta.dtype]
        try:
            layout, tokens = ChunkLayout.of(
                meta.fmt.name,
                meta.fmt.token_dim(),
                [str(d) for d in dtypes],
                [d.itemsize for d in dtypes],
                [tuple(s) for s in shapes],
            )
        except FormatError as e:
            log.error("stratastore: a memory object of %s is not stored: %s", meta.fmt, e)
            self.chunks.count("puts_refused")
            return None
        if len(obj.byte_array) != tokens * layout.bytes_per_token:
            log.error(
                "stratastore: a memory object of %s holds %d bytes, not %d: not stored",
                meta.fmt,
                len(obj.byte_array),
                tokens * layout.bytes_per_token,
            )
            self.chunks.count("puts_refused")
            return None
        return layout

    def exists_in_put_tasks(self, key: Any) -> bool:
        with self._lock:
            return chunk_id(key_fields(key)) in self._in_flight

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every put submitted so far has landed. Returns normally only when all of
        them landed and none failed since the last ``flush``; raises :class:`FlushTimeout` when
        ``timeout`` seconds passed with some still in flight (failures are then kept for the
        next ``flush``), else :class:`PutsFailed` for those that failed (each reported once)."""
        with self._lock:
            pending = list(self._in_flight.values())
        _, not_done = wait(pending, timeout)
        if not_done:
            raise FlushTimeout(len(not_done), timeout if timeout is not None else 0.0)
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            raise PutsFailed(failures)

    # -- lookups and pins ---------------------------------------------------------------------
    def contains(self, key: Any, pin: bool = False) -> bool:
        cid = chunk_id(key_fields(key))
        return self.chunks.pin(cid) if pin else self.chunks.contains(cid)

    async def batched_async_contains(
        self, lookup_id: str, keys: list[Any], pin: bool = False
    ) -> int:
        hits: list[bytes] = []
        for key in keys:
            cid = chunk_id(key_fields(key))
            if not (self.chunks.pin(cid) if pin else self.chunks.contains(cid)):
                break
            hits.append(cid)
        if pin and hits:
            with self._lock:
                self._lookup_pins.setdefault(lookup_id, []).extend(hits)
        return len(hits)

    def pin(self, key: Any) -> bool:
        return self.chunks.pin(chunk_id(key_fields(key)))

    def unpin(self, key: Any) -> bool:
        return self.chunks.unpin(chunk_id(key_fields(key)))

    def touch_cache(self) -> None:
        """Nothing to do: eviction goes by seal time, oldest first."""

    # -- gets ---------------------------------------------------------------------------------
    def get_blocking(self, key: Any) -> Any:
        got = self._get_prefix([key], busy_loop=True)
        return got[0] if got else None

    def batched_get_blocking(self, keys: list[Any]) -> list[Any]:
        got = self._get_prefix(keys, busy_loop=True)
        return got + [None] * (len(keys) - len(got))

    def get_non_blocking(self, key: Any, location: str | None = None) -> Future[Any] | None:
        cid = chunk_id(key_fields(key))
        with self._lock:
            if self._closed or not self.chunks.contains(cid):
                return None
            return self._readers.submit(
                lambda: (self._get_prefix([key], busy_loop=False) or [None])[0]
            )

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[Any], transfer_spec: Any = None
    ) -> list[Any]:
        """The longest stored, valid prefix of ``keys``, read on a thread (never on LMCache's
        loop; ``close`` waits for it); releases the pins ``batched_async_contains`` took for
        ``lookup_id``."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, lambda: self._get_prefix(keys, busy_loop=False)
            )
        finally:
            with self._lock:
                pins = self._lookup_pins.pop(lookup_id, [])
            wanted = {chunk_id(key_fields(k)) for k in keys}
            for cid in pins:
                if cid in wanted:
                    self.chunks.unpin(cid)

    def _get_prefix(self, keys: Sequence[Any], *, busy_loop: bool) -> list[Any]:
        """Memory objects of the longest prefix of ``keys`` stored and valid (a miss once
        ``close`` began; ``close`` waits for the gets in flight)."""
        with self._lock:
            if self._closed:
                return []
            self._reading += 1
        try:
            return self._read_prefix(keys, busy_loop=busy_loop)
        finally:
            with self._lock:
                self._reading -= 1
                self._reads_done.notify_all()

    def _read_prefix(self, keys: Sequence[Any], *, busy_loop: bool) -> list[Any]:
        """Opened and allocated in order (LMCache's allocator one call at a time; only the
        first chunk may wait for memory: a later one that does not fit ends the prefix, as this
        call holds the memory it would wait for), then copied and validated on the reader
        threads; everything past the first failure is released, and everything on an
        exception."""
        opened: list[tuple[OpenChunk, Any]] = []
        try:
            for key in keys:
                chunk = self.chunks.open_chunk(chunk_id(key_fields(key)))
                if chunk is None:
                    break
                try:
                    obj = self._allocate(chunk, busy_loop and not opened)
                except BaseException:
                    chunk.close()
                    raise
                if obj is None:
                    chunk.close()
                    break
                opened.append((chunk, obj))
        except BaseException:
            for chunk, obj in opened:
                chunk.close()
                obj.ref_count_down()
            raise

        def copy(pair: tuple[OpenChunk, Any]) -> bool:
            return self.chunks.copy_into(pair[0], memoryview(pair[1].byte_array))

        oks: list[bool] = []
        try:
            oks = [copy(opened[0])] if len(opened) == 1 else list(self._readers.map(copy, opened))
        finally:
            for chunk, _ in opened[len(oks) :]:
                chunk.close()  # copies that never ran (closing twice is harmless)
            good = next((i for i, ok in enumerate(oks) if not ok), len(oks))
            for _, obj in opened[good:]:
                obj.ref_count_down()
        return [obj for _, obj in opened[:good]]

    def _allocate(self, chunk: OpenChunk, busy_loop: bool) -> Any:
        import torch

        if self.local_cpu_backend is None:
            raise ConfigError(
                "the plugin has no LMCache CPU backend to allocate memory objects "
                "in: set max_local_cpu_size > 0"
            )
        layout = self.chunks.layout
        assert layout is not None  # open_chunk() found the chunk's token count through it
        tokens = self.chunks.tokens_of(chunk)
        shapes = [torch.Size(s) for s in layout.shapes_for(tokens)]
        dtypes = [getattr(torch, d.removeprefix("torch.")) for d in layout.dtypes]
        one = len(shapes) == 1
        obj = self.local_cpu_backend.allocate(
            shapes[0] if one else shapes,
            dtypes[0] if one else dtypes,
            MemoryFormat[layout.fmt],
            busy_loop=busy_loop,
        )
        if obj is None:
            self.chunks.count("alloc_failures")
            log.warning(
                "stratastore: LMCache's CPU buffer has no room for a chunk of %d tokens: a miss",
                tokens,
            )
        return obj

    # -- removal, stats, close ----------------------------------------------------------------
    def remove(self, key: Any, force: bool = True) -> bool:
        """Delete the chunk; without ``force`` a pinned one stays (False)."""
        return self.chunks.remove(chunk_id(key_fields(key)), force=force)

    def get_allocator_backend(self) -> Any:
        if self.local_cpu_backend is None:
            raise ConfigError("the plugin has no LMCache CPU backend: set max_local_cpu_size > 0")
        return self.local_cpu_backend

    def stats(self) -> dict[str, int]:
        """The counters (:class:`PluginCounters`), what the directory holds, puts in flight."""
        doc = self.chunks.stats()
        with self._lock:
            doc["puts_in_flight"] = len(self._in_flight)
        return doc

    def prometheus(self) -> str:
        """The counters in the Prometheus text format (``strata_lmcache_<counter>_total``) and
        the directory's bytes and budget as gauges."""
        doc = self.stats()
        lines = []
        for name in PluginCounters().as_dict():
            lines += [
                f"# TYPE strata_lmcache_{name}_total counter",
                f"strata_lmcache_{name}_total {doc[name]}",
            ]
        for name in ("entries", "used_bytes", "budget_bytes", "puts_in_flight"):
            lines += [f"# TYPE strata_lmcache_{name} gauge", f"strata_lmcache_{name} {doc[name]}"]
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        """Wait for the puts in flight (puts submitted meanwhile are still started; once they
        are waited for, further puts are refused), log their failures; refuse gets from now on
        and wait for those in flight; then close the directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush()
        except PutsFailed as e:
            log.error("stratastore: at close: %s", e)
        with self._lock:
            self._refusing_puts = True
        self._writers.shutdown(wait=True)
        with self._lock:
            failures, self._failures = self._failures, []
            while self._reading:
                self._reads_done.wait()
        if failures:
            log.error("stratastore: at close: %s", PutsFailed(failures))
        self._readers.shutdown(wait=True)
        self.chunks.close()
