"""The levels of a configuration: one :class:`LevelSpec` each, as a ``[[levels]]`` table holds it.

A level has a ``name`` (a-z, 0-9, ``_``, ``-``: it names counters, stats keys and messages), a
location, either ``dir`` (a directory: the local store, spec F-DIR) or ``url`` (a level opened
by URL: ``memory://NAME``, or a Redis level ``redis://``, ``rediss://``, ``redis+cluster://``,
``rediss+cluster://``, spec F-REM), a budget ``mib`` (``0``: the level is off), an age limit
``max_age_s`` (``0``: none) and a table of its own ``settings`` (TOML: ``[levels.settings]``
right after its ``[[levels]]`` table). A level named ``cold`` given a budget and no location is
kept in the user's cache directory (:mod:`stratastore.config.environment`). A level's settings
table is its backend's: the schema its registry row carries
(:class:`~stratastore.levels.registry.BackendEntry`, found by the scheme of its location); this
module checks a table against it and names no backend.

A level on a shared backend (Redis) is *the* remote level: at most one, never a step of the disk
cascade (spec F-DIR-2, "Levels and their order": the list's other levels, in order, are the
store's disk levels). Settings a level cannot take, and values of the wrong type or range, are a
:class:`~stratastore.errors.ConfigError` naming the key as it was written. Credentials are never
shown: a level's ``repr`` leaves out its URL (which may carry ``user:password@``) and hides the
settings its schema marks secret; a ``dir`` that holds a URL is refused, named by its scheme.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from stratastore.config.environment import DEFAULT_DIR_LEVEL, default_cold_dir
from stratastore.errors import ConfigError
from stratastore.format.sidecar import Level
from stratastore.levels.level_keys import INLINE_SECRET_KEYS
from stratastore.levels.registry import SCHEMES, BackendEntry, backend_for, flat_shared, scheme_of
from stratastore.levels.settings import (
    MAX_SETTING,
    Setting,
    check_value,
    padding_problem,
    shown_value,
)

__all__ = [
    "LEVEL_KEYS",
    "MAX_LEVELS",
    "MAX_SETTING",
    "LevelSettings",
    "LevelSpec",
    "Setting",
    "as_levels",
    "check_value",
    "dir_problem",
    "level_byte",
    "shown_value",
]

MAX_LEVELS = 8  #: disk levels a ``levels`` list holds at most (beside one shared level)
#: the keys of a ``[[levels]]`` table (the first four are what a disk level needs)
LEVEL_KEYS = ("name", "dir", "mib", "max_age_s", "url", "settings")
#: the characters of a level's name (it names counters, stats keys and messages)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
REMOTE = "remote"  #: the name the flat settings give the remote level


def dir_problem(key: str, value: str) -> str | None:
    """What is wrong with ``value`` given as the directory ``key`` (a level's ``dir``,
    ``cold_dir``, ``prompt_cache_dir``, ...), or None: a URL is not a directory (named by its
    scheme alone: it may carry a credential), and a ``file://`` URL must name a local path
    (``file:///PATH``); one that begins or ends with whitespace or a control character
    (:func:`~stratastore.levels.settings.padding_problem`) is neither: a URL would pass for a
    relative path."""
    padded = padding_problem(key, value)
    if padded is not None:
        return padded
    scheme = scheme_of(value)
    if not scheme:
        return None
    if scheme == "file":
        if value[len("file://") :].startswith("/") and "@" not in value:
            return None
        return f"{key}=file://... is not a local path; give the path, or file:///PATH"
    return (
        f"{key}={scheme}://... is a URL, not a directory; give a directory path (a level on a "
        "server is a [[levels]] table with url = ...)"
    )


class LevelSettings(Mapping[str, Any]):
    """A level's settings table, read-only and hashable (a :class:`LevelSpec` is a value);
    only the settings that differ from their defaults are held, so two tables that configure
    the same level compare equal. Its ``repr`` hides the settings ``secret`` names (and shows
    a URL by its scheme alone)."""

    __slots__ = ("_items", "_secret")

    def __init__(
        self, values: Mapping[str, Any] | None = None, secret: frozenset[str] = frozenset()
    ) -> None:
        self._items = dict(sorted((values or {}).items()))
        self._secret = secret

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(self._items.items()))

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={shown_value(v, k in self._secret)}" for k, v in self._items.items()
        )
        return f"LevelSettings({shown})"


#: level names the store gives its own levels, refused for a [[levels]] entry ("remote" is the
#: shared level's own)
_RESERVED = {"ram": "RAM level", "remote": "remote level", "prompt_cache": "system-prompt cache"}


def _level_problem(
    name: object, dir: object, mib: object, max_age_s: object, dir_needed: bool
) -> str | None:
    """What is wrong with one level's values (types and ranges), or None."""
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        return (
            f"name={name!r} must be a non-empty name of a-z, 0-9, _ and - (warm, cold, nvme-0, ...)"
        )
    if not isinstance(dir, str) or (dir_needed and not dir):
        return f"dir={shown_value(dir)} must be a non-empty string (a directory)"
    problem = dir_problem("dir", dir)
    if problem is not None:
        return problem
    for key, value in (("mib", mib), ("max_age_s", max_age_s)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SETTING:
            return f"{key}={value!r} must be an integer in 0..{MAX_SETTING}"
    return None


def _url_problem(url: object) -> str | None:
    """What is wrong with a level's ``url``, or None; names its scheme alone (a URL may carry
    a password)."""
    if not isinstance(url, str):
        return "url=<not shown> must be a string (a level's URL)"
    padded = padding_problem("url", url)
    if padded is not None:
        return padded
    scheme = scheme_of(url)
    if scheme in ("", "file") or backend_for(scheme) is None:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES) if s not in ("", "file"))
        what = f"{scheme}://..." if scheme else "<not shown>"
        return f"url={what} names no level backend; use a directory (dir) or one of {known}"
    return None


