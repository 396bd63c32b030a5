"""What a chunk store is made of: its levels, first to last, each a level spec the registry
opens (:func:`~stratastore.levels.registry.open_level`: a directory, ``memory://NAME``, a Redis
URL) with its byte budget and age limit, and what a full last level does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stratastore.errors import ConfigError
from stratastore.levels.settings import padding_problem, shown_value

__all__ = ["ChunkConfig", "ChunkLevel"]


@dataclass(frozen=True, slots=True)
class ChunkLevel:
    """One level of a chunk store: ``spec`` (a directory path, ``file://PATH``,
    ``memory://NAME``, ``redis://...``), the bytes it may hold (``budget_bytes``, what its
    ``used()`` counts: stored data and sidecars), the seconds a page may stay (``max_age_s``,
    0: no limit; enforced by :meth:`~stratastore.chunks.ChunkStore.gc`) and the backend's own
    ``settings`` (a directory's ``file_mode``; a Redis level's ``name``, ``password``,
    ``timeout_s``...), handed to ``open_level`` as they are: one its opener does not take is a
    :class:`~stratastore.errors.ConfigError` at open naming it, the level and those it takes
    (:meth:`~stratastore.levels.registry.BackendEntry.open`). Its repr shows a URL by its
    scheme alone: a URL may carry a credential."""

    spec: str
    budget_bytes: int
    max_age_s: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        padded = padding_problem("spec", str(self.spec))
        if padded is not None:  # a URL would pass for a relative path: refused, nothing made
            raise ConfigError(f"chunk level: {padded}")
        if isinstance(self.budget_bytes, bool) or not (
            isinstance(self.budget_bytes, int) and self.budget_bytes >= 1
        ):
            raise ConfigError(
                f"chunk level {self.shown}: budget_bytes = {self.budget_bytes!r}; give the most "
                "bytes the level may hold, a whole number >= 1"
            )
        if isinstance(self.max_age_s, bool) or not (
            isinstance(self.max_age_s, int) and self.max_age_s >= 0
        ):
            raise ConfigError(
                f"chunk level {self.shown}: max_age_s = {self.max_age_s!r}; use whole seconds "
                ">= 0 (0: no age limit)"
            )

    @property
    def shown(self) -> str:
        """The level as messages show it: a path as given, a URL by its scheme alone (as
        :func:`~stratastore.levels.settings.shown_value` shows it)."""
        spec = str(self.spec)
        shown = shown_value(spec)
        return spec if "://" not in spec or shown == repr(spec) else shown.strip("'")

    def __repr__(self) -> str:
        return (
            f"ChunkLevel({self.shown!r}, budget_bytes={self.budget_bytes}, "
            f"max_age_s={self.max_age_s}, settings=[{', '.join(sorted(self.settings))}])"
        )


@dataclass(frozen=True, slots=True)
class ChunkConfig:
    """A chunk store's levels, first (where pages are put) to last (the only one that
    deletes), and what the last level does when a put finds it full of pages it may not let
    go of: ``"evict"`` (the oldest page not pinned goes) or ``"reject"`` (the put is refused).
    ``name`` is how log lines name a page (``"LMCache chunk"``, ``"HiCache page"``)."""

    levels: tuple[ChunkLevel, ...]
    when_full: Literal["evict", "reject"] = "evict"
    name: str = "chunk"

    def __post_init__(self) -> None:
        if not self.levels or not all(isinstance(lv, ChunkLevel) for lv in self.levels):
            raise ConfigError(
                "a chunk store needs at least one level: ChunkConfig((ChunkLevel(dir, "
                "budget_bytes),))"
            )
        if self.when_full not in ("evict", "reject"):
            raise ConfigError(f"when_full = {self.when_full!r}; use 'evict' or 'reject'")
        specs = [str(lv.spec) for lv in self.levels]
        if len(set(specs)) != len(specs):
            raise ConfigError(
                "two levels of one chunk store name the same spec "
                f"({', '.join(lv.shown for lv in self.levels)}); give each level its own"
            )
