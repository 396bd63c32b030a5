"""The write queue: the one owner of a store's disk writes below the facade (spec F-DUR).

A park is *placed* under the flow's lock (:meth:`.park.Parking.park`): what it acknowledges for
a later disk write is offered to the :attr:`WriteQueue.outbox` there (its bytes reserved, its
capture readable by restores) and waits there until the writer thread takes it. A *hand-over*
(:meth:`WriteQueue.submit`, without the flow's lock) wakes that thread: it puts one token on a
bounded queue for each write waiting (a full queue blocks only the submitting thread:
back-pressure, never the writer), and the thread, for each token, takes the oldest write
waiting and writes it down. Whoever placed the write (a park, a restore from the remote level
that keeps a local copy, close writing down the RAM level) is the same to the thread. A park's
streamed write, if it has one, then runs on the caller's thread (a park written from the
engine's memory within its call).

Interrupt-safe by construction: an acknowledged write leaves the outbox only on the writer
thread, and a Ctrl-C (``KeyboardInterrupt``) is only ever raised on the main thread. A call
stopped anywhere (before its hand-over, in it, while the queue is full) leaves its writes in
the outbox; a lost token only delays them, and a token too many finds nothing. A flush or close
puts a *drain* token, which takes every write still waiting, and waits for the queue to be done.

The queue performs the store's other durable writes too, in the same order on the same thread:
a session save and a system-prompt-cache fill (:meth:`WriteQueue.perform`: its caller waits
for it, durable when it returns).

The queue owns what the writes share: the outbox, the thread and its queue, the errors and its
own counts (under a lock of its own, never held over a write or a blocking put). No part of it
takes the flow's lock: the outbox's list of waiting writes has a lock of its own.

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

_STOP = object()  #: the thread ends
_ONE = object()  #: the thread takes the oldest write waiting in the outbox and writes it
_DRAIN = object()  #: the thread takes every write waiting in the outbox and writes them

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
        #: are part of the flow's plans; its list of writes waiting for the thread has a lock
        #: of its own), read by restores (parks in flight)
        self.outbox = Outbox(model)
        self.counts = Counts("spill writer", ("spill_queue_waits", "spill_errors"))
        self._lock = threading.Lock()  #: the queue's own: errors, counts, tokens
        #: tokens for one write on the queue, not taken by the thread yet (a count a Ctrl-C can
        #: leave one short: a token too many finds nothing, one too few waits for the next)
        self._tokens = 0
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
        """Wake the writer thread for the writes waiting in the outbox (a token each, beyond the
        tokens already queued), then run ``placement``'s streamed write (on this thread); a
        park's report once it landed (``None`` without a placement). Called without the flow's
        lock: a full queue blocks only this caller."""
        if self._queue is not None:  # a token for each write waiting beyond those queued
            while self.outbox.waiting > self._tokens:
                self._put(_ONE)
                with self._lock:
                    self._tokens += 1
        if placement is None:
            return None
        return placement.report if placement.stream is None else placement.stream()

    def _put(self, item: object) -> None:
        """Put ``item`` on the queue, counting a wait for a full one."""
        assert self._queue is not None
        if self._queue.full():
            with self._lock:
                self.counts["spill_queue_waits"] += 1
        self._queue.put(item)

    def perform(self, write: Callable[[], T]) -> T:
        """Run ``write`` on the writer thread, behind the writes queued before it, and return
        its result (or raise its error) to this caller: a durable write the call waits for
        (a session save). Before :meth:`start`, on this thread. A Ctrl-C while this waits
        leaves the write to land or fail in the background (never acknowledged)."""
        return cast(T, self.enqueue(write).result())

    def enqueue(self, write: Callable[[], object]) -> Future[object]:
        """Queue ``write`` for the writer thread (as :meth:`perform`) and return the future of
        its result without waiting; once this returned, it runs. Before :meth:`start`, it runs
        on this thread now."""
        done: Future[object] = Future()
        if not self.deferred:
            _run(write, done)
        else:
            self._put(_Job(write, done))
        return done

    @property
    def waiting(self) -> int:
        """Writes queued and not taken by the writer yet."""
        return 0 if self._queue is None else self._queue.qsize()

    def join(self) -> None:
        """Wait until every write queued so far is done (landed or recorded)."""
        if self._queue is not None:
            self._queue.join()

    def settle(self) -> None:
        """Have the writer thread take every write still waiting in the outbox, and wait until
        everything queued is done: what ``flush()`` waits for."""
        if self._queue is not None:
            self._put(_DRAIN)
        self.join()

    def record(self, what: str, e: BaseException) -> None:
        """A write that did not land, for the next :meth:`raise_errors`."""
        with self._lock:
            self.counts["spill_errors"] += 1
            self._errors.append((what, e))

    def raise_errors(self) -> None:
        """Raise :class:`SpillError` for the failures not reported yet (each reported once)."""
        with self._lock:
            failures, self._errors = self._errors, []
        if failures:
            raise SpillError(failures) from failures[0][1]

    def stop(self) -> None:
        """Write every write waiting (:meth:`settle`), then end the thread. Interrupted (Ctrl-C
        while it waits), the writer goes on and a later call resumes the wait."""
        self.settle()
        if self._queue is None or self._thread is None:
            return
        if not self._stopping:
            self._put(_STOP)
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
                    _run(item.run, item.done)
                elif item is _ONE:
                    with self._lock:
                        self._tokens = max(0, self._tokens - 1)
                    self._write(self.outbox.take(1))
                else:
                    assert item is _DRAIN
                    self._write(self.outbox.take())
            finally:
                self._queue.task_done()

    def _write(self, snaps: list[Snapshot]) -> None:
        """Write ``snaps`` down in order, on the writer thread; a failure is recorded for the
        engine's next flush() or close()."""
        while snaps:
            snap = snaps.pop(0)  # nothing of a written snapshot outlives its write (a capture
            # held until the next park would stay resident after flush())
            try:
                self.write(snap)
            except Exception as e:
                self.record(snap.conv.conv_id, e)
            del snap
            self._after_write()


def _run(write: Callable[[], object], done: Future[object]) -> None:
    """Run a job: its result or error to ``done`` (whatever it raises: its caller never waits
    forever)."""
    try:
        got = write()
    except BaseException as e:
        done.set_exception(e)
        return
    done.set_result(got)


def _not_started(snap: Snapshot) -> None:
    raise AssertionError(f"a deferred write of {snap.conv.conv_id!r} before the queue started")
