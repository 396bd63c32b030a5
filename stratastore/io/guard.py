"""The guard of every destructive operation on a store's files (spec F-DIR-8).

What it guarantees: stratastore never removes, moves or rewrites anything but its own files,
and never through a symbolic link out of a store directory.

* it acts only on store names (:func:`is_store_name`: segment files, chain manifests, temp
  files; in ``strata-index/`` only the index's own files, :data:`INDEX_FILES`; in
  ``strata-quarantine/`` only the temp file of a copy into it, so what repair quarantined is
  never removed) directly inside the directory the caller was given;
* ``strata-index/`` and ``strata-quarantine/`` must be real directories (``lstat``); they are
  opened ``O_DIRECTORY | O_NOFOLLOW`` and the name is resolved with ``dir_fd``, so a directory
  swapped for a link meanwhile cannot redirect the operation (:func:`store_subdir`);
* the target must be a regular file, checked with ``lstat`` (never followed) on a descriptor of
  its directory (:func:`remove_store_file`, :func:`require_store_file`; :func:`require_regular`
  for a check by path), and :func:`remove_index_dir` removes only an empty, real
  ``strata-index/``.

Anything else raises :class:`NotAStoreName`, :class:`SymlinkRefused` or
:class:`NotARegularFile` and nothing is done. The store directory itself is the one the caller
named; it may be a link the user chose. A directory the guard makes gets
:func:`~stratastore.io.modes.dir_mode` of the store's file mode (spec F-DIR-9). Every OS call
goes through the fault seam (:func:`~stratastore.io.faults.call`).
"""

from __future__ import annotations

import errno as _errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from stratastore.format.naming import (
    INDEX_DIR,
    QUARANTINE_DIR,
    TEMP_PREFIX,
    is_chain_name,
    parse_name,
)
from stratastore.io.errors import NotAStoreName, StrataIOError, refusal
from stratastore.io.faults import call
from stratastore.io.modes import DEFAULT_FILE_MODE, dir_mode

__all__ = [
    "INDEX_FILES",
    "is_store_name",
    "remove_index_dir",
    "remove_store_file",
    "require_regular",
    "require_store_file",
    "store_subdir",
]

#: the names stratastore itself keeps in ``strata-index/`` (LMDB's two files, the write lock,
#: the monitor's snapshot ``monitor.MONITOR_FILE``); only these and temp files are removed there
INDEX_FILES = frozenset({"data.mdb", "lock.mdb", "write.lock", "monitor.json"})


def is_store_name(name: str, *, in_index: bool = False) -> bool:
    """Whether ``name`` is one stratastore owns in a store directory (spec F-DIR-1..4): a
    segment file, a chain manifest, a temp file; in ``strata-index/`` (``in_index``) also
    :data:`INDEX_FILES`. Only such names are ever removed, moved or rewritten."""
    if "/" in name or name in ("", ".", ".."):
        return False
    if in_index:
        return name in INDEX_FILES or name.startswith(TEMP_PREFIX)
    return parse_name(name) is not None or is_chain_name(name) or name.startswith(TEMP_PREFIX)


def require_regular(path: str, op: str = "stat", *, missing_ok: bool = False) -> bool:
    """``lstat`` ``path`` (never following it): True for a regular file, False when missing
    (with ``missing_ok``); raises :class:`SymlinkRefused` or :class:`NotARegularFile` for
    anything else."""
    try:
        st = call(op, path, lambda: os.lstat(path))
    except StrataIOError as e:
        if missing_ok and e.errno == _errno.ENOENT:
            return False
        raise
    if not stat.S_ISREG(st.st_mode):
        raise refusal(op, path, st.st_mode)
    return True


