"""Latency histograms: how long the Store's ``park``, ``restore`` and ``flush`` calls took.

A :class:`Histogram` counts durations into the fixed buckets :data:`BUCKETS` (1 ms to 60 s,
the upper bounds Prometheus writes as ``le``), and keeps their sum and count. What
``Store.stats()`` reports of one (:meth:`Histogram.as_stats`) is a JSON-friendly table:
``{"buckets": {"0.001": n, ..., "+Inf": n}, "sum": seconds, "count": n}``, the buckets
cumulative as Prometheus has them, so the monitor's snapshot carries it unchanged and the
Prometheus text (:mod:`stratastore.metrics.prometheus`) writes it as a histogram family.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["BUCKETS", "Histogram"]

#: the upper bounds of the buckets, in seconds: fixed, so every store's series add up
BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class Histogram:
    """Durations counted into :data:`BUCKETS`; thread-safe (calls on several threads
    observe at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)  #: per bucket, the last one above 60 s
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration in the first bucket that holds it."""
        i = next((i for i, bound in enumerate(BUCKETS) if seconds <= bound), len(BUCKETS))
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    @contextlib.contextmanager
    def time(self) -> Iterator[None]:
        """Observe how long the ``with`` block took (raised or not)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - t0)

    def as_stats(self) -> dict[str, Any]:
        """The histogram as ``Store.stats()`` reports it (see the module)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets: dict[str, int] = {}
        running = 0
        for bound, n in zip((*map(_le, BUCKETS), "+Inf"), counts, strict=True):
            running += n
            buckets[bound] = running
        return {"buckets": buckets, "sum": total, "count": running}


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes ``le`` (``0.001``, ``1.0``, ``60.0``)."""
    return repr(bound)
