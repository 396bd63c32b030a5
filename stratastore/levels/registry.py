"""Opening a level from its spec: one table from URL scheme to backend, open to backends from
outside the package.

A level spec is a directory path (or ``file:///PATH``), ``memory://NAME``, a Redis URL
(``redis://``, ``rediss://``, ``redis+cluster://``, ``rediss+cluster://``) or a URL of a backend
registered from outside. :func:`open_level` picks the backend by the scheme and opens it for one
model fingerprint and one level byte (spec F-SC-5: the level a segment's sidecar records).

Each backend is one row, a :class:`BackendEntry`: how messages name it, its opener, the schema
of its level's settings table (:class:`~stratastore.levels.settings.Setting` by key), whether a
level on it is shared by several nodes (the store's remote level, spec F-REM), and optional
hooks: the arguments its opener takes, made from the table and the store's
:class:`~stratastore.levels.settings.LevelContext`; a check of a level's settings without
connecting; a check (fsck) of a shared level's store (:func:`fsck_shared`). What an opener is
handed is checked at the one place every opener is called (:meth:`BackendEntry.open`): an
argument it does not take is a :class:`~stratastore.errors.ConfigError` naming it, the level
and the arguments it takes (:meth:`BackendEntry.takes_arguments`), never the opener's own
``TypeError``. The configuration
(``stratastore.config``) validates a level against its row and names no backend; nothing above
the seam names one. A hook given as ``"module:function"`` is imported at its first use, so a
backend whose client is an extra (Redis) is imported only when a spec names it.

A backend from outside is registered by :func:`register_backend`, or found by its scheme in the
entry-point group :data:`ENTRY_POINTS` (``stratastore.levels``) the first time a spec names a
scheme no row serves; the entry point's object is a :class:`BackendEntry` (or a callable
without arguments that returns one)::

    [project.entry-points."stratastore.levels"]
    s3 = "mypackage.strata_s3:BACKEND"
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from types import MappingProxyType
from typing import Any

from stratastore.errors import ConfigError
from stratastore.format import Level, ModelFingerprint
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.level_keys import KEY_SETTINGS
from stratastore.levels.redis.settings import LEVEL_SETTINGS as _REDIS_SETTINGS
from stratastore.levels.settings import (
    LevelContext,
    Setting,
    padding_problem,
    scheme_of,
    shown_value,
)
from stratastore.levels.shared_check import SharedLevelCheck

__all__ = [
    "ENTRY_POINTS",
    "FLAT_SHARED",
    "SCHEMES",
    "Arguments",
    "BackendEntry",
    "LevelCheck",
    "Opener",
    "SharedFsck",
    "backend_for",
    "flat_shared",
    "fsck_shared",
    "open_level",
    "register_backend",
    "scheme_of",
    "unregister_backend",
]

#: ``open(spec, fingerprint, level, arguments)``: the level, made (it may connect lazily)
Opener = Callable[[str, ModelFingerprint, Level, Mapping[str, Any]], SegmentBackend]
#: ``arguments(table, context)``: what the opener takes, from the level's settings table
#: (every key of the schema, defaults filled in) and what the store gives every level
Arguments = Callable[[Mapping[str, Any], LevelContext], dict[str, Any]]
#: ``check(url, table, context, label)``: a level's settings checked without connecting, a
#: :class:`~stratastore.errors.ConfigError` when wrong; ``label(key)`` names a level field
#: (``url``, ``mib``) or a setting as the configuration wrote it
LevelCheck = Callable[[str, Mapping[str, Any], LevelContext, Callable[[str], str]], None]
#: ``fsck(url, arguments, repair, deep)``: the shared level's store checked (every namespace)
SharedFsck = Callable[[str, Mapping[str, Any], bool, bool], SharedLevelCheck]

ENTRY_POINTS = "stratastore.levels"  #: the entry-point group backends from outside register in
_MEMORY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NEW_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,31}")


@dataclass(frozen=True, eq=False)
class BackendEntry:
    """One backend as the registry knows it (see the module). ``opener`` and the hooks are
    callables or ``"module:function"`` (imported at first use). Without ``arguments`` the opener
    takes the settings table as it is (defaults filled in); without ``check`` a level's settings
    are checked by their schema alone; without ``fsck`` ``strata fsck --remote`` says the
    backend has no check."""

    kind: str  #: how messages name the backend: "a {kind} level" ("Redis", "directory")
    opener: Opener | str
    settings: Mapping[str, Setting] = field(default_factory=dict)  #: its table's schema
    shared: bool = False  #: a level on it is shared by several nodes: the remote level
    arguments: Arguments | str | None = None
    check: LevelCheck | str | None = None
    fsck: SharedFsck | str | None = None
    #: the names of the arguments its opener takes; None: those :meth:`takes_arguments` derives
    takes: tuple[str, ...] | None = None

    def open(
        self, spec: str, fingerprint: ModelFingerprint, level: Level, args: Mapping[str, Any]
    ) -> SegmentBackend:
        """Open the level ``spec`` with the opener's arguments ``args``; an argument the
        opener does not take (:meth:`takes_arguments`) is a
        :class:`~stratastore.errors.ConfigError` naming it, the level (a URL by its scheme
        alone) and the arguments it takes, before the opener is called."""
        taken = self.takes_arguments()
        unknown = sorted(str(k) for k in args if k not in taken)
        if unknown:
            takes = f"its settings are {', '.join(taken)}" if taken else "it takes no settings"
            raise ConfigError(
                f"level {shown_value(spec)}: {'settings' if len(unknown) > 1 else 'setting'} "
                f"{', '.join(map(repr, unknown))} {'are' if len(unknown) > 1 else 'is'} not "
                f"one a {self.kind} level takes; {takes}"
            )
        opener: Opener = _resolve(self.opener)
        return opener(spec, fingerprint, level, args)

    def takes_arguments(self) -> tuple[str, ...]:
        """The names of the arguments the opener takes (what :func:`open_level`'s
        ``settings`` may hold): :attr:`takes` when the row says; else the keys the
        ``arguments`` hook makes of the schema's defaults (what a configured level is opened
        with), or, without the hook, the schema's keys (the opener takes the table)."""
        if self.takes is not None:
            return self.takes
        defaults = {k: s.default for k, s in self.settings.items()}
        return tuple(self.arguments_for(defaults, LevelContext()))

    def arguments_for(self, table: Mapping[str, Any], context: LevelContext) -> dict[str, Any]:
        """What the opener takes for a level with settings ``table`` (see :data:`Arguments`)."""
        if self.arguments is None:
            return dict(table)
        made: Arguments = _resolve(self.arguments)
        return made(table, context)

    def check_level(
        self,
        url: str,
        table: Mapping[str, Any],
        context: LevelContext,
        label: Callable[[str], str],
    ) -> None:
        """The row's own check of a level (see :data:`LevelCheck`); nothing without one."""
        if self.check is not None:
            check: LevelCheck = _resolve(self.check)
            check(url, table, context, label)