def _open_dir(op: str, d: str, *, nofollow: bool) -> int:
    """A descriptor of directory ``d``; with ``nofollow`` a symbolic link is refused."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    try:
        return os.open(d, flags)
    except OSError as e:
        if e.errno in (_errno.ELOOP, _errno.ENOTDIR):
            st = call(op, d, lambda: os.lstat(d))
            raise refusal(op, d, st.st_mode) from e
        raise StrataIOError(op, d, e.errno or _errno.EIO, e.strerror or str(e)) from e


@contextmanager
def _store_parent(op: str, path: str) -> Iterator[tuple[int, str]]:
    """The guard of every destructive operation (spec F-DIR-8): yields ``(dir_fd, name)`` for
    ``path`` once its name is a store name directly in a store directory, or in its real (not
    linked) ``strata-index/``; in ``strata-quarantine/`` only a temp file of a copy into it (what
    repair quarantined is never removed)."""
    d, name = os.path.split(path)
    d = d or "."
    sub = os.path.basename(os.path.normpath(d))
    if sub == QUARANTINE_DIR:
        allowed = name.startswith(TEMP_PREFIX) and "/" not in name
    else:
        allowed = is_store_name(name, in_index=sub == INDEX_DIR)
    if not allowed:
        raise NotAStoreName(op, path)
    fd = _open_dir(op, d, nofollow=sub in (INDEX_DIR, QUARANTINE_DIR))
    try:
        yield fd, name
    finally:
        os.close(fd)


def require_store_file(path: str, op: str = "rename") -> bool:
    """Check, before moving ``path`` away (quarantine), that it is a store name directly in a
    store directory and a regular file (``lstat``). False when it is gone."""
    with _store_parent(op, path) as (dfd, name):
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise StrataIOError(op, path, e.errno or _errno.EIO, e.strerror or str(e)) from e
        if not stat.S_ISREG(st.st_mode):
            raise refusal(op, path, st.st_mode)
        return True


def remove_store_file(path: str, *, missing_ok: bool = False) -> bool:
    """Unlink a store file through the guard (spec F-DIR-8): its name must be a store name
    directly inside a store directory (or the real ``strata-index/``) and it must be a regular
    file, checked with ``lstat`` on a descriptor of that directory. Raises
    :class:`NotAStoreName`, :class:`SymlinkRefused` or :class:`NotARegularFile` and removes
    nothing otherwise; returns False (with ``missing_ok``) when it was already gone."""
    with _store_parent("unlink", path) as (dfd, name):

        def run() -> bool:
            try:
                st = os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return False
            if not stat.S_ISREG(st.st_mode):
                raise refusal("unlink", path, st.st_mode)
            os.unlink(name, dir_fd=dfd)
            return True

        return call("unlink", path, run)


def store_subdir(
    parent: str, name: str, *, mode: int = DEFAULT_FILE_MODE, create: bool = True
) -> str:
    """``parent/name`` for ``strata-index`` or ``strata-quarantine``, made (with
    ``dir_mode(mode)``) when missing and ``create``; raises :class:`SymlinkRefused` when it is a
    symbolic link and :class:`NotARegularFile` when it is not a directory (spec F-DIR-8), so
    nothing is ever created, opened or removed through a link out of the store."""
    if name not in (INDEX_DIR, QUARANTINE_DIR):
        raise NotAStoreName("mkdir", os.path.join(parent, name))
    path = os.path.join(parent, name)
    if create:
        try:
            call("mkdir", path, lambda: os.mkdir(path, dir_mode(mode)))
        except StrataIOError as e:
            if e.errno != _errno.EEXIST:
                raise
    st = call("stat", path, lambda: os.lstat(path))
    if not stat.S_ISDIR(st.st_mode):
        raise refusal("open", path, st.st_mode)
    return path


def remove_index_dir(path: str) -> None:
    """``rmdir`` an empty ``strata-index/`` (spec F-DIR-8: only that name, never a link)."""
    if os.path.basename(os.path.normpath(path)) != INDEX_DIR:
        raise NotAStoreName("rmdir", path)
    st = call("stat", path, lambda: os.lstat(path))
    if not stat.S_ISDIR(st.st_mode):
        raise refusal("rmdir", path, st.st_mode)
    call("unlink", path, lambda: os.rmdir(path))
