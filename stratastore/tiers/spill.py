"""The spill writer: one background thread that writes acknowledged parks down (spec F-DUR).

A park is acknowledged once its capture is in the outbox (:class:`~.outbox.Outbox`); the
capture is then handed over once, to a bounded queue that this writer drains. A full queue
blocks only the parking thread (back-pressure), never the writer, and never while the flow's
lock is held. Each write takes the lock only for its bookkeeping, so no restore waits on it.

Errors belong to the call that caused them: a write that fails in the background is recorded
and counted (``spill_errors``) and raised as a :class:`SpillError` by the engine's next
``flush()`` or ``close()``, never by an unrelated lookup or restore. A copy the store made of
its own accord (``remote_keep_local``) that fails is said and counted, never reported as a
lost park.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from stratastore.errors import StrataError
from stratastore.metrics.counters import zero_counts
from stratastore.tiers.outbox import Outbox
from stratastore.tiers.records import Snapshot
from stratastore.tiers.remote import RemoteLevel

__all__ = ["SpillError", "SpillWriter"]

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


class SpillWriter:
    """The writer thread over ``outbox`` (see the module). ``write(snap)`` writes one capture
    down (the flow's ``write_disk_now``); ``after_write()`` runs after each, on this thread
    (the monitor's snapshot: the store's disk writes stay on one thread)."""

    def __init__(
        self,
        lock: AbstractContextManager[Any],
        outbox: Outbox,
        depth: int,
        write: Callable[[Snapshot], None],
        after_write: Callable[[], object],
        remote: RemoteLevel | None,
        warn: Callable[[str], None],
    ) -> None:
        self.lock, self.outbox, self.write, self.after_write = lock, outbox, write, after_write
        self.remote, self.warn = remote, warn
        self.queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        #: background write failures not yet reported: (conversation id, cause)
        self.errors: list[tuple[str, BaseException]] = []
        self.counters = zero_counts("spill writer")
        self.handing = 0  #: parks acknowledged whose disk writes are not queued yet
        self._thread = threading.Thread(target=self._drain, name="strata-spill", daemon=True)
        self._thread.start()

    def claim(self) -> list[Snapshot]:
        """The captures the outbox acknowledged since the last claim, counted as being handed
        over until :meth:`hand_over` (close waits for them). Under the flow's lock."""
        self.handing += 1
        return self.outbox.take()

    def hand_over(self, snaps: list[Snapshot]) -> None:
        """Queue what :meth:`claim` returned; without the lock (back-pressure)."""
        try:
            self.put(snaps)
        finally:
            with self.lock:
                self.handing -= 1

    def put(self, snaps: list[Snapshot]) -> None:
        """Queue disk writes; called without the lock held, so a full queue blocks only the
        calling thread and never the writer."""
        for snap in snaps:
            if self.queue.full():
                with self.lock:
                    self.counters["spill_queue_waits"] += 1
            self.queue.put(snap)

    def record(self, what: str, e: BaseException) -> None:
        """A write that did not land, for the next :meth:`raise_errors` (under the lock)."""
        self.counters["spill_errors"] += 1
        self.errors.append((what, e))

    def raise_errors(self) -> None:
        """Raise :class:`SpillError` for the failures not reported yet (each reported once)."""
        with self.lock:
            failures, self.errors = self.errors, []
        if failures:
            raise SpillError(failures) from failures[0][1]

    def stop(self) -> None:
        """Write what is queued, then end the thread."""
        self.queue.join()
        self.queue.put(_STOP)
        self._thread.join()

    def _drain(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is _STOP:
                    return
                assert isinstance(item, Snapshot)
                self._write(item)
                self.after_write()
            finally:
                # nothing of a written snapshot outlives its write (a capture held until the
                # next park would stay resident after flush())
                item = None
                self.queue.task_done()

    def _write(self, snap: Snapshot) -> None:
        """One disk write; a failure (an I/O error, a refusal by the level) is recorded and
        counted, for the engine's next ``flush()``/``close()``."""
        try:  # the lock only around the bookkeeping: no restore waits on this write
            self.write(snap)
        except Exception as e:
            with self.lock:
                if snap.kept and self.remote is not None:  # the store's own copy
                    # (remote_keep_local): nobody was told of it, so it is not a lost park
                    self.remote.counters["remote_kept_local_errors"] += 1
                    self.warn(
                        f"{snap.conv.conv_id} (read from the remote level) not kept locally: {e}"
                    )
                    return
                self.record(snap.conv.conv_id, e)
