"""The vLLM tier's transfers between vLLM's CPU primary tier and the chunk store, on the tier's
own threads (no vLLM import here: the tier hands in keys, slot numbers and the primary tier's
memory).

Contracts (vLLM's ``SecondaryTierManager``, ``tiering/base.py``):

- **Nothing on the caller's thread but bookkeeping.** :meth:`TierJobs.store` and
  :meth:`TierJobs.load` queue a job and return; the reads, the BLAKE3 hashing and the durable
  writes run on ``store_threads`` / ``load_threads`` threads (a job is split into parts so a
  large one uses them all). :meth:`TierJobs.finished` hands back what completed.
- **Stores.** Chunks are written from their primary slots (pinned by vLLM for the job) with
  :meth:`~stratastore.chunks.ChunkStore.put_many`, :data:`STORE_GROUP` at a time a thread: each
  chunk's files written and fsynced, then the group committed together (one group commit of
  the directory, spec F-DUR-2), durable when it returns; a chunk held already is not written
  again. A job succeeds when every chunk is stored or present; a job reported successful is
  durable. **Backpressure**: a store job that would put more than ``max_pending`` chunks in the
  queue is not queued but fails at once (counted in ``stores_dropped`` and
  ``chunks_dropped``): the scheduler never waits on the tier.
- **Loads** read each chunk straight into its primary slot, with its data file's header in one
  read (past the page cache when the chunk is not in it), and validate it there (every 1 MiB
  page BLAKE3-checked in that memory, F-SC-3). A chunk that is missing, damaged (counted in
  the store's ``damaged``, removed from its level), of another size or unreadable fails: its
  slot is zeroed (no byte that failed validation stays in primary memory) and the chunks of the
  job after it are not loaded. The job's ``loaded`` keys are the ones
  before the first failure, in job order (a request's prefix order): vLLM keeps those and
  recomputes the rest.
- **Shutdown** (:meth:`TierJobs.close`): jobs not yet started fail; the caller waits for those
  in progress up to a timeout, so the store closes with every acknowledged write durable."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from stratastore.chunks import ChunkStore
from stratastore.chunks.store import PutOutcome
from stratastore.errors import StrataError

__all__ = ["Finished", "TierCounters", "TierJobs"]

log = logging.getLogger("stratastore.adapters.vllm.tier")

#: chunks a store thread puts together (each written and fsynced, then one group commit of the
#: directory: spec F-DUR-2); more hold the directory's lock less often, fewer free room sooner
STORE_GROUP = 32


@dataclass(slots=True)
class TierCounters:
    """What the tier counts (this process, since the last :meth:`take`)."""

    loads: int = 0  #: chunks loaded into primary slots, validated
    load_bytes: int = 0
    load_seconds: float = 0.0
    load_failures: int = 0  #: chunks not loaded (missing, damaged, unreadable)
    stores: int = 0  #: chunks written (durably) to the first level
    stores_present: int = 0  #: chunks a store found held already
    store_bytes: int = 0
    store_seconds: float = 0.0
    store_failures: int = 0  #: chunks a store could not write (refused, an I/O error)
    stores_dropped: int = 0  #: store jobs dropped by backpressure
    chunks_dropped: int = 0  #: their chunks
    hits_by_level: dict[int, int] = field(default_factory=dict)  #: loads by level index

    def take(self) -> TierCounters:
        """A copy of the counts, and zero them."""
        out = replace(self, hits_by_level=dict(self.hits_by_level))
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())
        return out


@dataclass(frozen=True, slots=True)
class Finished:
    """A job that completed: ``success`` (every chunk stored or loaded); for a load, ``loaded``
    the keys before its first failure (job order); ``seconds`` from submit to completion;
    ``nbytes`` the bytes moved."""

    job_id: int
    is_load: bool
    success: bool
    keys: tuple[bytes, ...]
    loaded: tuple[bytes, ...] = ()
    seconds: float = 0.0
    nbytes: int = 0


class _Job:
    """One job's state while its parts run (guarded by :attr:`TierJobs._lock`)."""

    __slots__ = ("chunk_ids", "failed", "first_fail", "is_load", "job_id", "keys", "nbytes",
                 "parts_left", "started")  # fmt: skip

    def __init__(self, job_id: int, is_load: bool, keys: Sequence[bytes], ids: Sequence[int]):
        self.job_id = job_id
        self.is_load = is_load
        self.keys = tuple(keys)
        self.chunk_ids = tuple(int(c) for c in ids)
        self.first_fail = len(self.keys)  #: the first chunk that failed (loads)
        self.failed = False
        self.parts_left = 0
        self.nbytes = 0
        self.started = time.monotonic()


