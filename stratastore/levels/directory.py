"""A directory level as the tools that read one offline see it (``strata inspect``, the
conformance kit's vectors): opened through the registry's directory row, its model read from
its sidecars, what open did not adopt, and its index's environment (spec F-DIR, F-IDX). The
tools above the seam use this protocol and never import the directory backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath
from types import TracebackType
from typing import Protocol, Self, cast

from stratastore.format import Level, LevelKeys, ModelFingerprint, Sidecar
from stratastore.io import files
from stratastore.levels.backend import CatalogHost, StoreStats
from stratastore.levels.registry import open_level, scheme_of

__all__ = [
    "DirectoryLevel",
    "NotAdopted",
    "directory_model",
    "local_path",
    "open_directory",
    "shared_directory",
]


class NotAdopted(Protocol):
    """A ``strata-conv-`` sidecar that open did not adopt, and why (fsck reports it too)."""

    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def error(self) -> str:  #: the error's class name (FormatError, ChecksumMismatch, ...)
        ...


class DirectoryLevel(CatalogHost, Protocol):
    """A level on a directory (spec F-DIR): a segment backend whose index is an LMDB
    environment (:meth:`catalog_tables`), that says what it did not adopt at open."""

    @property
    def skipped(self) -> Sequence[NotAdopted]: ...

    def stats(self) -> StoreStats: ...

    def sidecar(self, key: bytes) -> Sidecar:
        """The committed segment ``key``'s sidecar, as its file holds it."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def open_directory(
    path: str | PurePath,
    fingerprint: ModelFingerprint,
    *,
    level: Level = Level.COLD,
    create: bool = True,
    keys: LevelKeys | None = None,
) -> DirectoryLevel:
    """The directory level at ``path`` for ``fingerprint`` (``create=False``: one that must
    exist; opening it rewrites nothing, spec F-DIR-6), through the registry's directory row;
    ``keys``: a keyed level's (spec F-KEYED).
    A ``path`` that is a URL is a :class:`~stratastore.errors.ConfigError`."""
    from stratastore.errors import ConfigError

    if scheme_of(path) not in ("", "file"):
        raise ConfigError(
            f"{scheme_of(path)}://... is not a directory; give the path of a level directory"
        )
    args: dict[str, object] = {"create": create}
    if keys is not None:
        args["keys"] = keys
    return cast(DirectoryLevel, open_level(path, fingerprint, level, args))


def directory_model(path: str) -> ModelFingerprint | None:
    """The model of level directory ``path``: that of its first committed sidecar that decodes
    (the check open and fsck share), so a tool can open a level without being told its model.
    None when it holds no sidecar; when not one decodes, the first one's typed error."""
    from stratastore.levels.local import SegmentStore

    return SegmentStore.fingerprint_in(path)


def local_path(spec: str) -> str:
    """The directory a level spec names: a path as given, a ``file://`` URL's path."""
    return spec[len("file://") :] if spec.lower().startswith("file://") else spec


def shared_directory(paths: Sequence[str]) -> tuple[int, int, str] | None:
    """The first two of ``paths`` (directory paths, or ``file://`` URLs) that name one
    directory, as ``(i, j, real path)`` with ``i < j``; None when each names its own. Two
    names are one directory when their real paths are equal (a trailing slash, ``.`` or
    ``..`` segments, a symbolic link) or when both exist with one device and inode (a bind
    mount). Two levels on one directory share its commit lock, and the first move down from
    one into the other would wait on itself forever: every opener of several directory levels
    (a ``Store``'s, a chunk store's) refuses them by this check. Look-ups only."""
    seen: list[tuple[str, tuple[int, int] | None]] = []
    for j, path in enumerate(paths):
        real = files.realpath(local_path(path))
        ident = files.directory_id(real)
        for i, (other, other_id) in enumerate(seen):
            if real == other or (ident is not None and ident == other_id):
                return i, j, real
        seen.append((real, ident))
    return None
