"""Store settings (seed 000's flags as one typed record), read from a mapping or a TOML file.

Every setting has one canonical name; ``spill_dir`` and ``disk_mib`` are aliases of the cold
level's ``cold_dir`` and ``cold_mib`` (the existing disk tier *is* the cold level). Two names of
one setting with different values, an unknown key, or a value of the wrong type or range is a
:class:`ConfigError` naming the key and the fix. The defaults are what a user with no
configuration expects: a RAM level only, every opt-in feature off.

A disk level is on only with a directory *and* a budget (seed 000: "empty / 0 = the level is
off"; each level is switched off by its own budget). A mapping or TOML file that gives one of
the pair and omits the other is a :class:`ConfigError` (a half-configured level, not a level
switched off); an explicit empty directory or ``0`` budget beside the other is allowed, and the
Store warns at start-up that the level is off. Checks that need the filesystem (``warm_dir`` and
``cold_dir`` naming one directory) run when the Store opens its levels.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigError
from .io import files
from .io.errors import NotARegularFile, StrataIOError
from .io.modes import file_mode_problem

__all__ = ["ALIASES", "StoreConfig"]

ParkTarget = Literal["ram", "disk", "auto"]
SpillOn = Literal["park", "evict"]
WhenFull = Literal["evict", "reject"]
Retention = Literal["lru", "spread"]

#: alias -> canonical name (seed 000: the cold level is the existing disk tier's field)
MAX_SETTING = 1 << 40  #: no number setting is near this (MiB: a zettabyte; seconds: 35k years)
MAX_CONFIG_BYTES = 1 << 20  #: a config is a few hundred bytes; refuse anything near this

ALIASES = {"spill_dir": "cold_dir", "disk_mib": "cold_mib"}
_CHOICES: dict[str, tuple[str, ...]] = {
    "park": ("ram", "disk", "auto"),
    "spill_on": ("park", "evict"),
    "when_full": ("evict", "reject"),
    "retention": ("lru", "spread"),
}


@dataclass(frozen=True)
class StoreConfig:
    """Settings of a :class:`~stratastore.Store`; see the README's configuration table."""

    ram_mib: int = 8192  #: RAM level byte budget (0: no RAM level)
    slots: int = 4  #: parked conversations the RAM level holds at most
    min_free_mib: int = 2560  #: parking floor: free RAM a capture that stays in RAM must leave
    park_min_free_mib: int = 512  #: transient floor for a disk-bound capture (0: need only)
    park: ParkTarget = "ram"  #: where a parked conversation goes
    spill_on: SpillOn = "park"  #: mirror every park to disk, or write only what RAM evicts
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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
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
                raise ConfigError(f"setting {f.name}={value!r} must be a string (a directory)")
        for name in ("slots", "checkpoints", "restore_chunk_mib"):
            if getattr(self, name) < 1:
                raise ConfigError(f"setting {name} must be at least 1")
        problem = file_mode_problem(self.file_mode)
        if problem is not None:
            raise ConfigError(f"setting file_mode: {problem}; use 0o600 (private, the default) "
                              "or 0o640 (readable by the group)")  # fmt: skip

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
        cfg = cls(**resolved)  # types and ranges first
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
        return dataclasses.asdict(self)
