"""The write queue: the one owner of a store's disk writes below the facade (spec F-DUR).

A park is *placed* under the flow's lock (:meth:`.park.Parking.park`): what it acknowledges for
a later disk write is offered to the :attr:`WriteQueue.outbox` there (its bytes reserved, its
capture readable by restores) and waits there. A *hand-over* (:meth:`WriteQueue.submit`,
without the flow's lock) takes every write the outbox holds, whoever placed it (a park, a
restore from the remote level that keeps a local copy, close writing down the RAM level, a call
interrupted before its own hand-over), and hands them to one background thread through a
bounded queue (a full queue blocks only the submitting thread: back-pressure, never the
writer); a park's streamed write, if it has one, then runs on the caller's thread (a park
written from the engine's memory within its call).

Interrupt-safe by construction: an acknowledged write leaves the outbox only inside
:meth:`WriteQueue.submit`, which gives back what it took and did not queue, whatever stops it
(Ctrl-C while the queue is full, any error). A call stopped anywhere before that leaves its
writes in the outbox for the next flush or close.

The queue performs the store's other durable writes too, in the same order on the same thread:
a session save and a system-prompt-cache fill (:meth:`WriteQueue.perform`: its caller waits
for it, durable when it returns).

The queue owns what the writes share: the outbox, the thread and its queue, the count of
submissions still handing writes over, the errors and its own counts. It has its own lock,
never held over a write or a blocking put, and a hand-over takes the outbox's waiting writes
under that list's own lock, so neither the spill thread nor a submitting thread takes the
flow's lock for the queue. :meth:`stop` waits on its condition (no
poll) until every submission has handed its writes over, then until the queue is written.

Errors belong to the call that caused them: a write that fails in the background is recorded
and counted (``spill_errors``) and raised as a :class:`SpillError` by the engine's next
``flush()`` or ``close()``, never by an unrelated lookup or restore.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar, cast

from stratastore.errors import StrataError
from stratastore.metrics.counts import Counts
from stratastore.tiers.outbox import Outbox
from stratastore.tiers.records import ParkReport, Placement, Snapshot

__all__ = ["SpillError", "WriteQueue"]

_STOP = object()

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Job:
    """A durable write that is no park's: ``run`` on the writer thread in its turn; its result
    or error to ``done`` (the caller waits on it)."""

    run: Callable[[], object]
    done: Future[object]


class SpillError(StrataError):
    """Acknowledged parks whose disk write did not land (spec F-DUR: not durable).

    ``failures`` holds ``(conversation id, cause)`` for each; raised by :meth:`Store.flush` or
    :meth:`Store.close`, the first cause chained. The K/V can be recomputed: keep serving, and
    fix the cause (the disk, or the level's budget)."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        self.failures = failures
        shown = "; ".join(f"conversation {cid!r}: {cause}" for cid, cause in failures[:5])
        more = f" (and {len(failures) - 5} more)" if len(failures) > 5 else ""
        super().__init__(
            f"{len(failures)} disk write(s) of acknowledged parks did not land: {shown}{more}; "
            "they are not on disk (the engine recomputes them on a miss); fix the cause (the "
            "disk, or raise the level's budget)"
        )


class WriteQueue:
    """The writes of one store (see the module). ``model``: the fingerprint's digest (the
    outbox indexes captures under it). Until :meth:`start`, nothing is deferred: a park's disk
    write happens within its placement (a store's flow used on its own, as tests do)."""

    def __init__(self, model: bytes) -> None:
        #: the acknowledged parks not written yet; guarded by the flow's lock (reservations
        #: are part of the flow's plans; its list of writes waiting for a hand-over has a lock
        #: of its own), read by restores (parks in flight)
        self.outbox = Outbox(model)
        self.counts = Counts("spill writer", ("spill_queue_waits", "spill_errors"))
        self._cv = threading.Condition()  #: the queue's own: hand-overs, errors, counts
        self._handing = 0  #: submissions whose writes are not queued yet
        self._errors: list[tuple[str, BaseException]] = []
        self._queue: queue.Queue[object] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False  #: the thread was told to end (after what is queued)
        #: one disk write, on the writer thread (set by :meth:`start`)
        self.write: Callable[[Snapshot], None] = _not_started
        self._after_write: Callable[[], object] = lambda: None

    @property
    def deferred(self) -> bool:
        """Whether disk writes of parks wait for the writer thread (after :meth:`start`)."""
        return self._thread is not None

    def start(
        self, depth: int, write: Callable[[Snapshot], None], after_write: Callable[[], object]
    ) -> None:
        """From now on, writes are deferred to one thread over a queue of ``depth``;
        ``write(snap)`` writes one down (a failure is recorded for the next flush or close),
        ``after_write()`` runs after each, on that thread."""
        self.write, self._after_write = write, after_write
        self._queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._drain, name="strata-spill", daemon=True)
        self._thread.start()

    def submit(self, placement: Placement | None = None) -> ParkReport | None:
        """Hand every write waiting in the outbox to the writer thread, then run
        ``placement``'s streamed write (on this thread); a park's report once it landed
        (``None`` without a placement). Called without the flow's lock: a full queue blocks
        only this caller."""
        with self._cv:
            self._handing += 1
        try:
            self._hand_over()
        finally:
            with self._cv:
                self._handing -= 1
                self._cv.notify_all()
        if placement is None:
            return None
        return placement.report if placement.stream is None else placement.stream()

    def _hand_over(self) -> None:
        """Take the outbox's writes and queue them in order; interrupted (Ctrl-C while the
        queue is full, or any error), those not queued go back to the outbox, first, so the
        next flush or close writes them: an acknowledged write is never dropped on the way."""
        if not self.deferred or not self.outbox.waiting:  # (before start, a park's disk write
            # happens in its placement; an empty outbox is read without the lock: whatever a
            # call offers, that call's own hand-over takes, so none is missed)
            return
        assert self._queue is not None
        snaps: list[Snapshot] = []
        queued = 0
        try:
            snaps = self.outbox.take()  # (the list's own lock: never the flow's)
            for snap in snaps:
                if self._queue.full():
                    with self._cv:
                        self.counts["spill_queue_waits"] += 1
                self._queue.put(snap)
                queued += 1
        except BaseException:
            if queued < len(snaps):
                self.outbox.give_back(snaps[queued:])
            raise

    def perform(self, write: Callable[[], T]) -> T:
        """Run ``write`` on the writer thread, behind the writes queued before it, and return
        its result (or raise its error) to this caller: a durable write the call waits for
        (a session save). Before :meth:`start`, on this thread. A Ctrl-C while this waits
        leaves the write to land or fail in the background (never acknowledged)."""
        if not self.deferred:
            return write()
        done: Future[object] = Future()
        self._put_job(_Job(write, done))
        return cast(T, done.result())

    def _put_job(self, job: _Job) -> None:
        """Queue ``job`` as a hand-over (flush and close wait for it; a full queue blocks only
        this caller)."""
        assert self._queue is not None
        with self._cv:
            self._handing += 1
        try:
            self._queue.put(job)
        finally:
            with self._cv:
                self._handing -= 1
                self._cv.notify_all()

    @property
    def waiting(self) -> int:
        """Writes queued and not taken by the writer yet."""
        return 0 if self._queue is None else self._queue.qsize()

    def join(self) -> None:
        """Wait until every write queued so far is done (landed or recorded)."""
        if self._queue is not None:
            self._queue.join()

    def settle(self) -> None:
        """Wait until every submission has handed its writes over (on the queue's condition),
        then until they are done: what ``flush()`` waits for."""
        with self._cv:
            self._cv.wait_for(lambda: self._handing == 0)
        self.join()

    def record(self, what: str, e: BaseException) -> None:
        """A write that did not land, for the next :meth:`raise_errors`."""
        with self._cv:
            self.counts["spill_errors"] += 1
            self._errors.append((what, e))

    def raise_errors(self) -> None:
        """Raise :class:`SpillError` for the failures not reported yet (each reported once)."""
        with self._cv:
            failures, self._errors = self._errors, []
        if failures:
            raise SpillError(failures) from failures[0][1]

    def stop(self) -> None:
        """After every submission has handed its writes over (waited on the queue's
        condition), write what is queued, then end the thread. Interrupted (Ctrl-C while it
        waits), the writer goes on and a later call resumes the wait."""
        self.settle()
        if self._queue is None or self._thread is None:
            return
        if not self._stopping:
            self._queue.put(_STOP)
            self._stopping = True
        self._thread.join()

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if isinstance(item, _Job):
                    self._run(item)
                    continue
                assert isinstance(item, Snapshot)
                try:
                    self.write(item)
                except Exception as e:  # for the engine's next flush() or close()
                    self.record(item.conv.conv_id, e)
                self._after_write()
            finally:
                # nothing of a written snapshot outlives its write (a capture held until the
                # next park would stay resident after flush())
                item = None
                self._queue.task_done()

    def _run(self, job: _Job) -> None:
        """One job on the writer thread: its result or error to its caller."""
        try:
            got = job.run()
        except Exception as e:
            job.done.set_exception(e)
            return
        job.done.set_result(got)


def _not_started(snap: Snapshot) -> None:
    raise AssertionError(f"a deferred write of {snap.conv.conv_id!r} before the queue started")
