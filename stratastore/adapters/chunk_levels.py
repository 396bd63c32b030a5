"""The levels of an adapter's chunk store as its engine's configuration gives them (a vLLM
secondary tier's entry, SGLang HiCache's extra config, or a TOML file either names): each a
table of ``spec``, exactly one of ``budget_bytes`` / ``budget_gib``, ``max_age_s`` and
``settings`` (the backend's own: a Redis level's ``name``, ``password``...), turned into a
:class:`~stratastore.chunks.ChunkLevel`; anything else a :class:`ConfigError` naming the key
and the fix."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from typing import Any

from stratastore.chunks import ChunkLevel
from stratastore.config import MAX_CONFIG_BYTES
from stratastore.errors import ConfigError
from stratastore.io import StrataIOError, files

__all__ = ["LEVEL_KEYS", "chunk_level", "chunk_levels", "read_toml"]

_GIB = 1 << 30
#: the keys of one level
LEVEL_KEYS = frozenset({"spec", "budget_bytes", "budget_gib", "max_age_s", "settings"})


def chunk_levels(raw: object, where: str) -> tuple[ChunkLevel, ...]:
    """The ``levels`` list of a configuration (at least one), each by :func:`chunk_level`."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f'{where}: "levels" must list at least one level, e.g. [{{"spec": '
            '"/var/lib/strata-kv", "budget_gib": 100}]'
        )
    return tuple(chunk_level(i, lv, where) for i, lv in enumerate(raw))


def chunk_level(i: int, raw: object, where: str) -> ChunkLevel:
    """Level ``i`` of ``levels`` as a :class:`ChunkLevel`."""
    at = f"{where}: levels[{i}]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f'{at} must be a table like {{"spec": DIR, "budget_gib": 100}}')
    unknown = sorted(set(raw) - LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"{at}: unknown key(s) {', '.join(unknown)}; a level takes "
            f"{', '.join(sorted(LEVEL_KEYS))}"
        )
    spec = raw.get("spec")
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"{at}: spec must name a directory or a level URL, not {spec!r}")
    if ("budget_bytes" in raw) == ("budget_gib" in raw):
        raise ConfigError(f"{at}: give exactly one of budget_bytes and budget_gib")
    if "budget_gib" in raw:
        gib = raw["budget_gib"]
        if isinstance(gib, bool) or not isinstance(gib, int | float) or not gib > 0:
            raise ConfigError(f"{at}: budget_gib = {gib!r}; give a number of GiB > 0")
        if not math.isfinite(gib):
            raise ConfigError(f"{at}: budget_gib = {gib!r}; give a finite number of GiB")
        budget = max(1, int(gib * _GIB))
    else:
        budget = raw["budget_bytes"]
    settings = raw.get("settings", {})
    if not isinstance(settings, Mapping):
        raise ConfigError(f"{at}: settings must be a table of the level's own settings")
    try:
        return ChunkLevel(spec, budget, raw.get("max_age_s", 0), dict(settings))
    except ConfigError as e:
        raise ConfigError(f"{at}: {e}") from None


def read_toml(path: str, where: str) -> dict[str, Any]:
    """The TOML file ``path`` as a dict (at most :data:`MAX_CONFIG_BYTES`); ``where`` names
    what refers to it in the errors."""
    try:
        data = files.read_file(files.realpath(path), MAX_CONFIG_BYTES)
    except StrataIOError as e:
        raise ConfigError(f"{where}: the config {path} cannot be read ({e})") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: {path} is not valid TOML ({e})") from None
