"""What one side of the vLLM connector did: totals since it started (the shutdown line,
:meth:`StrataConnector.stats`) and the part not yet reported to vLLM (its metrics, taken each
step: :meth:`Tally.take`). Thread-safe: the worker's loads count on the step's thread, its
parks on the saver's. No vLLM import (the figures' meaning is in :mod:`.metrics`)."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["COUNTS", "DROP_REASONS", "TIMINGS", "Tally"]

#: the plain counts, in the order the shutdown line and ``stats()`` give them
COUNTS = (
    "lookups",
    "lookup_hits",
    "loads",
    "tokens_loaded",
    "load_shortfalls",
    "blocks_recomputed",
    "parks",
    "tokens_parked",
)
#: why a park was not kept
DROP_REASONS = ("refused", "write_failed", "error")
#: the timings kept per event (for histograms): name -> what one event is
TIMINGS = {
    "load_seconds": "Seconds of one restore into vLLM's blocks (the forward waits for it).",
    "park_seconds": "Seconds of one park, from its hand-over to durable.",
}


class Tally:
    """Counts and timings (see the module). ``add(name=n, ...)`` adds to counts of
    :data:`COUNTS` or ``bytes_load``/``bytes_park``; ``drop(reason)`` counts a park not kept;
    ``time(name, seconds)`` records one event of :data:`TIMINGS`. A name outside those is a
    ``KeyError`` at once (a typo never makes a silent series)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._order = (*COUNTS, "bytes_load", "bytes_park")
        self._keys = frozenset(self._order)
        #: since start: the counts, ``dropped``, and per timing its ``_count`` and ``_sum``
        self.totals: dict[str, Any] = self._empty()
        for name in TIMINGS:
            del self.totals[name]
            self.totals.update({f"{name}_count": 0, f"{name}_sum": 0.0})
        self._pending: dict[str, Any] = self._empty()

    def _empty(self) -> dict[str, Any]:
        doc: dict[str, Any] = dict.fromkeys(self._order, 0)
        doc["dropped"] = dict.fromkeys(DROP_REASONS, 0)
        doc.update((name, []) for name in TIMINGS)
        return doc

    def add(self, **counts: int) -> None:
        unknown = set(counts) - self._keys
        if unknown:
            raise KeyError(f"Tally: no count named {sorted(unknown)}")
        with self._lock:
            for doc in (self.totals, self._pending):
                for k, n in counts.items():
                    doc[k] += n

    def drop(self, reason: str) -> None:
        if reason not in DROP_REASONS:
            raise KeyError(f"Tally: no drop reason {reason!r}")
        with self._lock:
            for doc in (self.totals, self._pending):
                doc["dropped"][reason] += 1

    def time(self, name: str, seconds: float) -> None:
        if name not in TIMINGS:
            raise KeyError(f"Tally: no timing named {name!r}")
        with self._lock:
            self.totals[f"{name}_count"] += 1
            self.totals[f"{name}_sum"] += seconds
            self._pending[name].append(seconds)

    def take(self) -> dict[str, Any] | None:
        """What was counted since the last take (zeros left out), or ``None`` when nothing."""
        with self._lock:
            got, self._pending = self._pending, self._empty()
        doc = {k: v for k, v in got.items() if v and k != "dropped"}
        if dropped := {r: n for r, n in got["dropped"].items() if n}:
            doc["dropped"] = dropped
        return doc or None

    def snapshot(self) -> dict[str, Any]:
        """The totals since this side started (a copy)."""
        with self._lock:
            return {**self.totals, "dropped": dict(self.totals["dropped"])}
