"""Read-ahead hints handed to a thread of their own, so the thread that reads never waits for
them, and never asked for bytes already in the page cache.

``posix_fadvise(WILLNEED)`` starts the kernel's reads of a range into the page cache, but the
call does part of the work itself (it allocates the pages and submits the reads): on a device
whose queue is full it blocks the caller until requests drain, and on resident pages it walks
the page cache (docs/performance.md "Validated reads at the disk's rate" has both measured).
:func:`ask` takes the range and returns: the read-ahead thread then skips it when its first and
last pages (within the file) are resident (a one-byte ``preadv2(RWF_NOWAIT)`` each, which
never waits for the device; on a miss the kernel may start reading that page, which was to be
asked for anyway) and asks the kernel for the rest a read-ahead window a call
(:func:`~.files.advise_range`). The thread gets a descriptor of its own, the same file opened
again through ``/proc/self/fd`` (so its probes leave the reader's own read-ahead state alone;
a duplicate where ``/proc`` is not mounted), so the caller may close its own at once. A hint
only: nothing here raises, and a hint that finds the queue full is dropped (the reads it was
for still happen, only without the head start).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

from stratastore.io import files
from stratastore.io.system import after_fork_in_child

__all__ = ["ask", "settle"]

QUEUE = 64  #: hints waiting for the read-ahead thread, at most (more are dropped)


class _ReadAhead:
    """The queue of hints and the thread that serves them (started at the first hint)."""

    def __init__(self) -> None:
        self.hints: queue.Queue[tuple[int, int, int]] = queue.Queue(maxsize=QUEUE)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def ask(self, fd: int, offset: int, nbytes: int) -> None:
        if nbytes <= 0 or offset < 0:
            return
        dup = _own(fd)
        if dup < 0:
            return  # a closed or bad descriptor: nothing to read ahead of
        try:
            self._start()
        except Exception:  # no thread could start: the hint is dropped
            os.close(dup)
            return
        try:
            self.hints.put_nowait((dup, offset, nbytes))  # the thread closes it from here on
        except queue.Full:
            os.close(dup)

    def _start(self) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._serve, name="strata-read-ahead", daemon=True
                )
                self.thread.start()

    def _serve(self) -> None:
        while True:
            fd, offset, nbytes = self.hints.get()
            try:
                last = min(offset + nbytes, os.fstat(fd).st_size) - 1
                if last >= offset and not (files.resident(fd, offset) and files.resident(fd, last)):
                    files.advise_range(fd, offset, last + 1 - offset)
            except Exception:  # a hint never fails anyone
                pass
            finally:
                _close(fd)
                self.hints.task_done()

    def forget(self) -> None:
        """In a forked child: the parent's thread is not here; close the child's copies of the
        descriptors its queue held (read without its lock: a thread of the parent may have held
        that at the fork, and no thread of the child uses this queue again)."""
        for fd, _, _ in list(self.hints.queue):
            _close(fd)


def _own(fd: int) -> int:
    """A descriptor of the thread's own for the file open as ``fd``: opened again through
    ``/proc/self/fd`` (another open file description, read-ahead state included), else a
    duplicate; -1 when ``fd`` is not open."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        try:
            return os.dup(fd)
        except OSError:
            return -1


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


_AHEAD = _ReadAhead()


def _reset() -> None:
    global _AHEAD
    _AHEAD.forget()
    _AHEAD = _ReadAhead()


after_fork_in_child(_reset)


def ask(fd: int, offset: int, nbytes: int) -> None:
    """Have bytes ``[offset, offset + nbytes)`` of the open file ``fd`` read into the page cache
    soon, off this thread (see the module); returns at once and never raises (but an interrupt
    arriving meanwhile, which leaves at most the hint's duplicate descriptor open: it is never
    closed twice)."""
    _AHEAD.ask(fd, offset, nbytes)


def settle() -> None:
    """Wait until every hint queued so far was served (for tests and benchmarks: a hint's own
    reads may still be on their way from the device; one dropped on a full queue never is)."""
    _AHEAD.hints.join()
