"""The batched read agenda (seed 000 item 7, issue 5): restores submitted together share one
pipeline, so the disk, the hashing threads and the copy never wait for each other between
requests.

For jobs ``0..n-1``, in order:

- **read-ahead**: when job ``i``'s read pass starts, the segment files of the next
  ``readahead`` jobs are handed to the kernel (``posix_fadvise`` WILLNEED), so their cold reads
  run while job ``i`` is hashed and applied;
- **read pass** (a worker thread): job ``i``'s pages are read into memory the process owns
  (staging, or a ``read_direct`` destination itself) and validated there (``pread`` and BLAKE3
  on a thread pool, both release the GIL);
- **apply pass** (the calling thread): job ``i-1``'s validated pages are copied into its
  destination while job ``i`` is being validated.

Each job keeps the two-pass contract of :mod:`.two_pass` unchanged (nothing is applied before
its whole prefix was validated; damage ladders or raises for that job alone). The hand-off
queue holds one validated job, which bounds the memory held ahead of the copy (one job's staged
or decompressed pages). One job runs inline, with no thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from .two_pass import Job, Outcome, Validated

__all__ = ["Job", "restore_batch"]

DEFAULT_READAHEAD = 2  #: jobs whose files are prefetched ahead of the one being validated


def restore_batch(jobs: Sequence[Job], *, readahead: int = DEFAULT_READAHEAD
                  ) -> list[Outcome | Exception]:  # fmt: skip
    """Run ``jobs`` through one agenda; returns, per job, its :class:`Outcome` or the exception
    it raised (a :class:`~.two_pass.RestoreFailed` or an I/O error of that job only: the others
    still complete). A destination too small for its job fails that job before any I/O."""
    results: list[Outcome | Exception | None] = [None] * len(jobs)
    runnable = []
    for i, job in enumerate(jobs):
        try:
            job.check_capacity()
            runnable.append(i)
        except Exception as e:
            results[i] = e
    if len(runnable) == 1:
        job = jobs[runnable[0]]
        try:
            results[runnable[0]] = job.apply(job.read())
        except Exception as e:
            results[runnable[0]] = e
    elif runnable:
        _pipeline(jobs, runnable, readahead, results)
    return [r if r is not None else RuntimeError("restore job did not run") for r in results]


def _pipeline(jobs: Sequence[Job], order: list[int], readahead: int,
              results: list[Outcome | Exception | None]) -> None:  # fmt: skip
    handoff: queue.Queue[tuple[int, Validated | Exception] | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def reader() -> None:
        try:
            ahead = 0  # jobs of `order` whose files were handed to the kernel, each once
            for n, i in enumerate(order):
                if stop.is_set():
                    return
                while ahead < min(len(order), n + 1 + readahead):
                    jobs[order[ahead]].prefetch()
                    ahead += 1
                job = jobs[i]
                item: Validated | Exception
                try:
                    item = job.read()
                except Exception as e:
                    item = e
                handoff.put((i, item))
        finally:
            handoff.put(None)

    worker = threading.Thread(target=reader, name="strata-agenda-read", daemon=True)
    worker.start()
    try:
        while (got := handoff.get()) is not None:
            i, item = got
            if isinstance(item, Exception):
                results[i] = item
                continue
            try:
                results[i] = jobs[i].apply(item)
            except Exception as e:
                results[i] = e
    finally:
        stop.set()
        while worker.is_alive():  # unblock a reader waiting on a full hand-off
            try:
                left = handoff.get_nowait()
            except queue.Empty:
                worker.join(0.01)
                continue
            if left is not None and not isinstance(left[1], Exception):
                jobs[left[0]].discard(left[1])  # never applied: deliver nothing of it