def _resolve(hook: Any) -> Any:
    """A hook as given, or the function a ``"module:function"`` names (imported now)."""
    if not isinstance(hook, str):
        return hook
    module, _, name = hook.partition(":")
    return getattr(importlib.import_module(module), name)


_HERE = "stratastore.levels.registry"
_REDIS = "stratastore.levels.redis.settings"
_DIRECTORY = BackendEntry(
    "directory",
    f"{_HERE}:_open_directory",
    settings=KEY_SETTINGS,  # a keyed level's secrets: where they are (spec F-KEYED)
    arguments=f"{_HERE}:_dir_args",
    check=f"{_HERE}:_dir_check",
    # create: the offline tools open a level that must exist; keys: the keys a tool read already
    takes=("file_mode", "create", *KEY_SETTINGS, "keys"),
)
_RED = BackendEntry(
    "Redis",
    f"{_HERE}:_open_redis",
    settings=_REDIS_SETTINGS,
    shared=True,
    arguments=f"{_REDIS}:level_arguments",
    check=f"{_REDIS}:check_level",
    fsck="stratastore.levels.redis.fsck:fsck_level",
)
_ROWS: dict[str, BackendEntry] = {  # scheme -> its backend; ``""`` is a plain directory path
    "": _DIRECTORY,
    "file": _DIRECTORY,
    "memory": BackendEntry("memory", f"{_HERE}:_open_memory"),
    "redis": _RED,
    "rediss": _RED,
    "redis+cluster": _RED,
    "rediss+cluster": _RED,
}
_BUILT_IN = frozenset(_ROWS)
_LOCK = threading.Lock()
#: scheme -> its backend, every row registered so far (read-only; :func:`register_backend`)
SCHEMES: Mapping[str, BackendEntry] = MappingProxyType(_ROWS)
#: the scheme whose settings the flat ``remote_*`` settings name (the remote level as it was
#: written before levels were a list), and the backend a shared level without a URL is on
FLAT_SHARED = "redis"


