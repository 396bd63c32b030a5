"""The flat settings, the levels' first names: accepted when parsed, folded into the levels.

Before levels were a list, a store's levels were flat settings: ``warm_dir``, ``warm_mib``,
``warm_max_age_s`` (the warm level), ``cold_dir``, ``cold_mib``, ``cold_max_age_s`` (the cold
level, the last; ``spill_dir`` and ``disk_mib`` are older names of its directory and budget),
and ``remote_url``, ``remote_mib`` and ``remote_<key>`` for each setting of the backend the flat
remote settings name (the schema of its registry row,
:func:`~stratastore.levels.registry.flat_shared`). They stay accepted, by
:class:`~stratastore.config.StoreConfig` and in a file, and are folded here into
:class:`~stratastore.config.levels.LevelSpec` values: a config holds every level once, however
it was written, and reads each flat name back from the level it names (:func:`flat_value`).

* Without disk levels in the ``levels`` list, the warm and cold settings *are* those levels
  (named ``warm`` and ``cold``, warm first: spec F-DIR-2's order). ``cold_mib`` without
  ``cold_dir`` places the cold level in the user's cache directory
  (:func:`~stratastore.config.environment.default_cold_dir`); ``cold_dir = ""`` keeps it off.
  With disk levels in the list, they are aliases of its entries named ``warm`` and ``cold``:
  one that names an absent level reads as a level that is off (``""`` and ``0``).
* Without a shared level in the list, the ``remote_*`` settings are the remote level (named
  ``remote``); with one, they are aliases of it.

A flat setting whose level already has another value for it is a
:class:`~stratastore.errors.ConfigError` naming both (:func:`alias_conflict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stratastore.config.environment import DEFAULT_DIR_LEVEL, default_cold_dir
from stratastore.config.levels import (
    REMOTE,
    LevelSpec,
    Setting,
    check_value,
    dir_problem,
    shown_value,
)
from stratastore.errors import ConfigError
from stratastore.levels.registry import backend_for, flat_shared, scheme_of
from stratastore.levels.settings import LevelContext

__all__ = [
    "ALIASES",
    "FLAT",
    "alias_conflict",
    "check_flat",
    "flat_mapping",
    "flat_value",
    "fold",
    "index_in_list",
    "spelled_as",
]

#: older name -> the flat name it stands for (the cold level is the existing disk tier)
ALIASES = {"spill_dir": "cold_dir", "disk_mib": "cold_mib"}
_LEVEL_FIELDS: Mapping[str, Setting] = {
    "dir": Setting("dir", "", "a directory"),
    "mib": Setting("mib", 0),
    "max_age_s": Setting("max_age_s", 0),
    "url": Setting("url", "", f"a {flat_shared().kind} URL", secret=True),  # may carry a password
}
#: flat name -> (the level it names, that level's field or setting, its check)
FLAT: Mapping[str, tuple[str, str, Setting]] = {
    **{
        f"{n}_{k}": (n, k, _LEVEL_FIELDS[k])
        for n in ("warm", "cold")
        for k in ("dir", "mib", "max_age_s")
    },
    "remote_url": (REMOTE, "url", _LEVEL_FIELDS["url"]),
    "remote_mib": (REMOTE, "mib", _LEVEL_FIELDS["mib"]),
    **{f"remote_{k}": (REMOTE, k, s) for k, s in flat_shared().settings.items()},
}
_DISK = tuple(n for n, (level, _, _) in FLAT.items() if level != REMOTE)
_REMOTE = tuple(n for n, (level, _, _) in FLAT.items() if level == REMOTE)


def _read(spec: LevelSpec | None, key: str) -> Any:
    """A level's field or setting ``key``; a level that is absent reads as one that is off."""
    if spec is None:
        return (
            _LEVEL_FIELDS[key].default if key in _LEVEL_FIELDS else FLAT[f"remote_{key}"][2].default
        )
    return getattr(spec, key) if key in _LEVEL_FIELDS else spec.setting(key)


def _named(specs: tuple[LevelSpec, ...], level: str) -> LevelSpec | None:
    """The level a flat name names: the shared level for ``remote``, else the disk level of
    that name."""
    if level == REMOTE:
        return next((s for s in specs if s.shared), None)
    return next((s for s in specs if not s.shared and s.name == level), None)


def flat_value(specs: tuple[LevelSpec, ...], flat: str) -> Any:
    """The flat setting ``flat`` read from the level it names (``warm_dir``: the directory of
    the disk level named ``warm``; ``remote_timeout_ms``: the remote level's setting)."""
    level, key, _ = FLAT[flat]
    return _read(_named(specs, level), key)


def index_in_list(specs: tuple[LevelSpec, ...], spec: LevelSpec) -> int:
    """Where ``spec`` stands in the ``levels`` list as written (the flat levels are not in
    it)."""
    return [s for s in specs if not s.flat].index(spec)


def spelled_as(specs: tuple[LevelSpec, ...], spec: LevelSpec, key: str) -> str:
    """How messages name ``spec``'s ``key`` as it was written: ``cold_mib`` for a level of
    the flat settings, ``levels[1] (cold) mib`` for an entry of the list."""
    if spec.flat:
        return f"{spec.name}_{key}"
    return f"levels[{index_in_list(specs, spec)}] ({spec.name}) {key}"


