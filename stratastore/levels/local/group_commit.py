"""Group commit: the puts waiting for a directory's write lock are committed together by
whichever of them takes it (spec F-DUR-2, F-DUR-7).

A put prepares its files without the lock (its data file and its sidecar written to temp names
and fsynced: spec F-DUR-1, steps 1-3), joins the queue and takes the lock. The thread that takes
it commits every put queued by then, its own among them, in one go (:attr:`GroupCommit.run`);
the others find theirs done when they take the lock in turn. Per put the order of F-DUR-2 holds
(the data file renamed in and the directory fsynced, before the sidecar is renamed in and the
directory fsynced, before the index record), so a crash leaves each put committed or invisible,
exactly as one put at a time would; what a group shares is the directory's two fsyncs and one
index transaction. N writers so hold the lock for O(1) fsyncs a group instead of O(1) a put.

Contracts:

- :meth:`GroupCommit.commit` returns the put's own result or raises its own error, whichever
  thread ran it.
- ``run`` is called under the lock with every put queued, and returns a result or a
  :class:`~stratastore.errors.StrataError` for each, in order; it must leave every put it
  raises out of (a ``KeyboardInterrupt``) committed whole or undone. The puts of a ``run``
  that raises get a :class:`~stratastore.levels.errors.StoreError` and the thread that ran it
  the exception.
- A put interrupted while it waits for the lock leaves the queue when no one has taken it yet;
  one already taken is committed or not, whole, by the thread that took it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

from stratastore.errors import StrataError
from stratastore.levels.errors import StoreError

__all__ = ["GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: StrataError | None = None


class GroupCommit(Generic[T, R]):
    """Puts committed in groups under ``lock`` by ``run`` (the module docstring)."""

    def __init__(
        self,
        lock: Callable[[], AbstractContextManager[None]],
        run: Callable[[Sequence[T]], Sequence[R | StrataError]],
        what: str,
    ) -> None:
        self._lock = lock
        self.run = run
        self._what = what
        self._mu = threading.Lock()  #: the queue (never held over I/O)
        self._queue: list[_Slot[T, R]] = []

    def commit(self, item: T) -> R:
        """Commit ``item`` (with the puts queued beside it): its result, or its error raised."""
        (r,) = self.commit_many([item])
        if isinstance(r, StrataError):
            raise r
        return r

    def commit_many(self, items: Sequence[T]) -> list[R | StrataError]:
        """Commit ``items`` (with the puts queued beside them): a result or an error each. A
        failure to take the lock (the directory's ``flock``) is the error of each item no
        thread had committed; an interrupt is raised, the items no thread took yet leaving
        the queue."""
        if not items:
            return []
        slots: list[_Slot[T, R]] = [_Slot(item) for item in items]
        mine = {id(s) for s in slots}
        try:
            with self._mu:
                self._queue.extend(slots)
            with self._lock():
                if not all(s.done for s in slots):
                    self._run_queued()
        except BaseException as e:
            with self._mu:  # those no thread took yet leave the queue
                self._queue = [s for s in self._queue if id(s) not in mine]
            if not isinstance(e, StrataError):
                raise
            for s in slots:
                if not s.done:
                    s.error, s.done = e, True
        return [self._outcome(s) for s in slots]

    def _outcome(self, s: _Slot[T, R]) -> R | StrataError:
        if s.error is not None:
            return s.error
        if s.result is None:  # taken by a commit that was interrupted before it reached it
            return StoreError(
                f"{self._what}: the group commit that took this put was interrupted: it is "
                "not committed; put it again"
            )
        return s.result

    def _run_queued(self) -> None:
        group: list[_Slot[T, R]] = []
        try:
            with self._mu:
                self._queue, group = [], self._queue
            out = self.run([s.item for s in group])
            for s, r in zip(group, out, strict=True):
                if isinstance(r, StrataError):
                    s.error = r
                else:
                    s.result = r
                s.done = True
        finally:  # an interrupt: every put of the group not yet answered gets an error
            for s in group:
                if not s.done:
                    s.error = StoreError(
                        f"{self._what}: the group commit this put joined was interrupted: it "
                        "is committed whole or not at all; put it again (a put of a committed "
                        "key writes nothing)"
                    )
                    s.done = True
