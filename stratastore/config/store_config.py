"""``StoreConfig``: a store's settings, the top-level ones and its levels, as one typed record.

See :mod:`stratastore.config` for the forms a configuration is written in; this module holds
the record, its checks, and its readers and writers (a mapping, TOML).
"""

from __future__ import annotations

import dataclasses
import errno
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

from stratastore.config.aliases import (
    ALIASES,
    FLAT,
    alias_conflict,
    flat_mapping,
    flat_value,
    fold,
    index_in_list,
    spelled_as,
)
from stratastore.config.environment import DEFAULT_DIR_LEVEL
from stratastore.config.levels import (
    LevelSpec,
    Setting,
    as_levels,
    check_value,
    dir_problem,
    shown_value,
)
from stratastore.errors import ConfigError
from stratastore.io import files
from stratastore.io.errors import NotARegularFile, StrataIOError
from stratastore.io.modes import file_mode_problem
from stratastore.levels.settings import LevelContext

__all__ = ["MAX_CONFIG_BYTES", "ParkTarget", "RamPrefault", "StoreConfig"]

ParkTarget = Literal["ram", "disk", "auto"]
RamPrefault = Literal["background", "lazy", "open"]
SpillOn = Literal["park", "evict"]
WhenFull = Literal["evict", "reject"]
Retention = Literal["lru", "spread"]

MAX_CONFIG_BYTES = 1 << 20  #: a config is a few hundred bytes; refuse anything near this
_CHOICES: dict[str, tuple[str, ...]] = {
    "park": ("ram", "disk", "auto"),
    "ram_prefault": ("background", "lazy", "open"),
    "spill_on": ("park", "evict"),
    "when_full": ("evict", "reject"),
    "retention": ("lru", "spread"),
}
_AT_LEAST_ONE = ("slots", "checkpoints", "restore_chunk_mib")
T = TypeVar("T")


