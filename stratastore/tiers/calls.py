"""The calls in flight on a store, and its close: one gate with its own condition.

Every public call of :class:`~stratastore.Store` passes the gate while it runs (a park until
its writes are handed over, a restore until its reads are accounted); :meth:`Calls.shut`
refuses new calls from then on and :meth:`Calls.wait_idle` waits, on the gate's condition (no
poll), until those in flight are done, so the levels are never closed under a call. The gate
has a lock of its own: entering and leaving it never takes the flow's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from stratastore.tiers.records import StoreClosed

__all__ = ["Calls"]


class Calls:
    """The gate of one store (see the module)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._in_flight = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def check(self, call: str) -> None:
        """:class:`StoreClosed` naming ``call`` once the store is closed."""
        if self._closed:
            raise StoreClosed(call)

    @contextmanager
    def call(self, call: str) -> Iterator[None]:
        """Run the block as a call in flight (:meth:`wait_idle` waits for it); a call on a closed
        store raises :class:`StoreClosed` naming ``call`` before the block runs."""
        with self._cv:
            self.check(call)
            self._in_flight += 1
        try:
            yield
        finally:
            with self._cv:
                self._in_flight -= 1
                if not self._in_flight:
                    self._cv.notify_all()

    def shut(self) -> None:
        """Refuse every new call from now on (those in flight go on)."""
        with self._cv:
            self._closed = True

    def wait_idle(self) -> None:
        """Wait, on the gate's condition, until no call is in flight."""
        with self._cv:
            self._cv.wait_for(lambda: self._in_flight == 0)