def register_backend(scheme: str, entry: BackendEntry, *, replace: bool = False) -> None:
    """Serve levels whose spec is ``scheme://...`` by ``entry``, from now on, in this process
    (a backend from outside the package; :data:`ENTRY_POINTS` registers one by installing it).
    ``scheme`` is a lower-case URL scheme (RFC 3986); a scheme already served is a
    :class:`~stratastore.errors.ConfigError` unless ``replace`` (never a built-in one)."""
    if not isinstance(entry, BackendEntry):
        raise ConfigError(
            f"register_backend({scheme!r}, ...) takes a BackendEntry, not a {type(entry).__name__}"
        )
    if not isinstance(scheme, str) or not _NEW_SCHEME.fullmatch(scheme):
        raise ConfigError(
            f"register_backend: scheme {scheme!r} is not a lower-case URL scheme (a letter, "
            "then letters, digits, +, - or ., at most 32); name the backend by one"
        )
    with _LOCK:
        if scheme in _BUILT_IN or (scheme in _ROWS and not replace):
            raise ConfigError(
                f"register_backend: {scheme}:// is already served by the {_ROWS[scheme].kind} "
                "backend; choose another scheme"
                + ("" if scheme in _BUILT_IN else " (or pass replace=True)")
            )
        _ROWS[scheme] = entry


def unregister_backend(scheme: str) -> None:
    """Stop serving ``scheme://`` (one :func:`register_backend` registered; a built-in scheme
    stays). Levels already open are not affected."""
    with _LOCK:
        if scheme not in _BUILT_IN:
            _ROWS.pop(scheme, None)


def backend_for(scheme: str) -> BackendEntry | None:
    """The backend serving ``scheme`` (``""``: a directory path), or None. A scheme no row
    serves is looked up once in the entry-point group :data:`ENTRY_POINTS` and registered
    when an entry point of that name is installed."""
    entry = _ROWS.get(scheme)
    if entry is not None or not _NEW_SCHEME.fullmatch(scheme):
        return entry
    return _from_entry_points(scheme)


def _from_entry_points(scheme: str) -> BackendEntry | None:
    """The backend the installed entry point ``scheme`` of :data:`ENTRY_POINTS` names,
    registered; None when none is installed. One that cannot be loaded, or loads to something
    else than a :class:`BackendEntry`, is a ConfigError naming it."""
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINTS) if ep.name == scheme]
    if not found:
        return None
    ep = found[0]
    try:
        obj = ep.load()
        entry = obj if isinstance(obj, BackendEntry) or not callable(obj) else obj()
    except Exception as e:
        raise ConfigError(
            f"the level backend for {scheme}:// (entry point {ep.value} in {ENTRY_POINTS}) "
            f"cannot be loaded: {type(e).__name__}: {e}; reinstall the package that provides it"
        ) from None
    if not isinstance(entry, BackendEntry):
        raise ConfigError(
            f"the entry point {ep.value} for {scheme}:// in {ENTRY_POINTS} gives a "
            f"{type(entry).__name__}, not a BackendEntry; the package that provides it must "
            "point it at one"
        )
    with _LOCK:
        return _ROWS.setdefault(scheme, entry)


def entry_for(spec: str | PurePath) -> BackendEntry:
    """The backend serving ``spec``'s scheme; a scheme none serves is a
    :class:`~stratastore.errors.ConfigError` naming the schemes there are (and never the URL:
    it may carry a credential); so is a spec that begins or ends with whitespace or a control
    character (:func:`~stratastore.levels.settings.padding_problem`: a URL would pass for a
    relative path), before anything is opened or made."""
    padded = padding_problem("level", str(spec))
    if padded is not None:
        raise ConfigError(padded)
    scheme = scheme_of(spec)
    entry = backend_for(scheme)
    if entry is None:
        known = ", ".join(f"{s}://" for s in _ROWS if s)
        raise ConfigError(
            f"level {scheme}://... names no backend; use a directory path or one of {known}"
        )
    return entry


