"""Lookup: where a prompt's deepest stored prefix is, as a choice among restore sources.

A *source* is anything a restore can copy a prefix from: the RAM level, the parks whose disk
write is still in flight (their captures, in memory), the disk levels (through the shared
catalog) and the shared remote level (:mod:`.sources`). Each answers the same two questions:
:meth:`Source.deepest` (its deepest resume point for a prompt, a :class:`Hit`) and
:meth:`Source.restore` (the plan of copying a hit into a destination, a :class:`Step`).

"The deepest hit" is then a choice, not a case analysis: the sources are asked in their order,
and the first with the longest match wins (:func:`deepest`). The local sources are asked first,
under the flow's lock; the remote level only when they do not hold what the caller can use,
without the lock (network calls), and it is taken only where it holds more (spec F-KEY-4: a
prefix matches only with the same pictures at the same positions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from stratastore.chain import Match
from stratastore.restore import Destination, Job, Outcome
from stratastore.tiers.records import Restored, Snapshot
from stratastore.tiers.view import DiskConv

__all__ = [
    "Copy",
    "Delivered",
    "Hit",
    "LevelSource",
    "Lookup",
    "Read",
    "Source",
    "SourceName",
    "Step",
    "deepest",
]

#: the sources a restore can come from, as :class:`~.records.Restored` names them
SourceName = Literal["ram", "pending", "disk", "prompt_cache", "remote"]

#: a prompt: its token ids
Prompt = npt.NDArray[np.integer] | list[int]


@dataclass(frozen=True, slots=True)
class Hit:
    """A source's deepest resume point for a prompt. ``dc``: the conversation a disk-like
    source reads it from (its segments and saved states), where the source knows it already
    (the remote level's walk builds it; a disk hit names it in the catalog)."""

    source: Source
    match: Match
    dc: DiskConv | None = None

    @property
    def length(self) -> int:
        return self.match.length


@dataclass(frozen=True, slots=True)
class Delivered:
    """A restore done while it was planned (a RAM hit: a copy out of the arena)."""

    result: Restored


@dataclass(frozen=True, slots=True)
class Copy:
    """A restore from a capture in memory, copied without the lock (a park in flight)."""

    source: Source
    dest: Destination
    capture: Snapshot
    match: Match


@dataclass(frozen=True, slots=True)
class Read:
    """A restore read and validated from a level: its two-pass job joins the batch."""

    source: LevelSource
    hit: Hit
    dc: DiskConv
    job: Job


#: what :meth:`Source.restore` plans
Step = Delivered | Copy | Read


class Source(Protocol):
    """One place a restore can come from (see the module)."""

    @property
    def name(self) -> SourceName: ...

    @property
    def counts(self) -> Mapping[str, int]:
        """The flow's counts this source keeps (the counter table's rows it counts)."""
        ...

    def deepest(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        """The deepest resume point for ``prompt`` this source holds, or ``None``."""
        ...

    def restore(self, hit: Hit, dest: Destination) -> Step | None:
        """Plan the restore of ``hit`` into ``dest`` (under the flow's lock; what can be done
        at once is done). ``None``: nothing to restore after all (counted by the source as a
        miss, or as a refused hit)."""
        ...


class LevelSource(Source, Protocol):
    """A source read through two-pass jobs (the disk levels, the remote level)."""

    def resume(self, read: Read, outcome: Outcome) -> Restored:
        """Where a finished read resumes, and its running state (I/O: without the lock)."""
        ...

    def settle(
        self, read: Read, outcome: Outcome, found: Restored, asked: str
    ) -> tuple[Restored, list[bytes]]:
        """Account a finished read (under the flow's lock; no I/O): its result, and the
        segments it found damaged that are settled after the lock (network calls). ``asked``:
        what asked for it, for the messages."""
        ...


def deepest(hits: Iterable[Hit | None]) -> Hit | None:
    """The deepest of ``hits``, the first in order among equals (a source earlier in the order
    wins a tie: RAM before a park in flight, before the disk levels, before the remote level)."""
    best: Hit | None = None
    for hit in hits:
        if hit is not None and (best is None or hit.length > best.length):
            best = hit
    return best


class Lookup:
    """The sources in their order: the local ones (this node's RAM, parks in flight, disk
    levels), then the shared remote level when there is one."""

    def __init__(self, local: Sequence[Source], remote: Source | None) -> None:
        self.local = tuple(local)
        self.remote = remote

    def here(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        """The local sources' deepest resume point (under the flow's lock)."""
        return deepest(s.deepest(prompt, media) for s in self.local)

    def worth_asking(self, prompt: Prompt, here: Hit | None, cap: int | None) -> bool:
        """Whether the remote level is worth asking: there is one, and the local sources hold
        less of ``prompt`` than the caller can use (all of it, or ``cap`` of it). A local hit
        that is enough never waits on the remote level, however it is."""
        need = len(prompt) if cap is None else min(len(prompt), cap)
        return self.remote is not None and (here is None or here.length < need)

    def there(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        """The remote level's deepest resume point (network calls: without the lock)."""
        return None if self.remote is None else self.remote.deepest(prompt, media)
