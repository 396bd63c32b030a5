"""What a check of a shared level's store found, in terms every shared backend can give: one
row a namespace (spec F-REM-1: a store name holds one per model), what ``strata fsck
--remote`` prints and its ``--json`` holds. A backend's registry row makes it by its ``fsck``
hook (:func:`~stratastore.levels.registry.fsck_shared`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["NamespaceCheck", "SharedLevelCheck"]


@dataclass(frozen=True)
class NamespaceCheck:
    """One namespace: its prefix, its model (``None``: no record names it), whether it is
    clean (as checked, or as checked again after a repair), and what was found: ``counts`` by
    name in the order a report names them (empty with ``problem`` when it could not be
    checked), the segments whose page failed its digest (key, first bad page: the finding
    ``PAGE_HASH_MISMATCH``), the commit records a keyed level does not accept (the finding
    ``SIDECAR_UNAUTHENTICATED``, spec F-KEYED-5), and whether it was repaired. A keyed
    level's records checked without its key are counted (``keyed_unchecked``), never
    judged."""

    prefix: str
    model: str | None
    clean: bool
    problem: str = ""
    counts: Mapping[str, int] = field(default_factory=dict)
    damaged: tuple[tuple[bytes, int], ...] = ()
    repaired: bool = False
    unauthenticated: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class SharedLevelCheck:
    """A shared level's store, checked: the level as a message may show it (no credential),
    its store name, and each namespace of that name."""

    level: str
    name: str
    namespaces: tuple[NamespaceCheck, ...]

    @property
    def not_clean(self) -> int:
        return sum(not ns.clean for ns in self.namespaces)