class _Workers:
    """``n`` daemon threads running queued callables; :meth:`cancel_queued` hands back those
    not started."""

    def __init__(self, n: int, name: str) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def put(self, run: Callable[[], None], cancel: Callable[[], None]) -> None:
        self._q.put((run, cancel))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            item[0]()

    def cancel_queued(self) -> None:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                item[1]()

    def stop(self, timeout_s: float) -> bool:
        """Ask every thread to stop once the queue is empty; True when all ended in time."""
        for _ in self._threads:
            self._q.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)


class TierJobs:
    """The transfers of one tier (the module docstring is the contract). ``rows``: the primary
    tier's memory, one row a slot; ``chunk_key``: vLLM's key -> the chunk key."""

    def __init__(
        self,
        store: ChunkStore,
        rows: memoryview,
        chunk_key: Callable[[bytes], bytes],
        *,
        store_threads: int,
        load_threads: int,
        max_pending: int,
    ) -> None:
        self.chunks = store
        # one flat byte view: a 2-D memoryview cannot be indexed by row
        self._row_bytes = int(rows.strides[0]) if rows.ndim > 1 and rows.strides else rows.nbytes
        self._flat = rows.cast("B") if rows.ndim > 1 or rows.format != "B" else rows
        self._key = chunk_key
        self._max_pending = max_pending
        self._store_threads = store_threads
        self._load_threads = load_threads
        self.counters = TierCounters()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jobs: dict[int, _Job] = {}
        self._done: list[Finished] = []
        self._storing: dict[bytes, int] = {}  #: vLLM keys with a store in flight
        self._pending_store_chunks = 0
        self._closing = False
        self._stores = _Workers(store_threads, "strata-tier-store")
        self._loads = _Workers(load_threads, "strata-tier-load")

    # -- the scheduler's side ---------------------------------------------------------------
    def storing(self, key: bytes) -> bool:
        """Whether a store of ``key`` (vLLM's key) is queued or in progress."""
        with self._lock:
            return key in self._storing

    def store(self, job_id: int, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> bool:
        """Queue a store job; False when backpressure dropped it (it then fails at once)."""
        job = _Job(job_id, False, keys, chunk_ids)
        with self._lock:
            if self._closing or self._pending_store_chunks + len(job.keys) > self._max_pending:
                self.counters.stores_dropped += 1
                self.counters.chunks_dropped += len(job.keys)
                self._done.append(Finished(job_id, False, False, job.keys))
                return False
            self._pending_store_chunks += len(job.keys)
            for k in job.keys:
                self._storing[k] = self._storing.get(k, 0) + 1
        self._start(job, self._stores, self._store_threads, self._store_part)
        return True

    def load(self, job_id: int, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> None:
        """Queue a load job into the primary slots ``chunk_ids``."""
        job = _Job(job_id, True, keys, chunk_ids)
        with self._lock:
            if self._closing:
                self._done.append(Finished(job_id, True, False, job.keys))
                return
        self._start(job, self._loads, self._load_threads, self._load_part)

    def refuse(self, job_id: int, is_load: bool, keys: Sequence[bytes]) -> None:
        """Fail a job at once (nothing queued, nothing counted)."""
        with self._lock:
            self._done.append(Finished(job_id, is_load, False, tuple(keys)))

    def take_counters(self) -> TierCounters:
        """The counts since the last call."""
        with self._lock:
            return self.counters.take()

    def finished(self) -> list[Finished]:
        """The jobs completed since the last call."""
        with self._lock:
            out, self._done = self._done, []
        return out

    def busy(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def drain(self) -> None:
        """Block until every job submitted has completed (its result kept for
        :meth:`finished`)."""
        with self._idle:
            self._idle.wait_for(lambda: not self._jobs)

    def close(self, timeout_s: float) -> bool:
        """Fail the jobs not started, wait up to ``timeout_s`` for those in progress and stop
        the threads; True when nothing is left running (the caller may then close the store)."""
        with self._lock:
            self._closing = True
        self._stores.cancel_queued()
        self._loads.cancel_queued()
        deadline = time.monotonic() + timeout_s
        with self._idle:
            self._idle.wait_for(lambda: not self._jobs, timeout=timeout_s)
        left = max(0.0, deadline - time.monotonic())
        stopped = self._stores.stop(left) & self._loads.stop(left) and not self.busy()
        if stopped:  # nothing reads or writes the primary tier now: let its memory go
            self._flat.release()
        return stopped

    # -- the threads' side ------------------------------------------------------------------
    def _start(
        self,
        job: _Job,
        workers: _Workers,
        threads: int,
        part: Callable[[_Job, range], None],
    ) -> None:
        n = len(job.keys)
        if n == 0:
            self._finish(job)
            return
        per = -(-n // max(1, min(threads, n)))
        spans = [range(i, min(n, i + per)) for i in range(0, n, per)]
        with self._lock:
            job.parts_left = len(spans)
            self._jobs[job.job_id] = job
        for span in spans:
            workers.put(
                lambda s=span: self._run_part(job, part, s),  # type: ignore[misc]
                lambda s=span: self._cancel_part(job, s),  # type: ignore[misc]
            )

    def _run_part(self, job: _Job, part: Callable[[_Job, range], None], span: range) -> None:
        try:
            part(job, span)
        except BaseException as e:  # never lose a part: the job would never finish
            log.error("stratastore vLLM tier: job %d failed: %s", job.job_id, e)
            with self._lock:
                job.failed = True
                job.first_fail = min(job.first_fail, span.start)
        finally:
            self._part_done(job, span)

    def _cancel_part(self, job: _Job, span: range) -> None:
        with self._lock:
            job.failed = True
            job.first_fail = min(job.first_fail, span.start)
        self._part_done(job, span)

    def _part_done(self, job: _Job, span: range) -> None:
        with self._lock:
            if not job.is_load:
                self._pending_store_chunks -= len(span)
                for i in span:
                    k = job.keys[i]
                    left = self._storing[k] - 1
                    if left:
                        self._storing[k] = left
                    else:
                        del self._storing[k]
            job.parts_left -= 1
            if job.parts_left:
                return
        self._finish(job)

    def _finish(self, job: _Job) -> None:
        seconds = time.monotonic() - job.started
        loaded = job.keys[: job.first_fail] if job.is_load else ()
        result = Finished(
            job.job_id, job.is_load, not job.failed, job.keys, loaded, seconds, job.nbytes
        )
        with self._idle:
            if job.is_load:
                self.counters.load_seconds += seconds
            else:
                self.counters.store_seconds += seconds
            self._done.append(result)
            self._jobs.pop(job.job_id, None)
            self._idle.notify_all()

    def _store_part(self, job: _Job, span: range) -> None:
        for start in range(span.start, span.stop, STORE_GROUP):
            part = range(start, min(span.stop, start + STORE_GROUP))
            rows = [self._row(job.chunk_ids[i]) for i in part]
            try:
                outcomes = self.chunks.put_many([self._key(job.keys[i]) for i in part], rows)
            except StrataError as e:  # a closed store: nothing of the part was put
                log.warning("stratastore vLLM tier: chunks were not stored: %s", e)
                outcomes = [e] * len(part)
            for row, outcome in zip(rows, outcomes, strict=True):
                self._stored(job, row, outcome)

    def _stored(self, job: _Job, row: memoryview, outcome: PutOutcome | StrataError) -> None:
        if isinstance(outcome, StrataError):
            log.warning("stratastore vLLM tier: a chunk was not stored: %s", outcome)
        with self._lock:
            if outcome == "stored":
                self.counters.stores += 1
                self.counters.store_bytes += row.nbytes
                job.nbytes += row.nbytes
            elif outcome == "present":
                self.counters.stores_present += 1
            else:
                self.counters.store_failures += 1
                job.failed = True

    def _load_part(self, job: _Job, span: range) -> None:
        for i in span:
            with self._lock:
                if i > job.first_fail:
                    return  # a chunk before it failed: the rest of the job is not loaded
            row = self._row(job.chunk_ids[i])
            level = self._load_one(self._key(job.keys[i]), row)
            with self._lock:
                if level is None:
                    self.counters.load_failures += 1
                    job.failed = True
                    job.first_fail = min(job.first_fail, i)
                else:
                    self.counters.loads += 1
                    self.counters.load_bytes += row.nbytes
                    self.counters.hits_by_level[level] = (
                        self.counters.hits_by_level.get(level, 0) + 1
                    )
                    job.nbytes += row.nbytes

    def _row(self, chunk_id: int) -> memoryview:
        """Primary slot ``chunk_id`` (vLLM's chunk id: a row of its CPU tier)."""
        start = chunk_id * self._row_bytes
        if not 0 <= start < self._flat.nbytes:
            raise IndexError(f"primary slot {chunk_id} is outside the primary tier")
        return self._flat[start : start + self._row_bytes]

    def _load_one(self, ckey: bytes, row: memoryview) -> int | None:
        """Read the chunk into ``row``, validated there: the level it came from, or None (the
        row then zeroed)."""
        chunk = self.chunks.open_chunk(ckey)
        ok = False
        if chunk is not None:
            if chunk.payload_bytes != row.nbytes:
                self.chunks.reject(
                    chunk, f"{chunk.payload_bytes} bytes, a primary slot holds {row.nbytes}"
                )
            else:
                ok = self.chunks.read_into(chunk, row)
        if ok and chunk is not None:
            return chunk.level
        if chunk is not None:
            np.frombuffer(row, dtype=np.uint8)[:] = 0
        return None
