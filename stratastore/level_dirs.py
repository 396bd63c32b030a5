"""Where a store's level directories are, from the path a user names (issue 11, item 10).

One function, :func:`find_store_levels`, used by ``strata fsck`` (and its repair),
``strata conformance`` and ``strata monitor``. Each path a user gives is one of:

- **a config file** (TOML, what ``strata init`` writes): its ``warm_dir`` then ``cold_dir``,
  those that are on. They are every level of the store, so the set is *complete*.
- **a level directory** (spec F-DIR: it holds ``strata-index/``, ``strata-quarantine/`` or
  files named ``strata-conv-``, ``strata-chain-`` or ``strata-tmp-``): itself. Its parent's other
  level subdirectories (the sibling ``warm/`` of a ``cold/``, as ``strata demo --dir`` lays them
  out) are the store's other levels as far as one can tell: chain manifests live in the last
  level (F-CHAIN-4) and name segments of every level, so chain checks look there too. Whether the
  store has a level elsewhere cannot be known, so the set is *complete* only when it holds two
  levels (a store has at most two disk levels, warm and cold: its config's ``warm_dir`` and
  ``cold_dir``).
- **a store root**: a directory that is not a level and whose subdirectories are (``X`` of
  ``strata demo --dir X``): those, warm first, then cold, then the rest by name. The user names
  the whole store, so the set is *complete*.

Nothing here opens a store or writes anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .config import StoreConfig
from .errors import StrataError
from .format.naming import INDEX_DIR, QUARANTINE_DIR, TEMP_PREFIX, is_chain_name, parse_name

__all__ = ["NoStoreLevels", "StoreLevels", "find_store_levels", "is_level_dir",
           "levels_of", "sibling_levels"]  # fmt: skip

#: the order levels are listed in (the cascade's order, warm to cold); other names come after
_RANK = {"warm": 0, "cold": 1}
#: a store has at most this many disk levels (its config's warm_dir and cold_dir)
MAX_DISK_LEVELS = 2


class NoStoreLevels(StrataError):
    """A path names no store level: not a config file, a level directory, or a store root."""


@dataclass(frozen=True, slots=True)
class StoreLevels:
    """The levels found from what a user named.

    ``checked``: the level directories to check, in order. ``store``: every level of the store
    known (``checked`` plus sibling levels), for chain checks. ``complete``: ``store`` is known to
    be all of the store's levels (see the module docstring); repair cuts a chain whose segment is
    absent from every level only then. ``found_from``: one line saying how they were found."""

    checked: tuple[str, ...]
    store: tuple[str, ...]
    complete: bool
    found_from: str

    def describe(self) -> str:
        """``levels checked: ...`` and, when chains are also looked up elsewhere, where."""
        out = f"levels checked: {', '.join(self.checked)} ({self.found_from})"
        more = [d for d in self.store if d not in self.checked]
        if more:
            out += f"; chains also looked up in {', '.join(more)}"
        return out


def is_level_dir(d: str) -> bool:
    """Whether ``d`` holds what a store level holds (spec F-DIR-2/3/4, F-CHAIN-4)."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return any(
        n in (INDEX_DIR, QUARANTINE_DIR)
        or parse_name(n) is not None
        or is_chain_name(n)
        or n.startswith(TEMP_PREFIX)
        for n in names
    )


def _ordered(dirs: Sequence[str]) -> list[str]:
    return sorted(dirs, key=lambda d: (_RANK.get(os.path.basename(d), len(_RANK)), d))


def _sub_levels(root: str) -> list[str]:
    try:
        names = os.listdir(root)
    except OSError:
        return []
    subs = [os.path.join(root, n) for n in names]
    return _ordered([d for d in subs if os.path.isdir(d) and not os.path.islink(d)
                     and is_level_dir(d)])  # fmt: skip