def settings_problem(
    entry: BackendEntry, settings: Mapping[str, Any], label: Callable[[str], str]
) -> str | None:
    """What is wrong with a level's settings table against its backend's schema (its keys,
    then each value's type and range by :func:`check_value`, ``label(key)`` naming it), or
    None."""
    schema = entry.settings
    if not schema:
        if settings:
            takes = sorted({e.kind for e in SCHEMES.values() if e.settings})
            return (
                f"settings {', '.join(sorted(settings))}: only a {' or '.join(takes)} level "
                f"takes settings (a {entry.kind} level has none)"
            )
        return None
    for key, value in settings.items():
        if key in INLINE_SECRET_KEYS:  # its value is never shown
            return (
                f"setting {label(key)}: a level's secret is never written in the config (the "
                "value is not shown); put it in a file and set key_file, or in an environment "
                "variable and set key_env"
            )
        if key not in schema:
            return (
                f"unknown setting {key!r}; a {entry.kind} level's settings are {', '.join(schema)}"
            )
        try:
            check_value(label(key), value, schema[key])
        except ConfigError as e:
            return str(e)
    return None


@dataclass(frozen=True)
class LevelSpec:
    """One level of :attr:`StoreConfig.specs <stratastore.config.StoreConfig.specs>`.

    ``name`` (a-z, 0-9, ``_``, ``-``; ``warm``, ``cold`` and ``remote`` are the names the
    flat settings alias), ``dir`` (its directory) or ``url`` (a level opened by URL), its
    budget in MiB (``0``: the level is off), its age limit in seconds (``0``: none; segments
    sealed longer ago are degraded into the next level; on the last level, conversations
    sealed longer ago are shortened to their pinned prefix, never sessions) and its own
    ``settings`` (its backend's table: the schema of its registry row, :attr:`backend`; held
    as a :class:`LevelSettings`).

    ``flat`` says the level was spelled by the flat settings (``warm_dir``, ``remote_url``,
    ...): messages then name those, and it may lack a location (``warm_mib = 5`` alone: a
    level that is off, which a ``[[levels]]`` table cannot spell). ``default_dir`` says its
    directory is the cold level's default (a budget was given without one:
    :func:`~stratastore.config.environment.default_cold_dir`): it is made with its parents,
    and named at open. Neither is part of the value: two specs that configure the same level
    compare equal however they were written."""

    name: str
    dir: str = ""
    mib: int = 0
    max_age_s: int = 0
    url: str = field(default="", kw_only=True, repr=False)  #: may carry user:password@
    settings: Mapping[str, Any] = field(default_factory=LevelSettings, kw_only=True)
    flat: bool = field(default=False, kw_only=True, compare=False, repr=False)
    default_dir: bool = field(default=False, kw_only=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        dir_needed = not self.flat and not self.url
        problem = _level_problem(self.name, self.dir, self.mib, self.max_age_s, dir_needed)
        if problem is None and self.url:
            problem = _url_problem(self.url)
            if problem is None and self.dir:
                problem = "dir and url are both set; a level is a directory (dir) or a URL (url)"
        if problem is None and not isinstance(self.settings, Mapping):
            kind = type(self.settings).__name__
            problem = f"settings (a {kind}) must be a table of the level's settings"
        if problem is None:
            problem = settings_problem(self.backend, self.settings, lambda k: k)
        if problem is not None:
            raise ConfigError(f"level {self.name!r}: {problem}")
        schema = self.backend.settings
        held = {
            k: v
            for k, v in self.settings.items()
            if not (v == schema[k].default and type(v) is type(schema[k].default))
        }
        secret = frozenset(k for k, s in schema.items() if s.secret)
        object.__setattr__(self, "settings", LevelSettings(held, secret))

    @property
    def backend(self) -> BackendEntry:
        """The registry row of the backend the level is on, by the scheme of its location: a
        directory's for ``dir`` (or none), the URL's backend for ``url``, and for a flat
        ``remote_*`` level without ``remote_url`` (one that is off) the backend those settings
        name (:func:`~stratastore.levels.registry.flat_shared`)."""
        if self.url:
            entry = backend_for(scheme_of(self.url))
            if entry is not None:
                return entry
        if self.flat and self.name == REMOTE and not self.dir:
            return flat_shared()
        return SCHEMES[""]

    @property
    def shared(self) -> bool:
        """The level is on a shared backend (Redis): the remote level, not a disk level. A
        flat ``remote_*`` level without ``remote_url`` is one too (one that is off)."""
        return self.backend.shared

    @property
    def on(self) -> bool:
        """A level is on only with a location and a non-zero budget."""
        return bool(self.dir or self.url) and self.mib > 0

    def setting(self, key: str) -> Any:
        """The value of one of the level's settings (its default when the table does not set
        it); a key its backend's schema does not hold is a KeyError."""
        return self.settings.get(key, self.backend.settings[key].default)

    def table(self) -> dict[str, Any]:
        """The level's settings table whole: every key of its backend's schema, defaults
        filled in (what the row's ``arguments`` and ``check`` hooks take). Holds credentials:
        never shown."""
        return {k: self.settings.get(k, s.default) for k, s in self.backend.settings.items()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "level") -> LevelSpec:
        """One ``[[levels]]`` table; ``where`` (``levels[1]``) names it in every error."""
        for key in values:
            if key not in LEVEL_KEYS:
                raise ConfigError(
                    f"{where}: unknown key {key!r}; a level has {', '.join(LEVEL_KEYS)}"
                )
        if "name" not in values:
            raise ConfigError(f'{where} has no name; give each level one (name = "warm")')
        label = f"{where} ({values['name']!r})"
        default_dir = (
            values["name"] == DEFAULT_DIR_LEVEL
            and "mib" in values
            and "dir" not in values
            and "url" not in values
        )
        if default_dir:  # a budget alone: the cold level's default directory
            values = {**values, "dir": default_cold_dir(f"{where} ({DEFAULT_DIR_LEVEL}) mib")}
        if "dir" in values and "url" in values:
            raise ConfigError(
                f"{label} has dir and url: a level is a directory or a URL; keep one of them"
            )
        if "dir" in values and "mib" not in values:
            raise ConfigError(
                f"{label} has dir but no mib: the level needs a budget; set mib "
                "(MiB), or mib = 0 to keep it off"
            )
        if "dir" not in values and "url" not in values:
            fix = "set dir, or remove the level" if "mib" in values else "set dir and mib (MiB)"
            raise ConfigError(f"{label} has no dir: the level needs a directory (or a url); {fix}")
        args = {k: values[k] for k in LEVEL_KEYS if k in values}
        problem = _level_problem(
            args["name"],
            args.get("dir", ""),
            args.get("mib", 0),
            args.get("max_age_s", 0),
            "url" not in args,
        )
        if problem is None and "url" in args:
            problem = _url_problem(args["url"])
        settings = args.get("settings", {})
        if problem is None and not isinstance(settings, Mapping):
            problem = f"settings (a {type(settings).__name__}) must be a table ([levels.settings])"
        if problem is None:
            entry = backend_for(scheme_of(args.get("url", "")))
            assert entry is not None  # the URL was checked above
            problem = settings_problem(
                entry, settings, lambda k: f"{where} ({args['name']}) settings.{k}"
            )
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
        return cls(**args, default_dir=default_dir)

    def to_mapping(self) -> dict[str, Any]:
        """The ``[[levels]]`` table of this level: the keys it needs, ``settings`` when it has
        any (reads back with :meth:`from_mapping` as an equal spec)."""
        out: dict[str, Any] = {"name": self.name}
        out.update({"url": self.url} if self.url else {"dir": self.dir})
        out.update(mib=self.mib, max_age_s=self.max_age_s)
        if self.settings:
            out["settings"] = dict(self.settings)
        return out

    def __repr__(self) -> str:
        where = f"url={scheme_of(self.url)}://..." if self.url else f"dir={shown_value(self.dir)}"
        extra = f", settings={self.settings!r}" if self.settings else ""
        return (
            f"LevelSpec(name={self.name!r}, {where}, mib={self.mib}, "
            f"max_age_s={self.max_age_s}{extra})"
        )


def as_levels(value: object) -> tuple[LevelSpec, ...]:
    """``levels`` as given (a list or tuple of :class:`LevelSpec` or of mappings), checked as
    a list: at most :data:`MAX_LEVELS` disk levels and one shared level, names and directories
    unique."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(
            f"setting levels (a {type(value).__name__}) must be a list of levels (TOML: [[levels]] "
            "tables of name, dir or url, mib, max_age_s)"
        )
    if len(value) > MAX_LEVELS + 1:  # refused before any is parsed: a hostile list is long
        raise ConfigError(
            f"setting levels has {len(value)} levels; at most {MAX_LEVELS} disk "
            "levels and one shared level"
        )
    out: list[LevelSpec] = []
    for i, v in enumerate(value):
        if isinstance(v, LevelSpec):
            out.append(v)
        elif isinstance(v, Mapping):
            out.append(LevelSpec.from_mapping(v, f"levels[{i}]"))
        else:
            raise ConfigError(
                f"levels[{i}] (a {type(v).__name__}) must be a level (a table of name, dir or "
                "url, mib, max_age_s)"
            )
    disk = [lv for lv in out if not lv.shared]
    if len(disk) > MAX_LEVELS:
        raise ConfigError(
            f"setting levels has {len(disk)} levels; at most {MAX_LEVELS} disk levels"
        )
    shared = [i for i, lv in enumerate(out) if lv.shared]
    if len(shared) > 1:
        raise ConfigError(
            f"levels[{shared[0]}] and levels[{shared[1]}] are both shared levels "
            f"({out[shared[0]].backend.kind}, {out[shared[1]].backend.kind}); a store has at "
            "most one remote level"
        )
    for i, lv in enumerate(out):  # the names stats() gives the store's other levels
        taken = _RESERVED.get(lv.name)
        if taken is not None and not (lv.shared and lv.name == "remote"):
            raise ConfigError(
                f"levels[{i}] is named {lv.name!r}, the name of the store's {taken} in "
                "stats() and the monitor; give it another name (warm, cold, nvme-0, ...)"
            )
    names: dict[str, int] = {}
    dirs: dict[str, int] = {}
    for i, lv in enumerate(out):
        if lv.name in names:
            raise ConfigError(
                f"levels[{names[lv.name]}] and levels[{i}] are both named "
                f"{lv.name!r}; give each level a name of its own"
            )
        names[lv.name] = i
        if not lv.dir:
            continue
        d = posixpath.normpath(lv.dir)
        if d in dirs:
            raise ConfigError(
                f"levels[{dirs[d]}] ({out[dirs[d]].name}) and levels[{i}] "
                f"({lv.name}) name one directory {lv.dir!r}; give each level a "
                "directory of its own"
            )
        dirs[d] = i
    return tuple(out)


def level_byte(index: int, count: int, name: str) -> Level:
    """The sidecar ``level`` code (spec F-SC-5) a disk level writes: the level at ``index`` of
    the ``count`` disk levels that are on, named ``name``. :data:`Level.WARM` (1) for the first
    of two or more (the level parks are written to) and for a level named ``warm`` that is the
    only one; :data:`Level.COLD` (2) for every other. This is what 1.x writers wrote (warm = 1,
    cold = 2, with or without the other); readers accept 1..2 only."""
    if not 0 <= index < count:
        raise ValueError(f"level index {index} is not in 0..{count - 1}")
    return Level.WARM if index == 0 and (count > 1 or name == "warm") else Level.COLD