def alias_conflict(setting: str, value: object, specs: tuple[LevelSpec, ...], flat: str) -> str:
    """The message for a flat setting (given as ``setting``) that disagrees with the level it
    aliases."""
    level, key, _ = FLAT[flat]
    spec = _named(specs, level)
    if spec is not None:
        where = f"levels[{index_in_list(specs, spec)}] ({spec.name})"
        field = key if key in _LEVEL_FIELDS else f"settings.{key}"
        secret = (_LEVEL_FIELDS[key] if key in _LEVEL_FIELDS else FLAT[flat][2]).secret
        have = f"{field}={shown_value(_read(spec, key), secret)}"
        shown = shown_value(value, FLAT[flat][2].secret)
        return (
            f"{setting}={shown} and {where} {have} name the same setting with different "
            f"values; keep one of them (the levels entry)"
        )
    shown = shown_value(value, FLAT[flat][2].secret)
    return (
        f"{setting}={shown} names the {level} level, but levels has no level named "
        f"{level!r}; add it to levels, or remove {setting}"
    )


def check_flat(flat: Mapping[str, Any], given_as: Mapping[str, str] | None = None) -> None:
    """The type and range of each flat setting given, by its own name (what the setting
    was before it was an alias; ``given_as`` names it as written); a directory that holds a
    URL is refused, named by its scheme alone."""
    for name, value in flat.items():
        check_value(name, value, FLAT[name][2])
        if FLAT[name][1] == "dir":
            problem = dir_problem((given_as or {}).get(name, name), value)
            if problem is not None:
                raise ConfigError(f"setting {problem}")


def _agree(
    specs: tuple[LevelSpec, ...],
    flat: Mapping[str, Any],
    names: tuple[str, ...],
    given_as: Mapping[str, str],
) -> None:
    """Each flat setting of ``names`` given at other than its default must agree with the
    level it aliases (one at its default is not told apart from one not given)."""
    for name in names:
        if name not in flat or flat[name] == FLAT[name][2].default:
            continue
        if flat[name] != flat_value(specs, name):
            raise ConfigError(alias_conflict(given_as.get(name, name), flat[name], specs, name))


def _flat_level(level: str, flat: Mapping[str, Any]) -> LevelSpec | None:
    """The level the flat settings of ``level`` spell, or None when all are at their
    defaults."""
    names = _REMOTE if level == REMOTE else tuple(n for n in _DISK if FLAT[n][0] == level)
    given = {FLAT[n][1]: flat[n] for n in names if n in flat and flat[n] != FLAT[n][2].default}
    if not given:
        return None
    fields = {k: given.pop(k) for k in list(given) if k in _LEVEL_FIELDS}
    # a budget alone places the cold level in the default directory; cold_dir = "" keeps it off
    default_dir = (
        level == DEFAULT_DIR_LEVEL and bool(fields.get("mib")) and f"{level}_dir" not in flat
    )
    if default_dir:
        fields["dir"] = default_cold_dir(f"{level}_mib")
    if level == REMOTE and fields.get("url"):
        entry = backend_for(scheme_of(fields["url"]))
        if entry is None or not entry.shared:  # the backend remote_url names says what is wrong
            row = flat_shared()
            table = {k: s.default for k, s in row.settings.items()}
            row.check_level(fields["url"], table, LevelContext(), lambda k: f"remote_{k}")
    return LevelSpec(level, **fields, settings=given, flat=True, default_dir=default_dir)


def fold(
    specs: tuple[LevelSpec, ...], flat: Mapping[str, Any], given_as: Mapping[str, str] | None = None
) -> tuple[LevelSpec, ...]:
    """``specs`` (the list, checked) with the flat settings ``flat`` (by flat name, older names
    resolved; ``given_as`` names them as written) folded in: the levels they spell where the
    list has none of their kind (the warm and cold levels first, the remote level last),
    else checked against the list's entries they alias."""
    given_as = given_as or {}
    check_flat(flat, given_as)
    if any(not s.shared for s in specs):
        _agree(specs, flat, _DISK, given_as)
        disk: list[LevelSpec] = []
    else:
        disk = [lv for lv in (_flat_level(n, flat) for n in ("warm", "cold")) if lv is not None]
    if any(s.shared for s in specs):
        _agree(specs, flat, _REMOTE, given_as)
        remote = None
    else:
        remote = _flat_level(REMOTE, flat)
    return (*disk, *specs, *([remote] if remote is not None else []))


def flat_mapping(specs: tuple[LevelSpec, ...]) -> dict[str, Any]:
    """The flat settings that spell the levels written flat: every field of a flat disk
    level (so no half of a level is missing), and the remote level's fields and the settings
    its table holds."""
    out: dict[str, Any] = {}
    for spec in specs:
        if not spec.flat:
            continue
        if spec.shared:
            out.update(remote_url=spec.url, remote_mib=spec.mib)
            out.update({f"remote_{k}": v for k, v in spec.settings.items()})
        else:
            out.update({f"{spec.name}_{k}": getattr(spec, k) for k in ("dir", "mib", "max_age_s")})
    return out
