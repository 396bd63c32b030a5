"""What a store holds and how it is set, as a read-only snapshot (``Store.describe()``).

Frozen records, taken under the flow's lock in one go: each level (its name, where it is, its
budget, what it uses and how many entries it holds), the RAM level, the parks waiting for their
disk write, where parks go and why, the last admission, and the counters. Nothing in it refers
back into the store: tests, the demo and tools read it instead of the store's internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LevelDescription", "RamDescription", "StoreDescription"]


@dataclass(frozen=True, slots=True)
class LevelDescription:
    """A disk level (or the shared remote level, ``name == "remote"``). ``path``: its
    directory (the remote level: its server, without credentials); ``used`` and ``entries``
    are ``None`` while the remote level cannot be asked."""

    name: str
    path: str
    budget: int
    used: int | None
    entries: int | None


@dataclass(frozen=True, slots=True)
class RamDescription:
    """The RAM level: its budget and the bytes it holds (``ram_mib``), its ``slots``, the
    conversations it holds, and whether its arena is reserved (``on``: parks may stay in RAM)."""

    budget: int
    used: int
    slots: int
    entries: tuple[str, ...]
    on: bool


@dataclass(frozen=True, slots=True)
class StoreDescription:
    """A store at one moment (see the module). ``pending``: the conversations whose park waits
    for its disk write; ``park_target`` (``ram``/``disk``) and ``park_target_source`` (why);
    ``admission``: the last park's placement (``where/floor``); ``counters``: the flow's
    counters, as ``Store.stats()`` names them; ``unreadable_manifests``: the manifests refused
    at open."""

    levels: tuple[LevelDescription, ...]
    ram: RamDescription
    pending: tuple[str, ...]
    park_target: str
    park_target_source: str
    admission: str
    counters: Mapping[str, int]
    unreadable_manifests: tuple[str, ...]

    def level(self, name: str) -> LevelDescription | None:
        """The level called ``name`` (``"warm"``, ``"cold"``, ``"remote"``, ...), if it is on."""
        return next((lv for lv in self.levels if lv.name == name), None)
