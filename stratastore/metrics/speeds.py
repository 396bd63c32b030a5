"""Per-slot speeds: what each engine slot's parks and restores moved, by level, over a recent
window (``Store.stats()["speeds"]``, ``strata monitor``).

The engine names the slot on :meth:`~stratastore.Store.park` and
:meth:`~stratastore.Store.restore` (``slot=``, an optional integer or short name; calls without
one count under ``"-"``). Each call is one event: its slot, whether it parked or restored, the
level it went to or came from (a park's ``ram``/``disk``/``discard``, a restore's source or
``none``), its tokens and bytes, and how long the call took. Over the last :data:`WINDOW_S`
seconds, per slot, per kind and per level: ``gb_s`` and ``tokens_s`` (what moved for the time
the calls took: the speed of a call), ``per_s`` (calls a second) and ``bytes_per_s`` (bytes a
second of the window: the load), beside the window's totals ``count``, ``tokens``, ``bytes``
and ``seconds``. At most :data:`MAX_EVENTS` events are held (the oldest go first), so the
memory is bounded whatever the call rate.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stratastore.errors import ConfigError

__all__ = ["MAX_EVENTS", "NO_SLOT", "WINDOW_S", "InvalidSlot", "Speeds", "slot_name"]

WINDOW_S = 60.0  #: the recent window, seconds
MAX_EVENTS = 65_536  #: events held at most
NO_SLOT = "-"  #: the slot of a call that named none
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
Kind = Literal["park", "restore"]


class InvalidSlot(ConfigError):
    """A ``slot=`` that is neither a non-negative integer nor a short name."""


def slot_name(slot: object, call: str) -> str:
    """``slot`` as the speeds name it: an integer's decimal, a name of letters, digits and
    ``_.:-`` (1 to 64), :data:`NO_SLOT` for ``None``; anything else is :class:`InvalidSlot`."""
    if slot is None:
        return NO_SLOT
    if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0:
        return str(slot)
    if isinstance(slot, str) and _NAME.fullmatch(slot):
        return slot
    raise InvalidSlot(
        f"{call}: slot={slot!r} is not a slot: pass a non-negative integer or a name of up to "
        "64 letters, digits, '_', '.', ':' or '-'"
    )


@dataclass(frozen=True, slots=True)
class _Event:
    at: float
    slot: str
    kind: Kind
    level: str
    tokens: int
    nbytes: int
    seconds: float


class Speeds:
    """The events of the recent window (thread-safe; see the module)."""

    def __init__(
        self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s, self.clock = window_s, clock
        self._events: deque[_Event] = deque(maxlen=MAX_EVENTS)
        self._lock = threading.Lock()

    def record(
        self, kind: Kind, slot: str, level: str, tokens: int, nbytes: int, seconds: float
    ) -> None:
        """One park or restore of ``slot`` that moved ``tokens`` (``nbytes``) to or from
        ``level`` in ``seconds``."""
        event = _Event(self.clock(), slot, kind, level, tokens, nbytes, max(seconds, 0.0))
        with self._lock:
            self._events.append(event)

    def table(self) -> dict[str, Any]:
        """``{"window_s": ..., "slots": {slot: {"park"|"restore": {level: figures}}}}`` over
        the window (see the module); slots and levels in the order first seen."""
        now = self.clock()
        with self._lock:
            while self._events and now - self._events[0].at > self.window_s:
                self._events.popleft()
            events = list(self._events)
        sums: dict[tuple[str, str, str], list[float]] = {}
        for e in events:
            s = sums.setdefault((e.slot, e.kind, e.level), [0, 0, 0, 0.0])
            s[0] += 1
            s[1] += e.tokens
            s[2] += e.nbytes
            s[3] += e.seconds
        slots: dict[str, dict[str, dict[str, dict[str, float | int]]]] = {}
        for (slot, kind, level), (n, tokens, nbytes, secs) in sums.items():
            slots.setdefault(slot, {}).setdefault(kind, {})[level] = {
                "count": int(n),
                "tokens": int(tokens),
                "bytes": int(nbytes),
                "seconds": round(secs, 6),
                "gb_s": round(nbytes / secs / 1e9, 3) if secs > 0 else 0.0,
                "tokens_s": round(tokens / secs, 1) if secs > 0 else 0.0,
                "per_s": round(n / self.window_s, 3),
                "bytes_per_s": round(nbytes / self.window_s, 1),
            }
        return {"window_s": self.window_s, "slots": slots}