def sibling_levels(dirs: Sequence[str]) -> list[str]:
    """The level directories beside each of ``dirs`` in its parent (the other levels of the
    store the parent is the root of), not including ``dirs`` themselves."""
    given = {os.path.abspath(d) for d in dirs}
    out: list[str] = []
    for d in dirs:
        parent = os.path.dirname(os.path.abspath(d))
        if is_level_dir(parent):
            continue  # the parent is a level itself, not a store root
        out += [s for s in _sub_levels(parent) if s not in given and s not in out]
    return out


def _config_levels(cfg: StoreConfig, source: str) -> list[str]:
    dirs = [os.path.abspath(d) for d, on in ((cfg.warm_dir, cfg.warm_on),
                                             (cfg.cold_dir, cfg.cold_on)) if on]  # fmt: skip
    if not dirs:
        raise NoStoreLevels(f"config {source} turns on no disk level: set warm_dir and warm_mib, "
                            "or cold_dir and cold_mib")  # fmt: skip
    for d in dirs:
        if not os.path.isdir(d):
            raise NoStoreLevels(f"level directory {d} (named by config {source}) does not exist: "
                                "nothing was stored there yet, or the config names the wrong "
                                "place")  # fmt: skip
    return dirs


def find_store_levels(paths: Sequence[str], config: StoreConfig | None = None,
                      config_source: str = "--config") -> StoreLevels:  # fmt: skip
    """The levels of the store named by ``paths`` (config files, level directories or store
    roots; see the module docstring), or by ``config`` when ``paths`` is empty.

    Raises :class:`NoStoreLevels` for a path that is none of these, and
    :class:`~stratastore.errors.ConfigError` for a config file that does not parse."""
    if not paths:
        if config is None:
            raise NoStoreLevels("name the store: its root directory, a level directory or its "
                                "config file (or pass --config FILE)")  # fmt: skip
        dirs = _config_levels(config, config_source)
        return StoreLevels(tuple(dirs), tuple(dirs), True, f"the levels of config {config_source}")
    checked: list[str] = []
    complete = True  # a config or a store root names every level
    how: list[str] = []
    explicit: list[str] = []
    for p in paths:
        path = os.path.abspath(p)
        if os.path.isfile(path):
            found = _config_levels(StoreConfig.from_toml(path), path)
            how.append(f"the levels of config {path}")
        elif not os.path.isdir(path):
            what = "does not exist" if not os.path.lexists(path) else "is not a directory or a file"
            raise NoStoreLevels(f"{p} {what}; name the store's root directory, a level directory "
                                "or its config file")  # fmt: skip
        elif is_level_dir(path):
            found = [path]
            explicit.append(path)
        else:
            found = _sub_levels(path)
            if not found:
                raise NoStoreLevels(f"{p} holds no store level: no strata-index/ or strata-conv-, "
                                    "strata-chain- files in it or in its subdirectories; name the "
                                    "store's root directory, a level directory or its config "
                                    "file")  # fmt: skip
            how.append(f"the levels of store root {path}")
        checked += [d for d in found if d not in checked]
    store = list(checked)
    if explicit:
        given = levels_of(explicit)
        store += [d for d in given.store if d not in store]
        complete = bool(how) or given.complete
        how.insert(0, given.found_from)
    return StoreLevels(tuple(checked), tuple(_ordered(store)), complete, "; ".join(how))


def levels_of(dirs: Sequence[str]) -> StoreLevels:
    """The levels known of the store whose level directories ``dirs`` are (nothing is
    checked): ``dirs`` and their sibling levels, complete only when that makes two levels."""
    checked = [os.path.abspath(d) for d in dirs]
    siblings = sibling_levels(checked)
    store = _ordered([*dict.fromkeys(checked), *siblings])
    how = "the level directories given" + (
        f", beside sibling levels {', '.join(siblings)}" if siblings else "")  # fmt: skip
    return StoreLevels(tuple(checked), tuple(store), len(store) >= MAX_DISK_LEVELS, how)