def flat_shared() -> BackendEntry:
    """The backend the flat ``remote_*`` settings name (:data:`FLAT_SHARED`)."""
    return _ROWS[FLAT_SHARED]


def open_level(
    spec: str | PurePath,
    fingerprint: ModelFingerprint,
    level: Level = Level.COLD,
    settings: Mapping[str, Any] | None = None,
) -> SegmentBackend:
    """Open the level ``spec`` for ``fingerprint``, its segments sealed as ``level``.

    ``settings`` are what the backend's opener takes (a directory's ``file_mode``, ``create``
    and where a keyed level's secrets are, ``key_file`` or ``key_env``, read now; a Redis
    level's ``name``, ``password``, ``timeout_s``, ...: what ``StoreConfig.level_settings``
    makes by the row's ``arguments`` hook). A scheme no backend serves is a
    :class:`~stratastore.errors.ConfigError` naming the schemes there are. Never
    shows a credential: a URL is named by its scheme alone."""
    return entry_for(spec).open(str(spec), fingerprint, level, settings or {})


def fsck_shared(
    url: str, arguments: Mapping[str, Any], *, repair: bool = False, deep: bool = False
) -> SharedLevelCheck:
    """Check the store of the shared level at ``url`` (every namespace of its store name, and
    nothing else) by its backend's ``fsck`` hook, ``arguments`` as its opener takes them; with
    ``repair``, fix what can be fixed without losing valid data. A backend without the hook is
    a :class:`~stratastore.errors.ConfigError`."""
    entry = entry_for(url)
    if not entry.shared or entry.fsck is None:
        raise ConfigError(
            f"the level {scheme_of(url)}://... ({entry.kind}) has no check of a shared level's "
            "store; check it with its own tools"
        )
    fsck: SharedFsck = _resolve(entry.fsck)
    return fsck(url, arguments, repair, deep)


def _dir_args(table: Mapping[str, Any], context: LevelContext) -> dict[str, Any]:
    args: dict[str, Any] = {"file_mode": context.file_mode}
    args.update((k, table[k]) for k in KEY_SETTINGS if table.get(k))
    return args


def _dir_check(
    url: str, table: Mapping[str, Any], context: LevelContext, label: Callable[[str], str]
) -> None:
    from stratastore.levels.level_keys import check_key_settings

    check_key_settings(table, label)


def _open_directory(
    spec: str, fingerprint: ModelFingerprint, level: Level, settings: Mapping[str, Any]
) -> SegmentBackend:
    from stratastore.levels.level_keys import level_keys
    from stratastore.levels.local import SegmentStore

    path = spec[len("file://") :] if spec.lower().startswith("file://") else spec
    args = {k: v for k, v in settings.items() if k not in (*KEY_SETTINGS, "keys")}
    keys = settings.get("keys")  # keys read already (a tool's), else where the secrets are
    if keys is None:
        keys = level_keys({k: settings[k] for k in KEY_SETTINGS if k in settings})
    return SegmentStore.open(path, fingerprint, level=level, keys=keys, **args)


def _open_memory(
    spec: str, fingerprint: ModelFingerprint, level: Level, settings: Mapping[str, Any]
) -> SegmentBackend:
    from stratastore.levels.memory import MemoryBackend

    name = spec.partition("://")[2] or "default"
    if not _MEMORY_NAME.fullmatch(name):
        raise ConfigError(
            "a memory:// level's name is letters, digits, '_', '.' and '-' (memory://scratch)"
        )
    return MemoryBackend(name, fingerprint, level)


def _open_redis(
    spec: str, fingerprint: ModelFingerprint, level: Level, settings: Mapping[str, Any]
) -> SegmentBackend:
    """Made, not connected: its first call connects, within its timeout (the flow connects it
    at once, behind its breaker). Credentials not in ``settings`` come from the environment
    (:meth:`~stratastore.levels.redis.settings.RemoteSettings.from_level`)."""
    from stratastore.levels.redis.backend import RedisBackend
    from stratastore.levels.redis.settings import RemoteSettings

    return RedisBackend(RemoteSettings.from_level(spec, settings), fingerprint, level)
