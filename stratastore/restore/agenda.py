"""The read agenda: every restore, alone or submitted with
others, runs through one pipeline, so the disk, the hashing threads and the copy never wait for
each other, between chunks of one restore or between requests.

For the chunks of jobs ``0..n-1``, in order (:meth:`~.two_pass.Job.chunks`):

- **read-ahead**: when job ``i``'s read pass starts, the segment files of the next
  ``readahead`` jobs are handed to the kernel (``posix_fadvise`` WILLNEED), so their cold reads
  run while job ``i`` is hashed and applied;
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
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from contextlib import closing

from stratastore.restore.delivery import Delivery, release
from stratastore.restore.records import Chunk, Damage, Outcome
from stratastore.restore.two_pass import Job

__all__ = ["Job", "restore_batch"]

DEFAULT_READAHEAD = 2  #: jobs whose files are prefetched ahead of the one being validated
DEPTH = 2  #: validated chunks waiting for the apply pass

_Item = tuple[int, Chunk | Damage | BaseException | None]  #: None: the job's read pass ended


def restore_batch(
    jobs: Sequence[Job], *, readahead: int = DEFAULT_READAHEAD
) -> list[Outcome | Exception]:
    """Run ``jobs`` through one agenda; returns, per job, its :class:`Outcome` or the exception
    it raised (a :class:`~.two_pass.RestoreFailed` or an I/O error of that job only: the others
    still complete). A destination too small for its job fails that job before any I/O."""
    agenda = _Agenda(jobs)
    if (
        len(agenda.live) == 1
        and jobs[agenda.order[0]].nbytes() <= jobs[agenda.order[0]].chunk_bytes
    ):
        agenda.inline(agenda.order[0])
    elif agenda.live:
        agenda.pipeline(readahead)
    return [r if r is not None else RuntimeError("restore job did not run") for r in agenda.results]


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
                ahead = 0  # jobs of `order` whose files were handed to the kernel, each once
                for n, i in enumerate(self.order):
                    while ahead < min(len(self.order), n + 1 + readahead):
                        self.jobs[self.order[ahead]].prefetch()
                        ahead += 1
                    try:
                        with closing(self.jobs[i].chunks()) as chunks:
                            for item in chunks:
                                if stop.is_set():
                                    if isinstance(item, Chunk):
                                        release(self.jobs[i], item)
                                    return
                                handoff.put((i, item))
                                if i not in self.live:  # the apply side failed it: no more
                                    break
                    except Exception as e:
                        handoff.put((i, e))
                        continue
                    handoff.put((i, None))
            finally:
                handoff.put(None)

        worker = threading.Thread(target=reader, name="strata-agenda-read", daemon=True)
        worker.start()
        try:
            while (got := handoff.get()) is not None:
                self.take(*got)
        finally:
            stop.set()
            while True:  # unblock a reader waiting on a full hand-off, then empty it
                alive = worker.is_alive()  # before the get: a dead reader put all it will
                try:
                    left = handoff.get_nowait()
                except queue.Empty:
                    if not alive:
                        break
                    worker.join(0.01)
                    continue
                if left is not None and isinstance(left[1], Chunk):
                    release(self.jobs[left[0]], left[1])  # never applied: deliver nothing
            self.abort_live()  # interrupted: those jobs deliver nothing
