"""Store settings (seed 000's flags as one typed record), read from a mapping or a TOML file.

Every setting has one canonical name; ``spill_dir`` and ``disk_mib`` are aliases of the cold
level's ``cold_dir`` and ``cold_mib`` (the existing disk tier *is* the cold level). Two names of
one setting with different values, an unknown key, or a value of the wrong type or range is a
:class:`ConfigError` naming the key and the fix.

The disk levels are an ordered list (issue 12), :meth:`StoreConfig.disk_levels`: the first is
where parks are written, each degrades into the next, only the last deletes. Without a
``levels`` setting the list is derived from the flat settings exactly as before (warm when on,
then cold), so every existing config opens unchanged. With ``levels`` (TOML: ``[[levels]]``
tables of ``name``, ``dir``, ``mib``, ``max_age_s``) the list is the truth, and the flat
``warm_*``/``cold_*`` settings are aliases of its entries named ``warm`` and ``cold`` (an entry
that is absent reads as a level that is off: ``""`` and ``0``): after construction they hold
those entries' values, and one given with another value is a :class:`ConfigError`.

The defaults are what a user with no configuration expects: a RAM level only, every opt-in
feature off.

A disk level is on only with a directory *and* a budget (seed 000: "empty / 0 = the level is
off"; each level is switched off by its own budget). A mapping or TOML file that gives one of
the pair and omits the other is a :class:`ConfigError` (a half-configured level, not a level
switched off); an explicit empty directory or ``0`` budget beside the other is allowed, and the
Store warns at start-up that the level is off. Checks that need the filesystem (``warm_dir`` and
``cold_dir`` naming one directory; a level directory whose parent does not exist, unless
``create_dirs``) run when the Store opens its levels.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from stratastore.errors import ConfigError
from stratastore.format.sidecar import Level
from stratastore.io import files
from stratastore.io.errors import NotARegularFile, StrataIOError
from stratastore.io.modes import file_mode_problem

__all__ = ["ALIASES", "MAX_LEVELS", "LevelSpec", "StoreConfig", "level_byte"]

ParkTarget = Literal["ram", "disk", "auto"]
RamPrefault = Literal["background", "lazy", "open"]
SpillOn = Literal["park", "evict"]
WhenFull = Literal["evict", "reject"]
Retention = Literal["lru", "spread"]
RemoteEviction = Literal["store", "redis"]

#: alias -> canonical name (seed 000: the cold level is the existing disk tier's field)
MAX_SETTING = 1 << 40  #: no number setting is near this (MiB: a zettabyte; seconds: 35k years)
MAX_CONFIG_BYTES = 1 << 20  #: a config is a few hundred bytes; refuse anything near this

ALIASES = {"spill_dir": "cold_dir", "disk_mib": "cold_mib"}
MAX_LEVELS = 8  #: disk levels a ``levels`` list holds at most
#: the characters of a level's name (it names counters, stats keys and messages)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_LEVEL_KEYS = ("name", "dir", "mib", "max_age_s")
#: flat setting -> (the level it is an alias into when ``levels`` is given, that level's field)
_LEVEL_ALIASES = {f"{n}_{k}": (n, k) for n in ("warm", "cold") for k in ("dir", "mib", "max_age_s")}
_CHOICES: dict[str, tuple[str, ...]] = {
    "park": ("ram", "disk", "auto"),
    "ram_prefault": ("background", "lazy", "open"),
    "spill_on": ("park", "evict"),
    "when_full": ("evict", "reject"),
    "retention": ("lru", "spread"),
    "remote_eviction": ("store", "redis"),
}
#: settings that are strings but not directories (their type error says so)
_TEXT = {
    "remote_url": "a Redis URL",
    "remote_name": "a name",
    "remote_username": "a user name",
    "remote_password": "a password",
}


def _level_problem(name: object, dir: object, mib: object, max_age_s: object) -> str | None:
    """What is wrong with one level's values (types and ranges), or None."""
    if not isinstance(name, str) or not name or not set(name) <= _NAME_CHARS:
        return (f"name={name!r} must be a non-empty name of a-z, 0-9, _ and - "
                "(warm, cold, nvme-0, ...)")  # fmt: skip
    if not isinstance(dir, str) or not dir:
        return f"dir={dir!r} must be a non-empty string (a directory)"
    for key, value in (("mib", mib), ("max_age_s", max_age_s)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SETTING:
            return f"{key}={value!r} must be an integer in 0..{MAX_SETTING}"
    return None


@dataclass(frozen=True)
class LevelSpec:
    """One disk level of :attr:`StoreConfig.levels`: its ``name`` (a-z, 0-9, ``_``, ``-``;
    ``warm`` and ``cold`` are the names the flat settings alias), its directory, its budget in
    MiB (``0``: the level is off) and its age limit in seconds (``0``: none; segments sealed
    longer ago are degraded into the next level; on the last level, conversations sealed longer
    ago are shortened to their pinned prefix, never sessions)."""

    name: str
    dir: str
    mib: int
    max_age_s: int = 0

    def __post_init__(self) -> None:
        problem = _level_problem(self.name, self.dir, self.mib, self.max_age_s)
        if problem is not None:
            raise ConfigError(f"level {self.name!r}: {problem}")

    @property
    def on(self) -> bool:
        """A level is on only with a directory (always, here) and a non-zero budget."""
        return self.mib > 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "level") -> LevelSpec:
        """One ``[[levels]]`` table; ``where`` (``levels[1]``) names it in every error."""
        for key in values:
            if key not in _LEVEL_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}; a level has "
                                  f"{', '.join(_LEVEL_KEYS)}")  # fmt: skip
        if "name" not in values:
            raise ConfigError(f'{where} has no name; give each level one (name = "warm")')
        label = f"{where} ({values['name']!r})"
        if "dir" in values and "mib" not in values:
            raise ConfigError(f"{label} has dir but no mib: the level needs a budget; set mib "
                              "(MiB), or mib = 0 to keep it off")  # fmt: skip
        if "dir" not in values:
            fix = "set dir, or remove the level" if "mib" in values else "set dir and mib (MiB)"
            raise ConfigError(f"{label} has no dir: the level needs a directory; {fix}")
        args = {k: values[k] for k in _LEVEL_KEYS if k in values}
        problem = _level_problem(args["name"], args["dir"], args["mib"], args.get("max_age_s", 0))
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
        return cls(**args)

    def to_mapping(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _as_levels(value: object) -> tuple[LevelSpec, ...]:
    """``levels`` as given (a list or tuple of :class:`LevelSpec` or of mappings), checked as
    a list: at most MAX_LEVELS, names and directories unique."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"setting levels={value!r} must be a list of levels (TOML: [[levels]] "
                          "tables of name, dir, mib, max_age_s)")  # fmt: skip
    if len(value) > MAX_LEVELS:
        raise ConfigError(f"setting levels has {len(value)} levels; at most {MAX_LEVELS}")
    out: list[LevelSpec] = []
    for i, v in enumerate(value):
        if isinstance(v, LevelSpec):
            out.append(v)
        elif isinstance(v, Mapping):
            out.append(LevelSpec.from_mapping(v, f"levels[{i}]"))
        else:
            raise ConfigError(f"levels[{i}]={v!r} must be a level (a table of name, dir, mib, "
                              "max_age_s)")  # fmt: skip
    names: dict[str, int] = {}
    dirs: dict[str, int] = {}
    for i, lv in enumerate(out):
        if lv.name in names:
            raise ConfigError(f"levels[{names[lv.name]}] and levels[{i}] are both named "
                              f"{lv.name!r}; give each level a name of its own")  # fmt: skip
        d = os.path.normpath(lv.dir)
        if d in dirs:
            raise ConfigError(f"levels[{dirs[d]}] ({out[dirs[d]].name}) and levels[{i}] "
                              f"({lv.name}) name one directory {lv.dir!r}; give each level a "
                              "directory of its own")  # fmt: skip
        names[lv.name], dirs[d] = i, i
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


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a :class:`~stratastore.Store`; see docs/configuration.md."""

    ram_mib: int = 8192  #: RAM level byte budget (0: no RAM level)
    slots: int = 4  #: parked conversations the RAM level holds at most
    #: when the RAM arena's pages are faulted in (issue 14): ``background`` (a chunk on its first
    #: use, and a thread keeps a slot's share of free chunks ready ahead of use), ``lazy`` (only
    #: on first use) or ``open`` (all of it at open: ``ram_mib`` resident before the first call)
    ram_prefault: RamPrefault = "background"
    min_free_mib: int = 2560  #: parking floor: free RAM a capture that stays in RAM must leave
    park_min_free_mib: int = 512  #: transient floor for a disk-bound capture (0: need only)
    park: ParkTarget = "ram"  #: where a parked conversation goes
    spill_on: SpillOn = "park"  #: mirror every park to disk, or write only what RAM evicts
    #: close() writes down what only the RAM level holds, when a disk level exists (issue 14)
    spill_on_close: bool = True
    warm_dir: str = ""  #: warm disk level (off unless both dir and budget are set)
    warm_mib: int = 0
    cold_dir: str = ""  #: cold disk level, the last: only it deletes (aliases spill_dir)
    cold_mib: int = 0  #: (alias disk_mib)
    when_full: WhenFull = "evict"  #: a full last level evicts its oldest, or rejects the new
    warm_max_age_s: int = 0  #: degrade warm entries older than this (0: no age limit)
    cold_max_age_s: int = 0  #: delete cold entries older than this (0: no age limit)
    checkpoints: int = 6  #: checkpoints kept per conversation, root included
    retention: Retention = "lru"  #: which checkpoint leaves: lru, or spread (seed 004)
    park_truncate: bool = False  #: park the prefix that fits (seed 001)
    min_tokens: int = 0  #: a whole conversation shorter than this is not parked
    context_tokens: int = 0  #: the engine's context size: sizes park=auto's snapshot estimate
    page_resume: bool = False  #: attention-only layouts: resume on any whole page too
    ladder: bool = True  #: restore the valid prefix of a damaged image (off: a typed error)
    restore_chunk_mib: int = 16  #: the apply pass copies at most this much at a time
    #: permission bits of every file the store creates (spec F-DIR-9): private by default;
    #: 0o640 for a store a group shares. Directories get an x bit per r bit (0o700, 0o750).
    file_mode: int = 0o600
    #: a level directory whose parent does not exist is made, parents and all; off, only the
    #: level directory itself is: a config naming ``/nvme/strata`` with no disk mounted at
    #: ``/nvme`` is a ConfigError at open, not a directory on the root filesystem
    create_dirs: bool = False
    #: the disk levels in order (empty: warm then cold, from the flat settings); see the module
    #: docstring. Given as a list or tuple of LevelSpec or of mappings; held as a tuple.
    levels: tuple[LevelSpec, ...] = ()
    #: the shared remote level (issue 17): ``redis://host:port/0``, ``rediss://`` (TLS) or
    #: ``redis+cluster://host:port,host:port`` (empty: off). It needs a local disk level.
    remote_url: str = field(default="", repr=False)  #: (a URL may carry a password)
    remote_name: str = "default"  #: the store's name in the namespace of every key it writes
    #: who evicts: ``store`` (this store deletes its oldest segments past ``remote_mib``) or
    #: ``redis`` (the server's ``maxmemory`` with an LRU policy; ``remote_mib`` is not used)
    remote_eviction: RemoteEviction = "store"
    remote_mib: int = 0  #: the remote level's budget with remote_eviction=store
    remote_keep_local: bool = True  #: a restore from the remote level is kept locally too
    remote_part_mib: int = 16  #: a segment is stored in Redis values of at most this size
    remote_timeout_ms: int = 5000  #: every Redis call: connect, read, write
    #: credentials (else ``STRATA_REMOTE_USERNAME``/``STRATA_REMOTE_PASSWORD``, else the URL's);
    #: never shown in a message, ``strata monitor`` or Prometheus
    remote_username: str = field(default="", repr=False)
    remote_password: str = field(default="", repr=False)
    remote_tls_ca: str = ""  #: CA file of the server's certificate (rediss://)
    remote_tls_cert: str = ""  #: a client certificate and its key, when the server asks
    remote_tls_key: str = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "levels":
                continue  # checked below, after the flat settings it may conflict with
            if f.name in _CHOICES:
                if value not in _CHOICES[f.name]:
                    raise ConfigError(
                        f"setting {f.name}={value!r} is not one of {', '.join(_CHOICES[f.name])}"
                    )
            elif isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"setting {f.name}={value!r} must be true or false")
            elif isinstance(f.default, int):
                if (isinstance(value, bool) or not isinstance(value, int)
                        or not 0 <= value <= MAX_SETTING):  # fmt: skip
                    raise ConfigError(
                        f"setting {f.name}={value!r} must be an integer in 0..{MAX_SETTING}"
                    )
            elif not isinstance(value, str):
                what = _TEXT.get(f.name, "a directory" if f.name.endswith("dir") else "a path")
                # a credential, or a URL that may carry one, is never shown
                secret = f.name in ("remote_password", "remote_username", "remote_url")
                shown = "<hidden>" if secret else repr(value)
                raise ConfigError(f"setting {f.name}={shown} must be a string ({what})")
        for name in ("slots", "checkpoints", "restore_chunk_mib", "remote_part_mib",
                     "remote_timeout_ms"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name} must be at least 1")
        problem = file_mode_problem(self.file_mode)
        if problem is not None:
            raise ConfigError(f"setting file_mode: {problem}; use 0o600 (private, the default) "
                              "or 0o640 (readable by the group)")  # fmt: skip
        levels = _as_levels(self.levels)
        object.__setattr__(self, "levels", levels)
        if levels:
            self._sync_level_aliases()
        self._check_remote()

    def _check_remote(self) -> None:
        """The remote level's settings, checked without connecting (issue 17): its URL parses,
        its name is one a key can carry, its budget goes with ``remote_eviction=store``."""
        from stratastore.levels.redis.settings import RemoteSettings, check_name

        check_name(self.remote_name)
        if not self.remote_url:
            return
        RemoteSettings.from_config(self, env={})
        if self.remote_eviction == "store" and self.remote_mib == 0:
            raise ConfigError("setting remote_url is set with remote_eviction=store but "
                              "remote_mib=0: give the remote level a budget (MiB), or let "
                              "Redis evict (remote_eviction = \"redis\", with maxmemory and "
                              "an LRU policy on the server)")  # fmt: skip
        if self.remote_eviction == "redis" and self.remote_mib:
            raise ConfigError(f"setting remote_mib={self.remote_mib} is not used with "
                              "remote_eviction=redis (the server's maxmemory is the budget); "
                              "set remote_mib = 0, or remote_eviction = \"store\"")  # fmt: skip

    def _sync_level_aliases(self) -> None:
        """With ``levels`` given, set each flat ``warm_*``/``cold_*`` setting from the entry it
        aliases (absent: ``""``/``0``, a level that is off); one left at its default takes the
        entry's value, one given with another value is a conflict. (An explicit default beside
        a different entry is caught by :meth:`from_mapping`, which knows what was given.)"""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        by_name = {lv.name: lv for lv in self.levels}
        for setting, (name, key) in _LEVEL_ALIASES.items():
            want = getattr(by_name[name], key) if name in by_name else defaults[setting]
            have = getattr(self, setting)
            if have != defaults[setting] and have != want:
                raise ConfigError(_alias_conflict(setting, have, self.levels, name, key))
            object.__setattr__(self, setting, want)

    def disk_levels(self) -> tuple[LevelSpec, ...]:
        """The disk levels that are on, in order: the first is where parks are written, each
        degrades into the next, only the last deletes (``when_full`` applies to it). A level is
        on only with a directory and a non-zero budget. Without ``levels``: warm (when on),
        then cold (when on), named ``warm`` and ``cold``, as before issue 12."""
        if self.levels:
            return tuple(lv for lv in self.levels if lv.on)
        flat = (LevelSpec("warm", self.warm_dir, self.warm_mib, self.warm_max_age_s)
                if self.warm_on else None,
                LevelSpec("cold", self.cold_dir, self.cold_mib, self.cold_max_age_s)
                if self.cold_on else None)  # fmt: skip
        return tuple(lv for lv in flat if lv is not None)

    @property
    def warm_on(self) -> bool:
        """A level is on only with a non-empty directory and a non-zero budget."""
        return bool(self.warm_dir) and self.warm_mib > 0

    @property
    def cold_on(self) -> bool:
        return bool(self.cold_dir) and self.cold_mib > 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "config") -> StoreConfig:
        """Build from ``{name: value}``, resolving aliases; refuses conflicts and unknown keys."""
        known = {f.name for f in dataclasses.fields(cls)}
        resolved: dict[str, Any] = {}
        given_as: dict[str, str] = {}
        for key, value in values.items():
            name = ALIASES.get(key, key)
            if name not in known:
                raise ConfigError(
                    f"{source}: unknown setting {key!r}; known settings: "
                    f"{', '.join(sorted(known | set(ALIASES)))}"
                )
            if name in resolved and resolved[name] != value:
                raise ConfigError(
                    f"{source}: {given_as[name]}={resolved[name]!r} and {key}={value!r} name the "
                    f"same setting with different values; keep one of them"
                )
            resolved[name], given_as[name] = value, key
        # with a list, the flat level settings are its aliases: each one given must agree with
        # the entry it names (checked here, not in __post_init__, to name the key as given)
        flat = ({k: resolved.pop(k) for k in _LEVEL_ALIASES if k in resolved}
                if resolved.get("levels") else {})  # fmt: skip
        cfg = cls(**resolved)  # types and ranges first
        if cfg.levels:
            for name, value in flat.items():
                if value != getattr(cfg, name) or type(value) is not type(getattr(cfg, name)):
                    level, key = _LEVEL_ALIASES[name]
                    raise ConfigError(f"{source}: " + _alias_conflict(
                        given_as[name], value, cfg.levels, level, key))  # fmt: skip
            return cfg
        for level in ("warm", "cold"):  # a level named by half its settings is a mistake
            d, mib = f"{level}_dir", f"{level}_mib"
            if resolved.get(d) and mib not in resolved:
                raise ConfigError(
                    f"{source}: {given_as[d]} is set but {level}_mib is not: the {level} level "
                    f"needs a budget; set {level}_mib (MiB), or {level}_mib = 0 to keep it off"
                )
            if resolved.get(mib) and d not in resolved:
                raise ConfigError(
                    f"{source}: {given_as[mib]} is set but {level}_dir is not: the {level} level "
                    f"needs a directory; set {level}_dir, or remove {given_as[mib]}"
                )
        return cfg

    @classmethod
    def from_toml(cls, path: str) -> StoreConfig:
        """Read a TOML file of top-level ``name = value`` settings (what ``strata init`` writes).

        Read through the io layer (:func:`~stratastore.io.files.read_file`): a FIFO, device or
        directory is refused at once (a FIFO would block the read forever), and so is a file
        over ``MAX_CONFIG_BYTES``; a symbolic link to the config (a dotfiles setup) is
        resolved first, as the user named it on purpose."""
        try:
            data = files.read_file(os.path.realpath(path), MAX_CONFIG_BYTES)
        except StrataIOError as e:
            if e.errno == errno.ENOENT:
                raise ConfigError(
                    f"config file {path} does not exist; create it with strata init"
                ) from None
            if isinstance(e, NotARegularFile):
                why = f"it is {e.kind}, not a regular file"
            elif e.errno == errno.EFBIG:
                why = f"it is over {MAX_CONFIG_BYTES:,} bytes, not a config file"
            else:
                why = str(e)
            raise ConfigError(f"config file {path} cannot be read: {why}; point it at the TOML "
                              "file strata init wrote") from None  # fmt: skip
        return cls.from_toml_bytes(data, path)

    @classmethod
    def from_toml_bytes(cls, data: bytes, source: str = "config") -> StoreConfig:
        """Parse TOML bytes (at most MAX_CONFIG_BYTES) as :meth:`from_toml` does."""
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{source} is over {MAX_CONFIG_BYTES:,} bytes; not a config file")
        try:
            doc = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"config file {source} cannot be read: {e}") from None
        return cls.from_mapping(doc, source)

    def to_mapping(self) -> dict[str, Any]:
        """Every setting by its canonical name (``levels`` as a tuple of tables, ``()`` when
        not given, as the default compares); reads back with :meth:`from_mapping` as an equal
        config."""
        return dataclasses.asdict(self)


def _alias_conflict(setting: str, value: object, levels: tuple[LevelSpec, ...], name: str,
                    key: str) -> str:  # fmt: skip
    """The message for a flat setting that disagrees with the ``levels`` entry it aliases."""
    for i, lv in enumerate(levels):
        if lv.name == name:
            return (f"{setting}={value!r} and levels[{i}] ({name}) {key}={getattr(lv, key)!r} "
                    f"name the same setting with different values; keep one of them (the "
                    f"levels entry)")  # fmt: skip
    return (f"{setting}={value!r} names the {name} level, but levels has no level named "
            f"{name!r}; add it to levels, or remove {setting}")  # fmt: skip
