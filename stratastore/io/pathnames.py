"""Path names: how stratastore builds and takes apart the names of files and directories.

The one way the package joins, splits and makes absolute a path, so code outside ``io/`` never
calls ``os.path``. Each function is the ``os.path`` operation of the same name, unchanged: a
join keeps what it is given (``join(d, ".")`` names the directory ``d`` itself, not a link that
names it, spec F-DIR-8; a trailing separator or a ``./`` stays as written), so paths in findings
and messages read as before. Nothing here opens, lists or stats a file: :func:`abspath` reads
the working directory and :func:`expanduser` the environment, the others are pure string
operations. Questions about what a name is on disk (exists, a link, a directory, its real path)
are :mod:`stratastore.io.files`' look-ups.
"""

from __future__ import annotations

import os

__all__ = [
    "PATH_LIST_SEP",
    "SEP",
    "StrPath",
    "abspath",
    "basename",
    "commonpath",
    "dirname",
    "expanduser",
    "fspath",
    "join",
    "normpath",
    "relpath",
]

#: a path as callers may give one: a string or a path object (``pathlib.Path``)
StrPath = str | os.PathLike[str]

#: the separator of a path's parts (``/`` on POSIX)
SEP = os.sep
#: the separator of the paths in a list of paths (``:`` on POSIX, as in ``PATH``)
PATH_LIST_SEP = os.pathsep


def join(first: str, *rest: str) -> str:
    """``first`` and each of ``rest`` joined by :data:`SEP` (``os.path.join``: an absolute part
    starts over, nothing is normalised)."""
    return os.path.join(first, *rest)


def basename(path: str) -> str:
    """The last part of ``path`` (``""`` when it ends with a separator)."""
    return os.path.basename(path)


def commonpath(paths: list[str]) -> str:
    """The longest common sub-path of ``paths`` (all absolute, or all relative)."""
    return os.path.commonpath(paths)


def dirname(path: str) -> str:
    """``path`` without its last part (``""`` for a bare name)."""
    return os.path.dirname(path)


def relpath(path: str, start: str) -> str:
    """``path`` relative to the directory ``start`` (both made absolute first)."""
    return os.path.relpath(path, start)


def normpath(path: str) -> str:
    """``path`` with redundant separators and ``.`` / ``..`` parts removed, as a string: a
    ``..`` after a link is not resolved (that is :func:`stratastore.io.files.realpath`)."""
    return os.path.normpath(path)


def abspath(path: str) -> str:
    """``path`` made absolute against the working directory and normalised; links are not
    resolved."""
    return os.path.abspath(path)


def expanduser(path: str) -> str:
    """``path`` with a leading ``~`` replaced by the user's home directory (``$HOME``)."""
    return os.path.expanduser(path)


def fspath(path: StrPath) -> str:
    """The string of ``path`` (a ``pathlib.Path`` or any object with ``__fspath__``)."""
    return os.fspath(path)
