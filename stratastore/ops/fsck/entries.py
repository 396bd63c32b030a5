"""What the names of a level directory are, checked with ``lstat`` before anything is read
(spec F-DIR-8, F-DIR-9): a store name that is a symbolic link (``SYMLINK``) or not what it
must be (``NOT_REGULAR_FILE``), and store files other users can read
(``STORE_READABLE_BY_OTHERS``). Nothing is followed or opened, so a FIFO cannot hang the check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator

from stratastore.format.naming import INDEX_DIR, QUARANTINE_DIR
from stratastore.io import files, guard, modes, pathnames
from stratastore.io.errors import NotARegularFile, StrataIOError, SymlinkRefused
from stratastore.levels.findings import (
    NOT_REGULAR_FILE,
    STORE_READABLE_BY_OTHERS,
    SYMLINK,
    Finding,
)

__all__ = ["check_modes", "special_entries", "special_finding", "special_index_files"]


def special_entries(d: str, names: list[str]) -> Generator[Finding, None, list[str]]:
    """Report every store name that is a symbolic link (``SYMLINK``) or not what it must be
    (``NOT_REGULAR_FILE``: a FIFO, a device, a directory where a file belongs, a file where
    ``strata-index/`` belongs), spec F-DIR-8; returns the other names. Checked with ``lstat``:
    nothing is followed or opened, so a FIFO cannot hang the check, and repair leaves them."""
    rest = []
    for name in names:
        is_dir = name in (INDEX_DIR, QUARANTINE_DIR)
        if not is_dir and not guard.is_store_name(name):
            rest.append(name)
            continue
        path = pathnames.join(d, name)
        try:
            if is_dir:
                guard.store_subdir(d, name, create=False)
            else:
                guard.require_regular(path)
        except (SymlinkRefused, NotARegularFile) as e:
            yield special_finding(path, "directory" if is_dir else "file", e)
            continue
        except StrataIOError:
            continue  # removed while we looked
        rest.append(name)
    return rest


def special_finding(path: str, what: str, e: SymlinkRefused | NotARegularFile) -> Finding:
    if isinstance(e, SymlinkRefused):
        return SYMLINK.found(
            path,
            f"a symbolic link where a store {what} belongs; never followed, repair leaves it: "
            "replace it by the real one or remove the link",
        )
    return NOT_REGULAR_FILE.found(
        path,
        f"{e.kind} where a store {what} belongs; never read, repair leaves it: remove it by hand",
    )


def special_index_files(index: str) -> Iterator[Finding]:
    """``SYMLINK`` / ``NOT_REGULAR_FILE`` for the index folder's own files
    (:data:`~stratastore.io.guard.INDEX_FILES`), checked with ``lstat`` (spec F-DIR-8): a
    Store refuses to open through them, and repair's rebuild leaves them."""
    for name in sorted(guard.INDEX_FILES):
        path = pathnames.join(index, name)
        try:
            guard.require_regular(path, missing_ok=True)
        except (SymlinkRefused, NotARegularFile) as e:
            yield special_finding(path, "index file", e)
        except StrataIOError:
            continue  # removed while we looked


def check_modes(d: str, names: list[str]) -> Iterator[Finding]:
    """``STORE_READABLE_BY_OTHERS`` (warning, spec F-DIR-9) when the directory, its index or any
    store file in it lets other users read it: manifests hold token ids, segments K/V."""
    # d/. : the level directory's own bits, not those of a link that names it (F-DIR-8)
    paths = [pathnames.join(d, ".")] + [
        pathnames.join(d, n) for n in names if n == INDEX_DIR or guard.is_store_name(n)
    ]
    index = pathnames.join(d, INDEX_DIR)
    if INDEX_DIR in names:
        with contextlib.suppress(StrataIOError):
            paths += [
                pathnames.join(index, n)
                for n in files.listdir(index)
                if guard.is_store_name(n, in_index=True)
            ]
    loose = []
    for path in paths:
        if files.is_link(path) or not (files.is_file(path) or files.is_dir(path)):
            continue  # a link or a FIFO in the index: SYMLINK / NOT_REGULAR_FILE say so
        with contextlib.suppress(StrataIOError):
            mode = files.permissions(path)
            if modes.others_can_read(mode):
                loose.append(f"{pathnames.relpath(path, d)} ({mode:#o})")
    if loose:
        yield STORE_READABLE_BY_OTHERS.found(
            d,
            f"{len(loose)} store file(s) or directories other users can read, e.g. "
            f"{', '.join(loose[:3])}; manifests hold conversations' token ids: "
            f"`chmod -R o-rwx {d}` (and set file_mode for new files)",
        )