class _Flat(Generic[T]):
    """A flat setting (``cold_dir``, ``remote_timeout_ms``), read-only: read from the level it
    names, never stored beside it."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> _Flat[T]: ...
    @overload
    def __get__(self, obj: StoreConfig, owner: type[Any]) -> T: ...
    def __get__(self, obj: StoreConfig | None, owner: type[Any]) -> _Flat[T] | T:
        if obj is None:
            return self
        value: T = flat_value(obj.specs, self.name)
        return value


@dataclass(frozen=True, init=False)
class StoreConfig:
    """Settings of a :class:`~stratastore.Store`; see docs/configuration.md.

    The levels are held once, in :attr:`specs`; the flat settings (``warm_dir``, ``cold_mib``,
    ``remote_url``, ...) are taken by the constructor and :meth:`from_mapping` and folded into
    them (:mod:`stratastore.config.aliases`), and read back as properties."""

    ram_mib: int = 8192  #: RAM level byte budget (0: no RAM level)
    slots: int = 4  #: parked conversations the RAM level holds at most
    #: when the RAM arena's pages are faulted in: ``background`` (a chunk on its first use,
    #: and a thread keeps a slot's share of free chunks ready ahead of use), ``lazy`` (only on
    #: first use) or ``open`` (all of it at open: ``ram_mib`` resident before the first call)
    ram_prefault: RamPrefault = "background"
    min_free_mib: int = 2560  #: parking floor: free RAM a capture that stays in RAM must leave
    park_min_free_mib: int = 512  #: transient floor for a disk-bound capture (0: need only)
    park: ParkTarget = "ram"  #: where a parked conversation goes
    spill_on: SpillOn = "park"  #: mirror every park to disk, or write only what RAM evicts
    #: close() writes down what only the RAM level holds, when a disk level exists
    spill_on_close: bool = True
    when_full: WhenFull = "evict"  #: a full last level evicts its oldest, or rejects the new
    checkpoints: int = 6  #: checkpoints kept per conversation, root included
    retention: Retention = "lru"  #: which checkpoint leaves: lru, or spread
    park_truncate: bool = False  #: park the prefix that fits
    min_tokens: int = 0  #: a whole conversation shorter than this is not parked
    #: the engine's context size in tokens (0: the model's, which the store is not told):
    #: park=auto sizes a slot's snapshot as a full context when given (else a slot's share of
    #: ram_mib); ``strata init`` asks it
    context_tokens: int = 0
    page_resume: bool = False  #: attention-only layouts: resume on any whole page too
    ladder: bool = True  #: restore the valid prefix of a damaged image (off: a typed error)
    #: restore_many's requests share one batched read agenda (off: each is read on its own,
    #: in order)
    batch_agenda: bool = True
    restore_chunk_mib: int = 16  #: the apply pass copies at most this much at a time
    #: permission bits of every file the store creates (spec F-DIR-9): private by default;
    #: 0o640 for a store a group shares. Directories get an x bit per r bit (0o700, 0o750).
    file_mode: int = 0o600
    #: a level directory whose parent does not exist is made, parents and all; off, only the
    #: level directory itself is: a config naming ``/nvme/strata`` with no disk mounted at
    #: ``/nvme`` is a ConfigError at open, not a directory on the root filesystem
    create_dirs: bool = False
    #: the system-prompt cache's folder and budget (off when either is empty or 0): the pinned
    #: prefixes conversations share, kept apart from the conversation levels
    prompt_cache_dir: str = ""
    prompt_cache_mib: int = 0
    #: every level, in order (spec F-DIR-2): the disk levels (the first is where parks are
    #: written, each degrades into the next, only the last deletes) and the remote level
    specs: tuple[LevelSpec, ...] = field(default=())

    def __init__(
        self,
        *,
        ram_mib: int = 8192,
        slots: int = 4,
        ram_prefault: RamPrefault = "background",
        min_free_mib: int = 2560,
        park_min_free_mib: int = 512,
        park: ParkTarget = "ram",
        spill_on: SpillOn = "park",
        spill_on_close: bool = True,
        when_full: WhenFull = "evict",
        checkpoints: int = 6,
        retention: Retention = "lru",
        park_truncate: bool = False,
        min_tokens: int = 0,
        context_tokens: int = 0,
        page_resume: bool = False,
        ladder: bool = True,
        batch_agenda: bool = True,
        restore_chunk_mib: int = 16,
        file_mode: int = 0o600,
        create_dirs: bool = False,
        prompt_cache_dir: str = "",
        prompt_cache_mib: int = 0,
        levels: Sequence[LevelSpec | Mapping[str, Any]] = (),
        specs: Sequence[LevelSpec] = (),
        **flat: Any,
    ) -> None:
        """Every setting by keyword; the levels as ``levels`` (a list of :class:`LevelSpec`
        or of ``[[levels]]`` tables), and/or by the flat names (``cold_dir=..., cold_mib=...``,
        ``spill_dir``, ``disk_mib``, ``remote_url``, ``remote_<setting>``), folded into them.
        ``specs`` is what :func:`dataclasses.replace` passes back (the levels as held)."""
        values = {
            "ram_mib": ram_mib,
            "slots": slots,
            "ram_prefault": ram_prefault,
            "min_free_mib": min_free_mib,
            "park_min_free_mib": park_min_free_mib,
            "park": park,
            "spill_on": spill_on,
            "spill_on_close": spill_on_close,
            "when_full": when_full,
            "checkpoints": checkpoints,
            "retention": retention,
            "park_truncate": park_truncate,
            "min_tokens": min_tokens,
            "context_tokens": context_tokens,
            "page_resume": page_resume,
            "ladder": ladder,
            "batch_agenda": batch_agenda,
            "restore_chunk_mib": restore_chunk_mib,
            "file_mode": file_mode,
            "create_dirs": create_dirs,
            "prompt_cache_dir": prompt_cache_dir,
            "prompt_cache_mib": prompt_cache_mib,
        }
        for f in dataclasses.fields(self):
            if f.name in values:
                check_value(
                    f.name,
                    values[f.name],
                    Setting(
                        f.name,
                        f.default,
                        choices=_CHOICES.get(f.name, ()),
                        least=1 if f.name in _AT_LEAST_ONE else 0,
                    ),
                )
                object.__setattr__(self, f.name, values[f.name])
        problem = dir_problem("prompt_cache_dir", prompt_cache_dir)
        if problem is not None:
            raise ConfigError(f"setting {problem}; the system-prompt cache is a local folder")
        problem = file_mode_problem(file_mode)
        if problem is not None:
            raise ConfigError(
                f"setting file_mode: {problem}; use 0o600 (private, the default) "
                "or 0o640 (readable by the group)"
            )
        if levels and specs:
            raise TypeError("StoreConfig takes levels or specs, not both")
        canon: dict[str, Any] = {}  # by canonical name; given_as: as the caller spelled it
        given_as: dict[str, str] = {}
        for key, value in flat.items():
            name = ALIASES.get(key, key)
            if name not in FLAT:
                raise ConfigError(
                    f"unknown setting {key!r}; known settings: "
                    f"{', '.join(sorted(_KNOWN | set(FLAT) | set(ALIASES)))}"
                )
            if name in canon and canon[name] != value:
                secret = FLAT[name][2].secret
                raise ConfigError(
                    f"{given_as[name]}={shown_value(canon[name], secret)} and {key}="
                    f"{shown_value(value, secret)} name the same setting with different "
                    "values; keep one of them"
                )
            canon[name], given_as[name] = value, key
        listed = as_levels(levels or specs)
        # a flat setting of a level the list holds is its alias: given explicitly, it must
        # agree with the level's value (at its default too), as from_mapping checks
        kinds = {"remote": any(s.shared for s in listed), "disk": any(not s.shared for s in listed)}
        aliased = {
            k: canon.pop(k)
            for k in list(canon)
            if kinds["remote" if FLAT[k][0] == "remote" else "disk"]
        }
        object.__setattr__(self, "specs", fold(listed, canon, given_as))
        for name, value in aliased.items():
            have = getattr(self, name)
            if value != have or type(value) is not type(have):
                raise ConfigError(alias_conflict(given_as[name], value, self.specs, name))
        self._check_levels()

    # -- the levels -----------------------------------------------------------------------------

    @property
    def levels(self) -> tuple[LevelSpec, ...]:
        """The disk levels as a ``levels`` list gave them, in order (``()`` when the flat
        settings name them: :meth:`disk_levels` is the list either way)."""
        return tuple(s for s in self.specs if not s.flat and not s.shared)

    @property
    def remote(self) -> LevelSpec | None:
        """The remote level (a shared backend, Redis), given as ``remote_url`` or as a list
        entry with a ``redis://`` URL; None without one."""
        return next((s for s in self.specs if s.shared), None)

    def disk_levels(self) -> tuple[LevelSpec, ...]:
        """The disk levels that are on, in order (spec F-DIR-2): the first is where parks are
        written, each degrades into the next, only the last deletes (``when_full`` applies to
        it). A level is on only with a location and a non-zero budget. From the flat settings:
        warm (when on), then cold (when on), named ``warm`` and ``cold``."""
        return tuple(s for s in self.specs if not s.shared and s.on)

    def setting_name(self, spec: LevelSpec, key: str) -> str:
        """How a message names ``spec``'s ``key`` as the configuration wrote it: ``cold_dir``,
        or ``levels[1] (cold) dir``."""
        return spelled_as(self.specs, spec, key)

    def level_settings(self, spec: LevelSpec) -> dict[str, Any]:
        """The keyword settings ``spec``'s backend opens with
        (:func:`stratastore.levels.registry.open_level`), made by its registry row's
        ``arguments`` hook from the level's settings table and the store's
        :class:`~stratastore.levels.settings.LevelContext` (its budget, ``file_mode``): a
        directory's ``file_mode``; a Redis level's connection settings, credentials included
        (of the config and the URL; the environment's are read when it opens); nothing for a
        memory level. Never shown: the dict may hold credentials."""
        if spec not in self.specs:
            raise ValueError(f"level {spec.name!r} is not a level of this configuration")
        return spec.backend.arguments_for(spec.table(), self._context(spec))

    def _context(self, spec: LevelSpec) -> LevelContext:
        return LevelContext(mib=spec.mib, file_mode=self.file_mode)

    def _check_levels(self) -> None:
        """Each level's settings checked by its backend's row without connecting (the remote
        level: its URL parses, its name is one a key can carry, its budget goes with its
        eviction, spec F-REM-1). Messages name the settings as written: ``remote_mib``, or
        ``levels[2] (remote) mib``."""
        for spec in self.specs:
            where = (
                "" if spec.flat else f"levels[{index_in_list(self.specs, spec)}] ({spec.name}): "
            )

            def label(key: str, spec: LevelSpec = spec) -> str:
                if spec.flat:
                    return f"{spec.name}_{key}"
                return key if key in ("dir", "url", "mib", "max_age_s") else f"settings.{key}"

            try:
                spec.backend.check_level(spec.url, spec.table(), self._context(spec), label)
            except ConfigError as e:
                raise ConfigError(f"{where}{e}") from None

    def __repr__(self) -> str:
        """Every field as the dataclass shows it, each string by :func:`shown_value` (a URL by
        its scheme alone) and the levels by their own ``repr`` (no credential)."""
        shown = ", ".join(
            f"{f.name}={shown_value(v) if isinstance(v, str) else repr(v)}"
            for f in dataclasses.fields(self)
            if (v := getattr(self, f.name)) is not None
        )
        return f"StoreConfig({shown})"

    # -- the flat names, read from the levels -----------------------------------------------------

    warm_dir = _Flat[str]("warm_dir")
    warm_mib = _Flat[int]("warm_mib")
    warm_max_age_s = _Flat[int]("warm_max_age_s")
    cold_dir = _Flat[str]("cold_dir")
    cold_mib = _Flat[int]("cold_mib")
    cold_max_age_s = _Flat[int]("cold_max_age_s")
    remote_url = _Flat[str]("remote_url")
    remote_mib = _Flat[int]("remote_mib")
    remote_name = _Flat[str]("remote_name")
    remote_username = _Flat[str]("remote_username")
    remote_password = _Flat[str]("remote_password")
    remote_tls_ca = _Flat[str]("remote_tls_ca")
    remote_tls_cert = _Flat[str]("remote_tls_cert")
    remote_tls_key = _Flat[str]("remote_tls_key")
    remote_timeout_ms = _Flat[int]("remote_timeout_ms")
    remote_part_mib = _Flat[int]("remote_part_mib")
    remote_eviction = _Flat[Literal["store", "redis"]]("remote_eviction")
    remote_keep_local = _Flat[bool]("remote_keep_local")

    @property
    def warm_on(self) -> bool:
        """A level is on only with a non-empty directory and a non-zero budget."""
        return bool(self.warm_dir) and self.warm_mib > 0

    @property
    def cold_on(self) -> bool:
        return bool(self.cold_dir) and self.cold_mib > 0

    # -- reading and writing ----------------------------------------------------------------------

    @classmethod
    def of(cls, config: StoreConfig | Mapping[str, Any] | str | None) -> StoreConfig:
        """A config as ``Store.open`` takes it: itself, a mapping of settings
        (:meth:`from_mapping`), a TOML file's path (:meth:`from_toml`), or ``None`` for the
        defaults."""
        if config is None:
            return cls()
        if isinstance(config, StoreConfig):
            return config
        if isinstance(config, str):
            return cls.from_toml(config)
        return cls.from_mapping(config)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "config") -> StoreConfig:
        """Build from ``{name: value}``, resolving aliases; refuses conflicts and unknown keys.
        A flat setting of a level the list holds must agree with it even at its default."""
        known = {f.name for f in dataclasses.fields(cls) if f.name != "specs"} | {"levels"}
        resolved: dict[str, Any] = {}
        given_as: dict[str, str] = {}
        for key, value in values.items():
            name = ALIASES.get(key, key)
            if name not in known and name not in FLAT:
                raise ConfigError(
                    f"{source}: unknown setting {key!r}; known settings: "
                    f"{', '.join(sorted(known | set(FLAT) | set(ALIASES)))}"
                )
            if name in resolved and resolved[name] != value:
                secret = name in FLAT and FLAT[name][2].secret
                raise ConfigError(
                    f"{source}: {given_as[name]}={shown_value(resolved[name], secret)} and "
                    f"{key}={shown_value(value, secret)} name the same setting with different "
                    "values; keep one of them"
                )
            resolved[name], given_as[name] = value, key
        listed = as_levels(resolved.get("levels", ()))
        if "levels" in resolved:
            resolved["levels"] = listed
        # a flat setting of a level the list holds is its alias: checked here, after the
        # config is built, against the value it names (given at its default too)
        kinds = {"remote": any(s.shared for s in listed), "disk": any(not s.shared for s in listed)}
        aliased = {
            k: resolved.pop(k)
            for k in list(resolved)
            if k in FLAT and kinds["remote" if FLAT[k][0] == "remote" else "disk"]
        }
        flat = {k: resolved.pop(k) for k in list(resolved) if k in FLAT}
        cfg = cls(**resolved, **{given_as[k]: v for k, v in flat.items()})
        for name, value in aliased.items():
            have = getattr(cfg, name)
            if value != have or type(value) is not type(have):
                raise ConfigError(
                    f"{source}: " + alias_conflict(given_as[name], value, cfg.specs, name)
                )
        if not kinds["disk"]:
            _refuse_half_levels(flat, given_as, source)
        return cfg

    @classmethod
    def from_toml(cls, path: str) -> StoreConfig:
        """Read a TOML file (what ``strata init`` writes): top-level ``name = value`` settings
        and ``[[levels]]`` tables, or the flat settings an older ``strata init`` wrote.

        Read through the io layer (:func:`~stratastore.io.files.read_file`): a FIFO, device or
        directory is refused at once (a FIFO would block the read forever), and so is a file
        over ``MAX_CONFIG_BYTES``; a symbolic link to the config (a dotfiles setup) is
        resolved first, as the user named it on purpose."""
        try:
            data = files.read_file(files.realpath(path), MAX_CONFIG_BYTES)
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
            raise ConfigError(
                f"config file {path} cannot be read: {why}; point it at the TOML "
                "file strata init wrote"
            ) from None
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
        """Every setting by its name, the levels as they were written: the list's entries as
        ``levels`` (a tuple of tables, ``()`` when there is none), the levels of the flat
        settings as those; reads back with :meth:`from_mapping` as an equal config."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "specs"}
        out.update(flat_mapping(self.specs))
        out["levels"] = tuple(s.to_mapping() for s in self.specs if not s.flat)
        return out


def _refuse_half_levels(
    resolved: Mapping[str, Any], given_as: Mapping[str, str], source: str
) -> None:
    """A flat disk level named by half its settings is a mistake, not a level switched off
    (``cold_dir`` without ``cold_mib``); an explicit ``""`` or ``0`` beside the other is one.
    ``cold_mib`` alone is whole: the cold level has a default directory
    (:func:`~stratastore.config.environment.default_cold_dir`); the warm level has none."""
    for level in ("warm", "cold"):
        d, mib = f"{level}_dir", f"{level}_mib"
        if resolved.get(d) and mib not in resolved:
            raise ConfigError(
                f"{source}: {given_as[d]} is set but {level}_mib is not: the {level} level "
                f"needs a budget; set {level}_mib (MiB), or {level}_mib = 0 to keep it off"
            )
        if resolved.get(mib) and d not in resolved and level != DEFAULT_DIR_LEVEL:
            raise ConfigError(
                f"{source}: {given_as[mib]} is set but {level}_dir is not: the {level} level "
                f"needs a directory (only the {DEFAULT_DIR_LEVEL} level has a default one); "
                f"set {level}_dir, or remove {given_as[mib]}"
            )


#: the settings :class:`StoreConfig` takes by name (``levels`` for the list it holds as ``specs``)
_KNOWN = frozenset(f.name for f in dataclasses.fields(StoreConfig) if f.name != "specs") | {
    "levels"
}
