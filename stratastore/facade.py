"""The ``Store``: the library API an inference engine links (DESIGN layer 8).

An engine calls :meth:`Store.park` when a slot is reused (the conversation leaves the GPU),
:meth:`Store.restore` when a prompt arrives (the deepest stored prefix is copied into its K/V
buffer, every disk page validated), and :meth:`Store.save_session` / :meth:`Store.load_session`
for explicit saves that capacity GC never removes. Every method is thread-safe (one lock); disk
writes of parks go through a background spill writer with a bounded queue, so a park returns
once the capture is handed over (it blocks only while the queue is full: back-pressure), and
:meth:`close` flushes it. Several processes may open the same directories: each sees the
segments and the conversations the others commit.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from .chain import Checkpoint, Conversation, as_tokens
from .config import StoreConfig
from .errors import ConfigError, StrataError
from .format import ModelFingerprint
from .format.naming import INDEX_DIR
from .io import durable_write
from .monitor import MONITOR_FILE, prometheus_text
from .restore import Destination
from .tiers.tiered import ParkReport, Restored, Snapshot, Tiers

__all__ = ["BatchRestoreError", "Store"]

_STOP = object()


class BatchRestoreError(StrataError):
    """Some requests of :meth:`Store.restore_many` failed; ``results`` holds, per request, its
    :class:`Restored` (its destination was filled) or its error."""

    def __init__(self, results: list[Restored | Exception]) -> None:
        self.results = results
        failed = [f"#{i}: {r}" for i, r in enumerate(results) if isinstance(r, Exception)]
        super().__init__(
            f"{len(failed)} of {len(results)} restores failed ("
            + "; ".join(failed)
            + "); the others completed (see .results)"
        )


class Store:
    """Open with :meth:`open`; use as a context manager or call :meth:`close`."""

    def __init__(self, tiers: Tiers, queue_depth: int) -> None:
        self._tiers = tiers
        self._lock = threading.RLock()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_depth)
        self._errors: list[BaseException] = []
        self._closed = False
        tiers.defer_spills = True
        self._writer = threading.Thread(target=self._drain, name="strata-spill", daemon=True)
        self._writer.start()
        self.counters = {
            "tokens_reread": 0,
            "spill_queue_waits": 0,
            "spill_errors": 0,
            "monitor_errors": 0,
        }
        self._published = float("-inf")  #: monotonic time of the last monitor snapshot

    @classmethod
    def open(
        cls,
        fingerprint: ModelFingerprint,
        config: StoreConfig | Mapping[str, Any] | str | None = None,
        *,
        probe: Callable[[], int] | None = None,
        spill_queue: int = 4,
        warn: Callable[[str], None] | None = None,
    ) -> Store:
        """``config``: a :class:`StoreConfig`, a mapping of settings, or a TOML file's path
        (what ``strata init`` writes); ``None`` for the defaults. ``probe`` returns the free
        RAM in bytes (default: the system's MemAvailable)."""
        if config is None:
            cfg = StoreConfig()
        elif isinstance(config, StoreConfig):
            cfg = config
        elif isinstance(config, str):
            cfg = StoreConfig.from_toml(config)
        else:
            cfg = StoreConfig.from_mapping(config)
        if spill_queue < 1:
            raise ConfigError("spill_queue must be at least 1")
        return cls(Tiers(cfg, fingerprint, probe=probe, warn=warn), spill_queue)

    # -- the spill writer ---------------------------------------------------------------------
    def _enqueue(self, snaps: list[Snapshot]) -> None:
        """Hand disk writes to the writer thread; called without the lock held, so a full
        queue blocks only the parking thread (back-pressure) and never the writer."""
        for snap in snaps:
            if self._queue.full():
                self.counters["spill_queue_waits"] += 1
            self._queue.put(snap)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, Snapshot)
                with self._lock:
                    self._tiers.write_disk_now(item)
                self.publish(force=False)  # here, so the store's disk writes stay on one thread
            except Exception as e:  # recorded and re-raised to the caller of flush/close
                self.counters["spill_errors"] += 1
                self._errors.append(e)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every queued disk write is committed; re-raise the first failure."""
        self._queue.join()
        self.publish(force=False)
        if self._errors:
            err, self._errors = self._errors[0], []
            raise err

    # -- the engine's calls -------------------------------------------------------------------
    def park(self, conv: Conversation, kv: npt.NDArray[Any],
             states: Mapping[int, bytes] | None = None) -> ParkReport:  # fmt: skip
        """Keep a conversation leaving its slot: RAM, else disk, else discard (counted).
        ``states`` maps checkpoint lengths to the running state saved there (hybrid and
        recurrent models). The store keeps ``conv`` and ``kv`` (the capture) until they are
        copied or written, and may trim ``conv``'s checkpoints (retention) or tokens (the
        prefix that fits): do not reuse either."""
        snap = Snapshot(conv, kv.reshape(-1).view(np.uint8), dict(states or {}))
        with self._lock:
            report = self._tiers.park(snap)
            spills = self._tiers.take_outbox()
        self._enqueue(spills)
        return report

    def lookup(self, prompt: Sequence[int] | npt.NDArray[np.integer]) -> tuple[str, int] | None:
        """``(source, tokens)`` of the deepest stored prefix of ``prompt``, or ``None``."""
        if self._queue.unfinished_tasks:
            self.flush()
        with self._lock:
            hit = self._tiers.lookup(as_tokens(prompt))
        return (hit[0], hit[1].length) if hit else None

    def restore(self, prompt: Sequence[int] | npt.NDArray[np.integer],
                out: npt.NDArray[Any] | Destination) -> Restored:  # fmt: skip
        """Copy the deepest stored prefix of ``prompt`` into ``out``: the engine's K/V buffer
        for this conversation in the page layout of spec F-SEG-4 (at least
        ``len(prompt) * token_bytes`` bytes), or a destination in the engine's own layout
        (:class:`~stratastore.restore.LayerKV`, :class:`~stratastore.restore.PagedKV` with a
        block table). Every disk page is validated before any byte is applied; a damaged image
        restores its deepest valid prefix (the ladder). Returns how many tokens ``out`` now
        holds; the engine prefills the rest."""
        tokens = as_tokens(prompt)
        flat: npt.NDArray[np.uint8] | Destination = (
            out.reshape(-1).view(np.uint8) if isinstance(out, np.ndarray) else out
        )
        if self._queue.unfinished_tasks:
            self.flush()  # read your own parks: pending disk writes land first
        with self._lock:
            r = self._tiers.restore(tokens, flat)
            self.counters["tokens_reread"] += len(tokens) - r.tokens
        return r

    def restore_many(
        self, requests: Sequence[tuple[Sequence[int] | npt.NDArray[np.integer],
                                       npt.NDArray[Any] | Destination]],
    ) -> list[Restored]:  # fmt: skip
        """:meth:`restore` for several prompts submitted together (one destination each): their
        disk reads share one batched read agenda, read-ahead, validation and copy overlapping
        across requests (:mod:`stratastore.restore.agenda`). Each request keeps the contract of
        :meth:`restore`. When some requests fail (the ladder turned off and an image damaged,
        an I/O error), the others still complete and :class:`BatchRestoreError` is raised,
        carrying every request's result."""
        reqs = [(as_tokens(p), out.reshape(-1).view(np.uint8) if isinstance(out, np.ndarray)
                 else out) for p, out in requests]  # fmt: skip
        if self._queue.unfinished_tasks:
            self.flush()
        with self._lock:
            got = self._tiers.restore_many(reqs)
            for (tokens, _), r in zip(reqs, got, strict=True):
                self.counters["tokens_reread"] += len(tokens) - (
                    0 if isinstance(r, Exception) else r.tokens
                )
        if any(isinstance(r, Exception) for r in got):
            raise BatchRestoreError(got)
        return [r for r in got if not isinstance(r, Exception)]

    def save_session(self, name: str, tokens: Sequence[int] | npt.NDArray[np.integer],
                     kv: npt.NDArray[Any], checkpoints: Sequence[int] = ()) -> None:  # fmt: skip
        """Save a conversation under ``name`` (durable when this returns; never evicted)."""
        toks = as_tokens(tokens)
        lengths = sorted({*checkpoints, len(toks)} - {0})
        conv = Conversation(name, toks, [Checkpoint(n) for n in lengths],
                            cuts=[0, *lengths[:-1]])  # fmt: skip
        with self._lock:
            self._tiers.save_session(Snapshot(conv, kv.reshape(-1).view(np.uint8)))

    def load_session(self, name: str, out: npt.NDArray[Any]) -> Conversation:
        with self._lock:
            return self._tiers.load_session(name, out.reshape(-1).view(np.uint8))

    def delete_session(self, name: str) -> bool:
        with self._lock:
            return self._tiers.delete_session(name)

    # -- state --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            doc = self._tiers.stats()
        doc.update(self.counters)
        doc["spill_queue"] = self._queue.qsize()
        return doc

    def info_line(self) -> str:
        """One line for a log: targets, levels, parks, discards, hits, admission."""
        s = self.stats()
        lv = s["levels"]
        parts = [f"park={s['park_target']}({s['park_target_source']})"]
        for name, d in lv.items():
            parts.append(f"{name}={d['entries']}e/{d['bytes'] / 2**20:.0f}MiB"
                         f"/{d['budget'] / 2**20:.0f}MiB")  # fmt: skip
        parts += [f"parks ram={s['parks_ram']} disk={s['parks_disk']}",
                  f"discards={s['discards']}", f"hits ram={s['hits_ram']} disk={s['hits_disk']}",
                  f"restored={s['tokens_restored']} reread={s['tokens_reread']}",
                  f"admission={s['admission']}"]  # fmt: skip
        return "strata: " + " ".join(parts)

    def prometheus(self) -> str:
        """The counters in the Prometheus text exposition format."""
        return prometheus_text(self.stats())

    def publish(self, *, force: bool = True) -> bool:
        """Write the counters where ``strata monitor`` reads them (``strata-index/monitor.json``
        of the last disk level); without ``force`` at most once a second. Called by the disk
        writer after each write, on flush and on close. Best effort: a failed write is counted
        (``monitor_errors``), never raised, as the engine's call must not fail for it. False
        when nothing was written (no disk level, too soon, or the write failed)."""
        d = self._tiers.manifest_dir
        now = time.monotonic()
        if d is None or (not force and now - self._published < 1.0):
            return False
        self._published = now
        doc = self.stats()
        doc.update(pid=os.getpid(), written_at=time.time())
        try:
            durable_write(os.path.join(d, INDEX_DIR, MONITOR_FILE),
                          json.dumps(doc, default=str).encode())  # fmt: skip
        except StrataError:
            self.counters["monitor_errors"] += 1
            return False
        return True

    def close(self) -> None:
        """Flush the spill writer, then close every level."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.join()
            self._queue.put(_STOP)
            self._writer.join()
            self.publish()
        finally:
            with self._lock:
                self._tiers.close()
        if self._errors:
            raise self._errors[0]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()
