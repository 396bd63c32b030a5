"""Which committed segments a restore can reach through the chain manifests (spec F-CHAIN-3).

A conversation on disk is committed by its manifest, which names its segments in token order
and, per checkpoint, an optional running state (F-CHAIN-1, F-CHAIN-6). A reader restores it
only up to the first named segment that is missing or damaged (F-CHAIN-3). So a segment is
*reachable* when some manifest names it and every segment before it in that manifest can be
read; a state is reachable when its checkpoint's length is within the readable prefix of a
manifest that names it. A segment no manifest reaches is never read again but still occupies
its level's budget.

Pure: this module reads no file. :func:`reachability` takes the accepted manifests, the keys to
classify and two predicates (is a key committed in some level of the store, is it damaged), and
returns the reachable keys and, for each other one, every chain that names it and where that
chain stops (none: no manifest names it). ``strata fsck`` reports the unreachable ones as
``SEGMENT_UNREACHABLE`` (format-spec/FSCK.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stratastore.format.manifest import ChainManifest

__all__ = ["Reachability", "Stop", "Unreachable", "reachability"]


@dataclass(frozen=True, slots=True)
class Stop:
    """Where one chain stops: its first named segment a restore cannot read."""

    manifest: str  #: the manifest's path (or any name the caller gave it)
    conv_id: str
    session: bool  #: the manifest is a saved session's (F-CHAIN-5)
    key: bytes  #: the segment it stops at
    start: int  #: that segment's first token: the chain restores up to here
    missing: bool  #: True: committed in no level; False: there but damaged

    def describe(self) -> str:
        what = "saved session" if self.session else "conversation"
        how = "missing from every level" if self.missing else "damaged"
        return (
            f"it follows segment {self.key.hex()} (token {self.start}, {how}) in the chain "
            f"of {what} {self.conv_id!r} ({self.manifest})"
        )


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A committed segment no restore reads: every chain that names it stops before it
    (``stops``), or no manifest names it (``stops`` empty)."""

    key: bytes
    stops: tuple[Stop, ...]

    @property
    def only_damage(self) -> bool:
        """Every chain naming it stops at a damaged segment (a consequence of that damage)."""
        return bool(self.stops) and not any(s.missing for s in self.stops)

    def reason(self) -> str:
        """Why, for a message: the first stop at a missing segment (or the first stop), and how
        many other chains name it."""
        if not self.stops:
            return "no chain manifest names it"
        first = next((s for s in self.stops if s.missing), self.stops[0])
        more = len(self.stops) - 1
        return first.describe() + (
            f", and {more} other chain(s) that stop before it" if more else ""
        )


@dataclass(frozen=True, slots=True)
class Reachability:
    reachable: frozenset[bytes]  #: keys of segments (K/V or state) some chain reaches
    unreachable: dict[bytes, Unreachable]  #: each key classified that none reaches


def reachability(
    manifests: Iterable[tuple[str, ChainManifest]],
    keys: Iterable[bytes],
    present: Callable[[bytes], bool],
    damaged: Callable[[bytes], bool] = lambda key: False,
) -> Reachability:
    """Classify ``keys`` (committed segments, K/V or state) against ``manifests``
    (``(name, manifest)`` pairs a reader accepts, F-CHAIN-2/4). ``present(key)``: the segment is
    committed in some level of the store (all of them: a chain names segments of every level,
    F-CHAIN-4); ``damaged(key)``: it is there but a restore stops at it. A chain restores up to
    the start of its first segment that is not present or is damaged (F-CHAIN-3); that segment
    itself counts as reached (its damage is its own problem), every later one and every state
    past that length is past the stop."""
    reachable: set[bytes] = set()
    past: dict[bytes, list[Stop]] = {}
    for name, m in manifests:
        stop: Stop | None = None
        for start, _, key in m.segments:
            if stop is not None:
                past.setdefault(key, []).append(stop)
                continue
            reachable.add(key)
            if not present(key) or damaged(key):
                stop = Stop(name, m.conv_id, m.session, key, start, not present(key))
        reach = len(m.tokens) if stop is None else stop.start
        for c in m.checkpoints:
            if c.state_key is None:
                continue
            if stop is None or c.length <= reach:
                reachable.add(c.state_key)
            else:
                past.setdefault(c.state_key, []).append(stop)
    unreachable = {k: Unreachable(k, tuple(past.get(k, ()))) for k in keys if k not in reachable}
    return Reachability(frozenset(reachable), unreachable)
