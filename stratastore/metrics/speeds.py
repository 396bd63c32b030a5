"""Per-slot speeds: what each engine slot's parks and restores moved, by level, over a recent
window (``Store.stats()["speeds"]``, ``strata monitor``).

The engine names the slot on :meth:`~stratastore.Store.park` and
:meth:`~stratastore.Store.restore` (``slot=``, an optional integer or short name; calls without
one count under ``"-"``). Each call is one event: its slot, whether it parked or restored, the
level it went to or came from (a park's ``ram``/``disk``/``discard``, a restore's source or
``none``), its tokens and bytes, and how long it took (a park to disk: its durable write, on
the spill writer; a write that is no park of its own, a mirror or an eviction, is not one).
Over the last :data:`WINDOW_S` seconds, per slot, per kind and per level: ``gb_s`` and
``tokens_s`` (what moved for the time the calls took: the speed of a call), ``per_s`` (calls a
second) and ``bytes_per_s`` (bytes a second of the window: the load), beside the window's
totals ``count``, ``tokens``, ``bytes`` and ``seconds``. The :data:`MAX_SLOTS` busiest slots
are shown by name, the others added up as :data:`OTHERS`. At most :data:`MAX_EVENTS` events
are held (the oldest go first), so the memory is bounded whatever the call rate.
"""

from __future__ import annotations

import numbers
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stratastore.errors import ConfigError

__all__ = [
    "MAX_EVENTS",
    "MAX_SLOTS",
    "NO_SLOT",
    "OTHERS",
    "WINDOW_S",
    "InvalidSlot",
    "Speeds",
    "slot_name",
]

WINDOW_S = 60.0  #: the recent window, seconds
MAX_EVENTS = 65_536  #: events held at most
MAX_SLOTS = 64  #: slots shown by name (the busiest by bytes); the others as one, :data:`OTHERS`
OTHERS = "(others)"
NO_SLOT = "-"  #: the slot of a call that named none
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
Kind = Literal["park", "restore"]


class InvalidSlot(ConfigError):
    """A ``slot=`` that is neither a non-negative integer nor a short name."""


def slot_name(slot: object, call: str) -> str:
    """``slot`` as the speeds name it: a non-negative integer's decimal (numpy's too, below
    10**64), a name of letters, digits and ``_.:-`` (1 to 64), :data:`NO_SLOT` for ``None``;
    anything else is :class:`InvalidSlot`."""
    if slot is None:
        return NO_SLOT
    if isinstance(slot, numbers.Integral) and not isinstance(slot, bool):
        n = int(slot)
        if 0 <= n < 10**64:
            return str(n)
    if isinstance(slot, str) and _NAME.fullmatch(slot):
        return slot
    if isinstance(slot, numbers.Integral) and not isinstance(slot, bool):
        shown = "slot=<an integer outside 0..10**64>"
    else:
        text = repr(slot)
        shown = f"slot={text[:80]}{'...' if len(text) > 80 else ''}"
    raise InvalidSlot(
        f"{call}: {shown} is not a slot: pass a non-negative integer or a name of up to "
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

    def record_batch(
        self, got: Sequence[object], slots: Sequence[str], seconds: float, token_bytes: int
    ) -> None:
        """Each request of a ``restore_many`` call (``got``: its results, an error where it
        failed) under its slot, with its share of the call's ``seconds`` by its tokens (an
        error moved nothing: no share)."""
        done = [(i, r) for i, r in enumerate(got) if not isinstance(r, Exception)]
        total = sum(_tokens(r) for _, r in done)
        for i, r in done:
            n = _tokens(r)
            share = seconds * n / total if total else seconds / len(done)
            slot = slots[i] if slots else NO_SLOT
            self.record(
                "restore", slot, str(getattr(r, "source", "none")), n, n * token_bytes, share
            )

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
        busiest = _busiest(sums)
        slots: dict[str, dict[str, dict[str, dict[str, float | int]]]] = {}
        for (slot, kind, level), (n, tokens, nbytes, secs) in _fold(sums, busiest).items():
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


def _tokens(result: object) -> int:
    """The tokens a restore's result delivered."""
    n = getattr(result, "tokens", 0)
    return n if isinstance(n, int) else 0


Sums = dict[tuple[str, str, str], list[float]]


def _busiest(sums: Sums) -> set[str]:
    """The :data:`MAX_SLOTS` slots that moved the most bytes in the window."""
    moved: dict[str, float] = {}
    for (slot, _, _), figures in sums.items():
        moved[slot] = moved.get(slot, 0) + figures[2]
    return set(sorted(moved, key=lambda slot: -moved[slot])[:MAX_SLOTS])


def _fold(sums: Sums, busiest: set[str]) -> Sums:
    """``sums`` with every slot outside ``busiest`` added up under :data:`OTHERS` (an engine
    naming its requests, not its slots, keeps the table and the monitor's snapshot small)."""
    out: Sums = {}
    for (slot, kind, level), figures in sums.items():
        key = (slot if slot in busiest else OTHERS, kind, level)
        have = out.setdefault(key, [0, 0, 0, 0.0])
        for i, v in enumerate(figures):
            have[i] += v
    return out
