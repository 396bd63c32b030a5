"""Opening a level from its spec: one table from URL scheme to backend.

A level spec is a directory path (or ``file://PATH``), ``memory://NAME``, or a Redis URL
(``redis://``, ``rediss://``, ``redis+cluster://``). :func:`open_level` picks the backend by the
scheme and opens it for one model fingerprint and one level byte (spec F-SC-5: the level a
segment's sidecar records). A new backend is one module and one row of :data:`SCHEMES`; nothing
above the seam names a backend. Backends whose client is an extra (Redis) are imported only when
a spec names them.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from stratastore.errors import ConfigError
from stratastore.format import Level, ModelFingerprint
from stratastore.levels.backend import SegmentBackend

__all__ = ["SCHEMES", "SHARED_SCHEMES", "URL_SCHEMES", "Opener", "open_level", "scheme_of"]

Opener = Callable[[str, ModelFingerprint, Level, Mapping[str, Any]], SegmentBackend]

_MEMORY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")  # RFC 3986 section 3.1


@dataclass(frozen=True, slots=True)
class _Row:
    module: str  #: where the opener lives (imported on first use)
    function: str
    what: str  #: how messages name the backend
    shared: bool = False  #: a level on it is the store's shared (remote) level, spec F-REM


_HERE = "stratastore.levels.registry"
#: scheme -> the opener of its backend. ``""`` is a plain directory path.
SCHEMES: Mapping[str, _Row] = {
    "": _Row(_HERE, "_open_directory", "a directory"),
    "file": _Row(_HERE, "_open_directory", "a directory"),
    "memory": _Row(_HERE, "_open_memory", "memory"),
    "redis": _Row(_HERE, "_open_redis", "Redis", shared=True),
    "rediss": _Row(_HERE, "_open_redis", "Redis over TLS", shared=True),
    "redis+cluster": _Row(_HERE, "_open_redis", "a Redis Cluster", shared=True),
    "rediss+cluster": _Row(_HERE, "_open_redis", "a Redis Cluster over TLS", shared=True),
}
#: the schemes whose levels are shared by several nodes (what makes a level the remote one)
SHARED_SCHEMES = frozenset(s for s, row in SCHEMES.items() if row.shared)
#: the schemes a level's ``url`` may name (a directory is given as ``dir``)
URL_SCHEMES = frozenset(s for s in SCHEMES if s not in ("", "file"))


def scheme_of(spec: str | PurePath) -> str:
    """The scheme of a level spec: ``""`` for a path, else the part before ``://``."""
    m = _SCHEME.match(str(spec))
    return m.group(1).lower() if m else ""


def open_level(
    spec: str | PurePath,
    fingerprint: ModelFingerprint,
    level: Level = Level.COLD,
    settings: Mapping[str, Any] | None = None,
) -> SegmentBackend:
    """Open the level ``spec`` for ``fingerprint``, its segments sealed as ``level``.

    ``settings`` are the backend's own (a directory's ``file_mode`` and ``create``; a Redis
    level's ``name``, ``password``, ``timeout_s``, ... as :class:`RemoteSettings` takes them).
    A scheme no backend serves is a :class:`~stratastore.errors.ConfigError` naming the schemes
    there are. Never shows a credential: a URL is named by its scheme alone."""
    scheme = scheme_of(spec)
    row = SCHEMES.get(scheme)
    if row is None:
        known = ", ".join(f"{s}://" for s in SCHEMES if s)
        raise ConfigError(
            f"level {scheme}://... names no backend; use a directory path or one of {known}"
        )
    opener: Opener = getattr(importlib.import_module(row.module), row.function)
    return opener(str(spec), fingerprint, level, settings or {})


def _open_directory(
    spec: str, fingerprint: ModelFingerprint, level: Level, settings: Mapping[str, Any]
) -> SegmentBackend:
    from stratastore.levels.local import SegmentStore

    path = spec[len("file://") :] if spec.lower().startswith("file://") else spec
    return SegmentStore.open(path, fingerprint, level=level, **dict(settings))


def _open_memory(
    spec: str, fingerprint: ModelFingerprint, level: Level, settings: Mapping[str, Any]
) -> SegmentBackend:
    from stratastore.levels.memory import MemoryBackend

    if settings:
        raise ConfigError(f"a memory:// level takes no settings ({sorted(settings)})")
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
