"""The worker's loads: each step's restores into vLLM's blocks, on a thread of the connector's
own, started by ``start_load_kv`` and waited for before the first attention layer reads them.

vLLM's CPU worker pins every thread of its process (its forward's OMP threads among them) to
the cores it computes on, and a thread inherits its creator's affinity: a restore run on the
worker's thread, and the read and hash threads it starts, would share the forward's one core
while the others idle. The loader's thread lets itself run on every CPU the process may use
(:func:`~stratastore.io.system.process_cpus`: its threads' affinities and its parent's, vLLM's
engine process, which is not pinned; a process started on a subset keeps it), and the store's
read threads it starts inherit that.

Why the forward waits for a request's whole load before its first attention layer, not layer
by layer: a stored page holds every layer's K and V of its tokens (spec F-SEG-4), so a layer's
K/V is whole only when the last page has been read, validated and applied. What overlaps the
load is the forward's work before that layer (vLLM calls ``wait_for_layer_load`` on entry to
each attention layer: the first one waits, the others find the loads done).

Every page delivered was validated in the memory it is delivered from (the Store's restore);
a load that stops short (a damaged page, a segment gone, blocks refused) reports the blocks it
did not fill, which vLLM recomputes. No vLLM import."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from stratastore.adapters.vllm.plan import LoadJob
from stratastore.adapters.vllm.tally import Tally
from stratastore.errors import StrataError
from stratastore.io.system import process_cpus, run_on_cpus

__all__ = ["Loader"]

log = logging.getLogger("stratastore.vllm")


class Loader:
    """Runs each step's :class:`~.plan.LoadJob` restores on one thread (see the module).

    :meth:`start` hands a step's jobs over and returns; :meth:`wait` returns once they ended
    (every job restored, short or failed); :meth:`errors` waits, then gives the blocks no
    load filled since the last call. One step's loads at a time: :meth:`start` waits for the
    previous step's first. ``store`` is a :class:`~stratastore.Store`, ``pool`` a
    :class:`~.pool.Pool`."""

    def __init__(self, store: Any, pool: Any, tally: Tally, block_size: int) -> None:
        self.store, self.pool, self.tally, self.block_size = store, pool, tally, block_size
        self._jobs: queue.SimpleQueue[list[LoadJob] | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._errors: set[int] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, jobs: Sequence[LoadJob]) -> None:
        """Start restoring ``jobs`` (a step's loads) on the loader's thread."""
        if not jobs:
            return
        self.wait()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="strata-vllm-load", daemon=True)
            self._thread.start()
        self._idle.clear()
        self._jobs.put(list(jobs))

    def wait(self) -> None:
        """Return once every load handed over has ended."""
        self._idle.wait()

    def errors(self) -> set[int]:
        """The blocks the loads since the last call did not fill (after :meth:`wait`)."""
        self.wait()
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    def close(self) -> None:
        """Wait for the loads handed over, then end the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        run_on_cpus(process_cpus())  # not the forward's core alone (see the module)
        while (jobs := self._jobs.get()) is not None:
            try:
                for job in jobs:
                    started = time.perf_counter()
                    self._load(job)
                    self.tally.time("load_seconds", time.perf_counter() - started)
            finally:
                self._idle.set()

    def _load(self, job: LoadJob) -> None:
        want = len(job.tokens)
        try:  # blocks vLLM handed over wrongly are refused by name, as damage is: recomputed
            dest = self.pool.destination(job.block_ids, job.skip)
            got = int(self.store.restore(job.tokens, dest, max_tokens=want).tokens)
        except StrataError as e:
            log.warning("stratastore: restore of request %s: %s; vLLM recomputes it", job.req_id, e)
            got = 0
        except Exception as e:  # never a failed step, never a hang: its blocks are recomputed
            log.warning(
                "stratastore: restore of request %s: %s: %s; vLLM recomputes it",
                job.req_id,
                type(e).__name__,
                e,
            )
            got = 0
        loaded = max(0, got - job.skip)
        tb = self.pool.fp.token_bytes
        self.tally.add(loads=1, tokens_loaded=loaded, bytes_load=loaded * tb)
        if got < want:
            failed = job.block_ids[max(got, job.skip) // self.block_size :]
            self.tally.add(load_shortfalls=1, blocks_recomputed=len(failed))
            with self._lock:
                self._errors.update(failed)
