"""The read agenda: every restore, alone or submitted with
others, runs through one pipeline, so the disk, the hashing threads and the copy never wait for
each other, between chunks of one restore or between requests.

For the chunks of jobs ``0..n-1``, in order (:meth:`~.two_pass.Job.chunks`):

- **read-ahead**: when job ``i``'s read pass starts, the first chunks of the segment files of
  the next ``readahead`` jobs are handed to the kernel (``posix_fadvise`` WILLNEED), so their
  cold reads run while job ``i`` is hashed and applied (within a segment, the read pass asks
  for the chunks ahead of the one it reads: :func:`~.reads.read_ahead`);
- **read pass** (a worker thread): the next chunks are read into memory the process owns
  (staging, or a ``read_direct`` destination itself) and validated there (``pread`` and BLAKE3
  on a thread pool, both release the GIL);
- **apply pass** (the calling thread): the validated chunk before them is copied into its
  destination (:class:`~.two_pass.Delivery`).

Each job keeps the contract of :mod:`.two_pass` (nothing applied that was not validated, never
anything past the prefix its outcome reports; damage ladders or raises for that job alone). The
hand-off queue holds ``DEPTH`` validated chunks, which bounds the staging in flight to
``DEPTH + 2`` chunks (one being read, one being applied) for a destination that can ``zero``
(every built-in one; one that cannot holds its chunks until no later damage can take them back).
A restore of one chunk runs inline, with no thread. An interrupted restore (Ctrl-C) waits for
its reads in flight, gives its staging back and delivers nothing.

**The continuous agenda** (:class:`SharedAgenda`, a store's ``batch_agenda``): the restores of
every thread join one read agenda. Its readers (at most :data:`READERS` threads, started as calls
come, kept across calls, ending after :data:`IDLE_S` idle) take the calls in the order they were
submitted, each
reading and validating one call's chunks into that call's own hand-off while the call applies
the chunks before them on its own thread; the read-ahead runs across calls (the files of the
next calls' first jobs are handed to the kernel while this one's are read), so the disk stays
busy from one call to the next. Each call keeps every guarantee above; a call no reader takes
within :data:`WAIT_S` runs on its own pipeline, and a call interrupted at any point delivers
nothing and holds no reader.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field

from stratastore.io.system import after_fork_in_child
from stratastore.restore.delivery import Delivery, release
from stratastore.restore.records import Chunk, Damage, Outcome
from stratastore.restore.two_pass import Job

__all__ = ["SHARED_READER", "Job", "SharedAgenda", "restore_batch"]

DEFAULT_READAHEAD = 2  #: jobs whose files are prefetched ahead of the one being validated
DEPTH = 2  #: validated chunks waiting for the apply pass
WAIT_S = 0.02  #: how long a call waits for a reader of the continuous agenda, at most
IDLE_S = 1.0  #: how long a reader of the continuous agenda waits for a call before it ends
_POLL_S = 0.05  #: how often a reader waiting for room in a hand-off looks at the call's stop
SHARED_READER = "strata-agenda-shared"  #: the name of the continuous agenda's reader threads
#: reader threads of the continuous agenda (each reads one call at a time): as many as an
#: engine has slots restoring at once, so the disk's queue is as deep as with a pipeline a call
READERS = 4

_Item = tuple[int, Chunk | Damage | BaseException | None]  #: None: the job's read pass ended


def restore_batch(
    jobs: Sequence[Job],
    *,
    readahead: int = DEFAULT_READAHEAD,
    shared: SharedAgenda | None = None,
) -> list[Outcome | Exception]:
    """Run ``jobs`` through one agenda (with ``shared``, through the continuous agenda of
    every thread's calls); returns, per job, its :class:`Outcome` or the exception it raised
    (a :class:`~.two_pass.RestoreFailed` or an I/O error of that job only: the others still
    complete). A destination too small for its job fails that job before any I/O."""
    if shared is not None:
        return shared.run(jobs)
    agenda = _Agenda(jobs)
    if agenda.one_chunk():
        agenda.inline(agenda.order[0])
    elif agenda.live:
        agenda.pipeline(readahead)
    return agenda.outcomes()


class _Agenda:
    """The jobs of one :func:`restore_batch`: a :class:`Delivery` for each job still running
    (``live``), and each job's result once it ended."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = jobs
        self.results: list[Outcome | Exception | None] = [None] * len(jobs)
        self.live: dict[int, Delivery] = {}
        for i, job in enumerate(jobs):
            try:
                job.check_capacity()
                self.live[i] = Delivery(job)
            except Exception as e:
                self.results[i] = e
        self.order = list(self.live)

    def one_chunk(self) -> bool:
        """Whether the agenda is one job of one chunk (run inline, with no thread)."""
        if len(self.live) != 1:
            return False
        job = self.jobs[self.order[0]]
        return job.nbytes() <= job.chunk_bytes

    def outcomes(self) -> list[Outcome | Exception]:
        """Each job's result (a job that never ran: an error saying so)."""
        return [
            r if r is not None else RuntimeError("restore job did not run") for r in self.results
        ]

    def inline(self, i: int) -> None:
        """Job ``i``'s passes one chunk after the other, on this thread."""
        try:
            try:
                with closing(self.jobs[i].chunks()) as chunks:
                    for item in chunks:
                        self.take(i, item)
                        if i not in self.live:
                            return
            except Exception as e:
                self.take(i, e)
            self.take(i, None)
        finally:
            self.abort_live()  # interrupted (a BaseException): the job delivers nothing

    def abort_live(self) -> None:
        """The jobs still running deliver nothing (the restore was interrupted)."""
        for i in list(self.live):
            self.live.pop(i).abort()

    def take(self, i: int, item: Chunk | Damage | BaseException | None) -> None:
        """Hand job ``i``'s next read-pass item (None: its read pass ended; an exception: it
        failed) to its delivery; a chunk of a job that already ended is released."""
        d = self.live.get(i)
        if d is None:
            if isinstance(item, Chunk):
                release(self.jobs[i], item)
            return
        try:
            if isinstance(item, BaseException):
                raise item
            if item is None:
                del self.live[i]
                self.results[i] = d.finish()
            else:
                d.take(item)
        except Exception as e:
            self.live.pop(i, None)
            self.results[i] = e
            try:
                d.abort()
            except Exception as again:  # the destination's zero() failed too: this job only
                e.add_note(f"and taking back what was written failed: {again!r}")

    def pipeline(self, readahead: int) -> None:
        """The read passes on a worker thread, the apply passes on this one, ``DEPTH`` chunks
        apart."""
        handoff: queue.Queue[_Item | None] = queue.Queue(maxsize=DEPTH)
        stop = threading.Event()

        def reader() -> None:
            try:
                self.read(handoff, stop, readahead)
            finally:
                self.hand(handoff, stop, None)

        worker = threading.Thread(target=reader, name="strata-agenda-read", daemon=True)
        self.apply(handoff, stop, worker.is_alive, worker.start)

    def read(
        self,
        handoff: queue.Queue[_Item | None],
        stop: threading.Event,
        readahead: int,
        after: Callable[[int], None] = lambda n: None,
    ) -> None:
        """The read passes of the jobs, in order, into ``handoff`` (on the reading thread),
        the files of the next ``readahead`` jobs handed to the kernel ahead of each;
        ``after(n)``: the read-ahead past the last job (``n`` jobs more), for the continuous
        agenda's next calls. Stops early when ``stop`` is set (what it read then is released)."""
        ahead = 0  # jobs of `order` whose files were handed to the kernel, each once
        for n, i in enumerate(self.order):
            while ahead < min(len(self.order), n + 1 + readahead):
                self.jobs[self.order[ahead]].prefetch()
                ahead += 1
            if n + 1 + readahead > len(self.order):
                after(n + 1 + readahead - len(self.order))
            try:
                with closing(self.jobs[i].chunks()) as chunks:
                    for item in chunks:
                        if not self.hand(handoff, stop, (i, item)):
                            return
                        if i not in self.live:  # the apply side failed it: no more
                            break
            except Exception as e:
                if not self.hand(handoff, stop, (i, e)):
                    return
                continue
            if not self.hand(handoff, stop, (i, None)):
                return

    def hand(
        self, handoff: queue.Queue[_Item | None], stop: threading.Event, item: _Item | None
    ) -> bool:
        """Put ``item`` on the hand-off, waiting for room only while the call is not stopped;
        a stopped call's chunk is given back here (its staging, and what a direct read placed
        zeroed), never applied. False once the call is stopped."""
        while not stop.is_set():
            try:
                handoff.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        if item is not None and isinstance(item[1], Chunk):
            release(self.jobs[item[0]], item[1])
        return False

    def prefetch_first(self, n: int) -> None:
        """Hand the files of the first ``n`` jobs to the kernel (the continuous agenda's
        read-ahead into the next call: advice only, so a failure there is no call's error)."""
        for i in self.order[:n]:
            try:
                self.jobs[i].prefetch()
            except Exception:  # the job's own read pass meets the file's trouble, if any
                continue

    def apply(
        self,
        handoff: queue.Queue[_Item | None],
        stop: threading.Event,
        reading: Callable[[], bool],
        start: Callable[[], None] = lambda: None,
    ) -> None:
        """``start()`` the reading, then the apply passes (on the calling thread) until the
        reader's end mark; interrupted (at any point after this is called), ``stop`` the reader
        and empty the hand-off until ``reading()`` says it stopped, giving back what it read
        (never applied: those jobs deliver nothing)."""
        try:
            start()
            while (got := handoff.get()) is not None:
                self.take(*got)
        finally:
            stop.set()
            while True:  # unblock a reader waiting on a full hand-off, then empty it
                alive = reading()  # before the get: a reader that stopped put all it will
                try:
                    left = handoff.get_nowait()
                except queue.Empty:
                    if not alive:
                        break
                    time.sleep(_POLL_S / 25)
                    continue
                if left is not None and isinstance(left[1], Chunk):
                    release(self.jobs[left[0]], left[1])  # never applied: deliver nothing
            self.abort_live()  # interrupted: those jobs deliver nothing


@dataclass(eq=False)
class _Call:
    """One call's jobs waiting for, or in, the continuous agenda's readers."""

    agenda: _Agenda
    handoff: queue.Queue[_Item | None] = field(default_factory=lambda: queue.Queue(maxsize=DEPTH))
    stop: threading.Event = field(default_factory=threading.Event)
    taken: threading.Event = field(default_factory=threading.Event)  #: a reader has it
    done: threading.Event = field(default_factory=threading.Event)  #: the reader is through


class SharedAgenda:
    """The continuous agenda (see the module): up to ``readers`` reader threads for the
    restores of every thread of a store, started as calls come; a reader idle for
    :data:`IDLE_S` ends, and :meth:`close` ends them all.

    Nothing waits on another call for long: a call that no reader takes within
    :data:`WAIT_S` (every reader busy with calls whose applies are slow, or that wait on this
    one) leaves the agenda and runs on its own pipeline, its files already handed to the kernel
    while it waited. A reader never blocks on a call that stopped (its hand-off is polled and
    the stopped call's chunks given back), so an interrupted call, however it was interrupted,
    never holds a reader. In a forked child the agenda starts afresh (the parent's readers are
    not there)."""

    def __init__(self, readahead: int = DEFAULT_READAHEAD, readers: int = READERS) -> None:
        self.readahead, self.readers = readahead, readers
        self._closed = False
        self._fresh()
        _AGENDAS.add(self)

    def _fresh(self) -> None:
        """No call and no reader (at open, and in a forked child)."""
        self._calls: deque[_Call] = deque()
        self._cond = threading.Condition()
        self._pool: set[threading.Thread] = set()
        self._busy = 0  #: calls a reader is reading now

    @property
    def reading(self) -> int:
        """The reader threads running now."""
        with self._cond:
            return len(self._pool)

    def run(self, jobs: Sequence[Job]) -> list[Outcome | Exception]:
        """:func:`restore_batch` through the shared readers: the same results, the same
        guarantees. After :meth:`close`, a call runs on its own pipeline."""
        agenda = _Agenda(jobs)
        if agenda.one_chunk():
            agenda.inline(agenda.order[0])
            return agenda.outcomes()
        if not agenda.live:
            return agenda.outcomes()
        call = _Call(agenda)

        def start() -> None:
            queued = self._enqueue(call)
            if queued and (call.taken.wait(WAIT_S) or not self._withdraw(call)):
                return  # a reader has it
            worker = threading.Thread(  # on its own pipeline: a reader thread of its own
                target=self._alone, args=(call,), name="strata-agenda-read", daemon=True
            )
            call.taken.set()
            try:
                worker.start()
            except BaseException:
                call.taken.clear()
                raise

        agenda.apply(call.handoff, call.stop, lambda: self._reading(call), start)
        return agenda.outcomes()

    def _alone(self, call: _Call) -> None:
        """A call's read passes on a thread of its own (it left the agenda, or it is closed)."""
        try:
            call.agenda.read(call.handoff, call.stop, self.readahead)
        finally:
            call.done.set()
            call.agenda.hand(call.handoff, call.stop, None)

    def _enqueue(self, call: _Call) -> bool:
        """Queue ``call`` and start a reader when every running one is busy and there are
        fewer than ``readers``; False when the agenda is closed (the call runs alone)."""
        with self._cond:
            if self._closed:
                return False
            self._calls.append(call)
            if len(self._pool) < min(self.readers, len(self._calls) + self._busy):
                reader = threading.Thread(target=self._read, name=SHARED_READER, daemon=True)
                try:
                    reader.start()
                except BaseException:
                    self._calls.remove(call)
                    raise
                self._pool.add(reader)
            self._cond.notify()
        return True

    def _withdraw(self, call: _Call) -> bool:
        """Take ``call`` off the agenda if no reader has taken it yet."""
        with self._cond:
            if call in self._calls:
                self._calls.remove(call)
                return True
        return False

    def _reading(self, call: _Call) -> bool:
        """Whether a reader may still put into ``call``'s hand-off; a call interrupted
        before its turn is taken off the agenda at once."""
        if self._withdraw(call):
            call.done.set()
        return call.taken.is_set() and not call.done.is_set()

    def close(self) -> None:
        """End the readers once the calls queued are read (idempotent)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            pool = list(self._pool)
        for reader in pool:
            if reader is not threading.current_thread():
                reader.join()

    def _read(self) -> None:
        """A reader thread: the next call waiting, in turn, its read-ahead running into the
        calls after it; it ends when the agenda closes or after :data:`IDLE_S` idle."""
        me = threading.current_thread()
        while True:
            with self._cond:
                if not self._calls and not self._closed:
                    self._cond.wait(IDLE_S)
                if not self._calls:
                    self._pool.discard(me)
                    return
                call = self._calls.popleft()
                call.taken.set()
                self._busy += 1
            try:
                if not call.stop.is_set():  # interrupted while it waited: skipped
                    call.agenda.read(call.handoff, call.stop, self.readahead, self._ahead)
            except BaseException as e:  # never leave a call waiting for its end mark
                call.agenda.hand(call.handoff, call.stop, (call.agenda.order[0], e))
            finally:
                with self._cond:
                    self._busy -= 1
                call.done.set()
                call.agenda.hand(call.handoff, call.stop, None)

    def _ahead(self, n: int) -> None:
        """Read-ahead into the calls waiting: the files of their first ``n`` jobs."""
        with self._cond:
            waiting = list(self._calls)
        for call in waiting:
            if n <= 0:
                return
            call.agenda.prefetch_first(n)
            n -= len(call.agenda.order)


#: every open agenda, reset in a forked child (whose threads are only the forking one)
_AGENDAS: weakref.WeakSet[SharedAgenda] = weakref.WeakSet()


def _after_fork() -> None:
    for agenda in list(_AGENDAS):
        agenda._fresh()


after_fork_in_child(_after_fork)
