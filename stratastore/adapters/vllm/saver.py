"""The worker's parks, on one thread of their own: vLLM's step never waits for a disk.

:meth:`Saver.submit` takes a :class:`~.plan.SaveJob` with its K/V already copied out of vLLM's
blocks (a prompt just computed: the request still runs, and its blocks may be reused once the
step ends: :meth:`.pool.Pool.copy`), or without (a finished request whose blocks vLLM keeps for
it). The thread parks each into the Store, in the order handed over (a prompt's pages before
its reply's): a finished request's straight out of its blocks (``Store.park(conv,
pool.source(blocks))``: the store's streamed park gathers, hashes and writes them a chunk at a
time when the park goes to disk, nothing copied whole; on a device, gathered and hashed
there), then flushes: a park counts as durable
(``parks``) only once its write has landed (spec F-DUR), and as dropped, by reason, when the
store refused it or its write failed. A finished request's blocks are given back
(:meth:`Saver.finished`) once its park is durable or given up on, so vLLM keeps stepping
until then and its figures reach vLLM's metrics in that step. No vLLM import."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from stratastore.adapters.vllm.plan import SaveJob
from stratastore.adapters.vllm.pool import Pool
from stratastore.adapters.vllm.tally import Tally
from stratastore.chain import Checkpoint, Conversation
from stratastore.errors import StrataError
from stratastore.facade import SpillError, Store
from stratastore.io.system import process_cpus, run_on_cpus

__all__ = ["Saver"]

log = logging.getLogger("stratastore.vllm")

_Item = tuple[SaveJob, Any, float]


def _conversation(job: SaveJob) -> Conversation:
    n = len(job.tokens)
    marks = sorted({c for c in job.cuts if c} | {n})
    return Conversation(
        job.conv_id, job.tokens, [Checkpoint(m) for m in marks], cuts=list(job.cuts)
    )


class Saver:
    """See the module. One per worker, made on its first job; :meth:`close` waits for every
    job handed over. With ``start=False`` the thread waits for :meth:`start` (the jobs
    submitted before it go down as one batch)."""

    def __init__(self, store: Store, pool: Pool, tally: Tally, *, start: bool = True) -> None:
        self.store, self.pool, self.tally = store, pool, tally
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._finished: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="strata-vllm-saver", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: SaveJob, kv: Any = None) -> None:
        """Park ``job`` on the thread; ``kv``: its pages, copied out already (host bytes or
        a device array: :meth:`.pool.Pool.copy`), else parked from the blocks vLLM holds for
        it (``job.held``)."""
        self._queue.put((job, kv, time.perf_counter()))

    def finished(self) -> set[str]:
        """The finished requests whose park is durable or given up on since the last call:
        their blocks are vLLM's again."""
        with self._lock:
            done, self._finished = self._finished, set()
        return done

    def close(self) -> None:
        """Wait for every job handed over, then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        run_on_cpus(process_cpus())  # its gathering threads inherit it: not the forward's core
        while True:
            batch = [self._queue.get()]
            while True:  # what else is waiting goes down with it: one flush for all
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            items = [b for b in batch if b is not None]
            counted: set[int] = set()  #: the items whose outcome the tally holds
            try:
                if items:
                    self._save(items, counted)
            except BaseException as e:  # the thread must go on: vLLM waits for the blocks
                log.warning("stratastore: parking %d requests: %s", len(items), _said(e))
                for _ in range(len(items) - len(counted)):
                    self.tally.drop("error")
            finally:  # a finished request's blocks go back whatever became of its park
                with self._lock:
                    self._finished.update(job.req_id for job, _, _ in items if job.held)
            if len(items) < len(batch):
                return

    def _save(self, items: list[_Item], counted: set[int]) -> None:
        """Park ``items``, flush, count each outcome (its index into ``counted``)."""
        parked: list[tuple[int, SaveJob, float, int]] = []
        for i, (job, kv, handed) in enumerate(items):
            try:
                pages = kv if kv is not None else self.pool.source(job.block_ids)
                report = self.store.park(_conversation(job), pages)
            except Exception as e:  # never a failed request: the conversation is recomputed
                self.tally.drop("error")
                counted.add(i)
                log.warning("stratastore: park of request %s: %s", job.req_id, _said(e))
                continue
            if report.where == "discard":
                self.tally.drop("refused")
                counted.add(i)
            else:
                parked.append((i, job, handed, report.tokens))
        failed = self._flush() if parked else set()
        now, tb = time.perf_counter(), self.pool.fp.token_bytes
        for i, job, handed, tokens in parked:
            counted.add(i)
            if job.conv_id in failed or "*" in failed:
                self.tally.drop("write_failed")
                continue
            self.tally.add(parks=1, tokens_parked=tokens, bytes_park=tokens * tb)
            self.tally.time("park_seconds", now - handed)

    def _flush(self) -> set[str]:
        """Wait for the parks' writes; the conversations whose write did not land (``"*"``:
        the store could not say which)."""
        try:
            self.store.flush()
        except SpillError as e:
            log.warning("stratastore: %s", e)
            return {cid for cid, _ in e.failures}
        except StrataError as e:
            log.warning("stratastore: waiting for the parks' writes: %s", e)
            return {"*"}
        return set()


def _said(e: BaseException) -> Any:
    return str(e) if isinstance(e, StrataError) else f"{type(e).__name__}: {e}"
