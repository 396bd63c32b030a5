"""Where a store's level directories are, from the path a user names.

One function, :func:`find_store_levels`, used by ``strata fsck`` (and its repair),
``strata conformance`` and ``strata monitor``. Each path a user gives is one of:

- **a config file** (TOML, what ``strata init`` writes): its disk levels that are on, in order
  (:meth:`~stratastore.config.StoreConfig.disk_levels`: its ``levels`` list, or ``warm_dir``
  then ``cold_dir``). They are every level of the store, so the set is *complete*.
- **a level directory** (spec F-DIR: it holds ``strata-index/``, ``strata-quarantine/`` or
  files named ``strata-conv-``, ``strata-chain-`` or ``strata-tmp-``): itself. Its parent, when
  that is a store root (``X`` of ``strata demo --dir X``), tells the store's other levels as
  far as one can tell: chain manifests live in the last level (F-CHAIN-4) and name segments of
  every level, so chain checks look there too. The set is *complete* only when that parent is
  a complete store root (below) and every directory given is one of its levels: any two
  directories are not "the warm and the cold of one store".
- **a store root**: a directory that is not a level. When it holds a config file named
  :data:`ROOT_CONFIG` (``strata.toml``, what ``strata demo --dir X`` writes), its levels are
  that config's, and the set is *complete*. Otherwise its subdirectories that are levels
  (a link to a directory is one: the store directory a user configured may be a link, spec
  F-DIR-8; only what is inside a level is never followed), warm first, then cold, then the
  rest by name; *complete* only when both ``warm`` and ``cold`` are among them (one may be
  configured elsewhere). A store whose config gives a ``levels`` list of more than two can be
  known whole only from that config (or the root's ``strata.toml``): subdirectories alone
  cannot tell a third level configured elsewhere. What is skipped (a link to
  no directory, a directory that is not a level) is named in ``skipped``.

Repair cuts a chain at a segment absent from every level only for a *complete* set
(:mod:`stratastore.ops.repair`).

Nothing here opens a store or writes anything: what a name is (a directory, a link, its real
path, the names it holds) is asked of :mod:`stratastore.io.files`' look-ups, which are not I/O
steps of the fault seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stratastore.config import StoreConfig
from stratastore.config.levels import shown_value
from stratastore.errors import StrataError
from stratastore.format.naming import (
    INDEX_DIR,
    QUARANTINE_DIR,
    TEMP_PREFIX,
    is_chain_name,
    parse_name,
)
from stratastore.io import files, pathnames
from stratastore.levels.settings import padding_problem

__all__ = [
    "ROOT_CONFIG",
    "NoStoreLevels",
    "StoreLevels",
    "find_store_levels",
    "is_level_dir",
    "levels_of",
]

#: the order levels are listed in (the cascade's order, warm to cold); other names come after
_RANK = {"warm": 0, "cold": 1}
#: the config file a store root may hold: its levels are the whole store
ROOT_CONFIG = "strata.toml"
#: how many skipped entries :meth:`StoreLevels.describe` names
_SHOW_SKIPPED = 5


class NoStoreLevels(StrataError):
    """A path names no store level: not a config file, a level directory, or a store root."""


@dataclass(frozen=True, slots=True)
class StoreLevels:
    """The levels found from what a user named.

    ``checked``: the level directories to check, in order. ``store``: every level of the store
    known (``checked`` plus sibling levels), for chain checks. ``complete``: ``store`` is known to
    be all of the store's levels (see the module docstring); repair cuts a chain whose segment is
    absent from every level only then. ``found_from``: one line saying how they were found.
    ``skipped``: what discovery looked at and did not take as a level, each with why."""

    checked: tuple[str, ...]
    store: tuple[str, ...]
    complete: bool
    found_from: str
    skipped: tuple[str, ...] = ()

    def describe(self) -> str:
        """``levels checked: ...`` and, when chains are also looked up elsewhere, where."""
        out = f"levels checked: {', '.join(self.checked)} ({self.found_from})"
        more = [d for d in self.store if d not in self.checked]
        if more:
            out += f"; chains also looked up in {', '.join(more)}"
        if self.skipped:
            rest = len(self.skipped) - _SHOW_SKIPPED
            out += f"; skipped {', '.join(self.skipped[:_SHOW_SKIPPED])}" + (
                f" and {rest} more" if rest > 0 else ""
            )
        if not self.complete:
            out += "; not known to be the whole store"
        return out


def is_level_dir(d: str) -> bool:
    """Whether ``d`` holds what a store level holds (spec F-DIR-2/3/4, F-CHAIN-4)."""
    names = files.list_names(d)
    if names is None:
        return False
    return any(
        n in (INDEX_DIR, QUARANTINE_DIR)
        or parse_name(n) is not None
        or is_chain_name(n)
        or n.startswith(TEMP_PREFIX)
        for n in names
    )


def _ordered(dirs: Sequence[str]) -> list[str]:
    return sorted(dirs, key=lambda d: (_RANK.get(pathnames.basename(d), len(_RANK)), d))


def _sub_levels(root: str) -> tuple[list[str], list[str]]:
    """The level subdirectories of ``root`` (a link to a directory counts: F-DIR-8 lets the
    store directory be a link), and what was skipped there, with why."""
    listed = files.list_names(root)
    if listed is None:
        return [], []
    names = sorted(listed)
    found: dict[str, str] = {}  # real path -> the path as named
    skipped: list[str] = []
    for name in names:
        path = pathnames.join(root, name)
        if not files.is_dir(path):  # follows a link
            if files.is_link(path):
                skipped.append(f"{path} (a link to no directory)")
            continue
        if not is_level_dir(path):
            skipped.append(f"{path} (not a level: no store files in it)")
        elif files.realpath(path) in found:
            skipped.append(f"{path} (the same directory as {found[files.realpath(path)]})")
        else:
            found[files.realpath(path)] = path
    return _ordered(list(found.values())), skipped


def _root_levels(root: str, *, strict: bool) -> tuple[list[str], bool, str, list[str]]:
    """The levels of store root ``root``: (levels, complete, how they were found, skipped).
    Its :data:`ROOT_CONFIG` names them when there is one (a config that cannot be used raises
    with ``strict``, else is skipped); else its level subdirectories, complete when both
    ``warm`` and ``cold`` are among them."""
    subs, skipped = _sub_levels(root)
    cfg_path = pathnames.join(root, ROOT_CONFIG)
    if files.is_file(cfg_path):
        try:
            dirs = _config_levels(StoreConfig.from_toml(cfg_path), cfg_path)
        except StrataError as e:
            if strict:
                raise
            skipped.append(f"{cfg_path} ({e})")
        else:
            real = {files.realpath(d) for d in dirs}
            skipped += [
                f"{d} (a level its config does not name)"
                for d in subs
                if files.realpath(d) not in real
            ]
            return dirs, True, f"the levels of config {cfg_path}", skipped
    complete = set(_RANK) <= {pathnames.basename(d) for d in subs}
    return subs, complete, f"the levels of store root {root}", skipped


def _config_levels(cfg: StoreConfig, source: str) -> list[str]:
    """The directories of ``cfg``'s disk levels that are on, in the config's order."""
    dirs = [
        pathnames.abspath(lv.dir) for lv in cfg.disk_levels() if lv.dir
    ]  # a URL level has no folder
    if not dirs:
        raise NoStoreLevels(
            f"config {source} turns on no disk level: set warm_dir and warm_mib, "
            "or cold_dir and cold_mib, or give [[levels]] tables with a dir and "
            "a mib"
        )
    for d in dirs:
        if not files.is_dir(d):
            raise NoStoreLevels(
                f"level directory {d} (named by config {source}) does not exist: "
                "nothing was stored there yet, or the config names the wrong "
                "place"
            )
    return dirs


def find_store_levels(
    paths: Sequence[str], config: StoreConfig | None = None, config_source: str = "--config"
) -> StoreLevels:
    """The levels of the store named by ``paths`` (config files, level directories or store
    roots; see the module docstring), or by ``config`` when ``paths`` is empty.

    Raises :class:`NoStoreLevels` for a path that is none of these, and
    :class:`~stratastore.errors.ConfigError` for a config file that does not parse."""
    if not paths:
        if config is None:
            raise NoStoreLevels(
                "name the store: its root directory, a level directory or its "
                "config file (or pass --config FILE)"
            )
        dirs = _config_levels(config, config_source)
        return StoreLevels(tuple(dirs), tuple(dirs), True, f"the levels of config {config_source}")
    checked: list[str] = []
    complete = True  # unless a part is not known to be the whole store
    how: list[str] = []
    skipped: list[str] = []
    explicit: list[str] = []
    for p in paths:
        padded = padding_problem("path", p)
        if padded is not None:  # a URL would pass for a relative path: named without it
            raise NoStoreLevels(padded)
        if "://" in p and not p.lower().startswith("file://"):  # a URL may carry a credential
            raise NoStoreLevels(
                f"{shown_value(p)} is a URL, not a path; name the store's root directory, a "
                "level directory or its config file (a level on a server is checked through "
                "--config: fsck --remote)"
            )
        path = pathnames.abspath(p)
        if files.is_file(path):
            found = _config_levels(StoreConfig.from_toml(path), path)
            how.append(f"the levels of config {path}")
        elif not files.is_dir(path):
            what = "does not exist" if not files.lexists(path) else "is not a directory or a file"
            raise NoStoreLevels(
                f"{p} {what}; name the store's root directory, a level directory or its config file"
            )
        elif is_level_dir(path):
            found = [path]
            explicit.append(path)
        else:
            found, whole, found_how, skip = _root_levels(path, strict=True)
            skipped += skip
            if not found:
                raise NoStoreLevels(
                    f"{p} holds no store level: no strata-index/ or strata-conv-, "
                    "strata-chain- files in it or in its subdirectories"
                    + (f" (skipped {', '.join(skip)})" if skip else "")
                    + "; name the store's root directory, a level directory or "
                    "its config file"
                )
            complete = complete and whole
            how.append(found_how)
        real = {files.realpath(d) for d in checked}
        checked += [d for d in found if files.realpath(d) not in real]
    store = list(checked)
    if explicit:
        given = levels_of(explicit)
        real = {files.realpath(d) for d in store}
        store += [d for d in given.store if files.realpath(d) not in real]
        complete = complete and given.complete
        how.insert(0, given.found_from)
        skipped += [s for s in given.skipped if s not in skipped]
    return StoreLevels(
        tuple(checked), tuple(_ordered(store)), complete, "; ".join(how), tuple(skipped)
    )


def levels_of(dirs: Sequence[str]) -> StoreLevels:
    """The levels known of the store whose level directories ``dirs`` are (nothing is
    checked): ``dirs`` and the other levels of their parent when that is a store root
    (:func:`_root_levels`). Complete only when they all are levels of one complete store root:
    never merely because two directories were given."""
    checked = list(dict.fromkeys(pathnames.abspath(d) for d in dirs))
    parents = list(dict.fromkeys(pathnames.dirname(d) for d in checked))
    store = list(checked)
    complete = len(parents) == 1
    beside: list[str] = []
    skipped: list[str] = []
    for parent in parents:
        if is_level_dir(parent):  # the parent is a level itself, not a store root
            complete = False
            continue
        found, whole, how, skip = _root_levels(parent, strict=False)
        real = {files.realpath(d) for d in found}
        complete = complete and whole and all(files.realpath(d) in real for d in checked)
        known = {files.realpath(d) for d in store}
        more = [d for d in found if files.realpath(d) not in known]
        store += more
        skipped += skip
        if more:
            beside.append(f"beside {', '.join(more)} ({how})")
    found_from = ", ".join(["the level directories given", *beside])
    return StoreLevels(tuple(checked), tuple(_ordered(store)), complete, found_from, tuple(skipped))
