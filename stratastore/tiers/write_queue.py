"""The write queue: the one owner of a store's disk writes below the facade (spec F-DUR).

A park is *placed* under the flow's lock (:meth:`.park.Parking.park`): what it acknowledges for
a later disk write is offered to the :attr:`WriteQueue.outbox` there (its bytes reserved, its
capture readable by restores), and the call's :class:`~.records.Placement` carries it. The
placement is then *submitted* here once, without the flow's lock, whoever made it: a park, a
restore from the remote level that keeps a local copy, or close writing down the RAM level.
:meth:`WriteQueue.submit` hands its writes to one background thread through a bounded queue (a
full queue blocks only the submitting thread: back-pressure, never the writer) and then runs
its streamed write, if it has one, on the caller's thread (a park written from the engine's
memory within its call).

The queue owns what the writes share: the outbox, the thread and its queue, the count of
submissions still handing writes over, the errors and its own counts. It has its own lock,
never held over a write or a blocking put, so neither the spill thread nor a submitting
thread takes the flow's lock for it. :meth:`stop` waits on its condition (no poll) until every
submission has handed its writes over, then until the queue is written.

Errors belong to the call that caused them: a write that fails in the background is recorded
and counted (``spill_errors``) and raised as a :class:`SpillError` by the engine's next
``flush()`` or ``close()``, never by an unrelated lookup or restore.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from stratastore.errors import StrataError
from stratastore.metrics.counts import Counts
from stratastore.tiers.outbox import Outbox
from stratastore.tiers.records import ParkReport, Placement, Snapshot

__all__ = ["SpillError", "WriteQueue"]

_STOP = object()


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

    def __init__(self, model: bytes, flow_lock: AbstractContextManager[Any]) -> None:
        #: the acknowledged parks not written yet; guarded by the flow's lock (reservations
        #: are part of the flow's plans), read by restores (parks in flight)
        self.outbox = Outbox(model)
        self._flow_lock = flow_lock  #: taken only to give back writes a hand-over did not queue
        self.counts = Counts("spill writer", ("spill_queue_waits", "spill_errors"))
        self._cv = threading.Condition()  #: the queue's own: hand-overs, errors, counts
        self._handing = 0  #: submissions whose writes are not queued yet
        self._errors: list[tuple[str, BaseException]] = []
        self._queue: queue.Queue[object] | None = None
        self._thread: threading.Thread | None = None
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

    def submit(self, placement: Placement) -> ParkReport | None:
        """Hand ``placement``'s writes to the writer thread, then run its streamed write (on
        this thread); a park's report once it landed. Called without the flow's lock: a full queue
        blocks only this caller. A streamed write not started because the hand-over failed is
        cancelled (its reservation given back)."""
        if placement.writes:
            with self._cv:
                self._handing += 1
            try:
                self._put(placement.writes)
            except BaseException:
                if placement.cancel is not None:
                    placement.cancel()
                raise
            finally:
                with self._cv:
                    self._handing -= 1
                    self._cv.notify_all()
        return placement.report if placement.stream is None else placement.stream()

    def _put(self, snaps: list[Snapshot]) -> None:
        """Queue ``snaps`` in order; interrupted (Ctrl-C while the queue is full, or any
        error), those not queued go back to the outbox, so the next flush or close writes
        them: an acknowledged write is never dropped on the way."""
        assert self._queue is not None, "a placement with deferred writes before start()"
        queued = 0
        try:
            for snap in snaps:
                if self._queue.full():
                    with self._cv:
                        self.counts["spill_queue_waits"] += 1
                self._queue.put(snap)
                queued += 1
        except BaseException:
            with self._flow_lock:
                self.outbox.give_back(snaps[queued:])
            raise

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
        condition), write what is queued, then end the thread."""
        self.settle()
        if self._queue is None or self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
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


def _not_started(snap: Snapshot) -> None:
    raise AssertionError(f"a deferred write of {snap.conv.conv_id!r} before the queue started")
