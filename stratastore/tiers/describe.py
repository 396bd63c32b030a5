"""What a store holds and how it is set, as a read-only snapshot (``Store.describe()``).

Frozen records, taken under the flow's lock in one go: each level (its name, where it is, its
budget, what it uses and how many entries it holds), the RAM level, the parks waiting for their
disk write, where parks go and why, the last admission, and the counters. Nothing in it refers
back into the store: tests, the demo and tools read it instead of the store's internals.
:func:`info_line` writes a store's stats as one line for a log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LevelDescription", "RamDescription", "StoreDescription", "info_line"]


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


def info_line(s: Mapping[str, Any]) -> str:
    """``Store.stats()`` as one line for a log (the engine's INFO fields): the park target and
    its source, each level (entries, bytes, budget; a disk level's folder), parks by
    destination, discards, hits by source, tokens restored, re-read and held, and the last
    admission. A figure the stats do not hold (of a level that is not configured: the disk
    parks and hits, the parks in flight, the system-prompt cache's hits, the remote hits) is
    left out, not written as 0. The system-prompt cache is one of the levels there
    (``prompt_cache=<entries>e/<MiB>/<budget>@<folder>``)."""
    lv = s["levels"]
    parts = [f"park={s['park_target']}({s['park_target_source']})"]
    for name, d in lv.items():
        where = f"@{d['dir']}" if d.get("dir") else ""
        if d["bytes"] is None:  # the remote level while it is down: entries, bytes unknown
            parts.append(f"{name}=-e/-MiB/{d['budget'] / 2**20:.0f}MiB{where}")
            continue
        parts.append(
            f"{name}={d['entries']}e/{d['bytes'] / 2**20:.0f}MiB"
            f"/{d['budget'] / 2**20:.0f}MiB{where}"
        )
    parts += [
        _by("parks", s, ("ram", "disk")),
        f"discards={s['discards']}",
        _by("hits", s, ("ram", "pending", "disk", "prompt_cache", "remote")),
        f"restored={s['tokens_restored']} reread={s['tokens_reread']}",
        f"held_tokens={s['held_tokens']}",
        f"admission={s['admission']}",
    ]
    return "strata: " + " ".join(parts)


def _by(what: str, s: Mapping[str, Any], ways: tuple[str, ...]) -> str:
    """``hits ram=1 disk=2``: the counters ``<what>_<way>`` the stats hold."""
    return " ".join([what, *(f"{w}={s[f'{what}_{w}']}" for w in ways if f"{what}_{w}" in s)])
