"""``strata monitor``: what a store's levels hold and what its Store has been doing.

A running :class:`~stratastore.Store` publishes its counters (``Store.stats()``) at most once a
second and when it closes, into ``strata-index/monitor.json`` of its last disk level (the index
directory is derived state, spec F-DIR-4: nothing there is a segment, and fsck and repair may
drop it). The monitor reads that snapshot and scans each level's folder itself for what it holds
now (bytes, entries, oldest entry's age), so it also works on a store no process has open.
What a scraper reads from outside the process (:func:`published_stats`, ``strata monitor
--prometheus``) is that snapshot as the Store reported it, so it holds the same rows as
``Store.prometheus()`` in the process: only those of what the store has configured.
"""

from __future__ import annotations

import errno
import json
import math
import time
from collections.abc import Callable
from typing import Any

from stratastore.errors import StrataError
from stratastore.format.naming import INDEX_DIR, parse_name
from stratastore.io import files, pathnames, survey
from stratastore.io.durable import durable_write_in
from stratastore.io.errors import NotARegularFile, StrataIOError, SymlinkRefused
from stratastore.io.system import process_alive, this_process
from stratastore.metrics.counters import counter_keys, shown_by_monitor

__all__ = [
    "MONITOR_FILE",
    "Throttle",
    "finite",
    "find_levels",
    "publish_snapshot",
    "published_stats",
    "read_monitor",
]

MONITOR_FILE = "monitor.json"
MAX_MONITOR_BYTES = 1 << 20
#: the Store's counters the monitor shows, and their kinds (checked in a snapshot)
_COUNTERS = {c.key: c.kind for c in shown_by_monitor(levels=False)}
#: the figures checked in every level's table of a snapshot (integers)
_LEVEL_NUMBERS = tuple(c.key for c in shown_by_monitor(levels=True))
#: the remote level's counters, shown by the monitor beside its figures
_REMOTE = counter_keys("remote level")
#: the system-prompt cache's name among the levels of a snapshot
PROMPT_CACHE = "prompt_cache"


class Throttle:
    """Says whether a snapshot is due: when forced, or ``every`` seconds after the last one,
    and only while ``where()`` says there is a place to write it."""

    def __init__(self, every: float, where: Callable[[], bool]) -> None:
        self.every, self.where = every, where
        self._last = float("-inf")  #: monotonic time of the last one

    def due(self, force: bool) -> bool:
        now = time.monotonic()
        if not self.where() or (not force and now - self._last < self.every):
            return False
        self._last = now
        return True


def publish_snapshot(level_dir: str | None, stats: dict[str, Any], file_mode: int) -> None:
    """Write ``stats`` (``Store.stats()``) with this process's id and the time into
    ``strata-index/monitor.json`` of ``level_dir``, durably and whole (what :func:`read_monitor`
    and :func:`published_stats` read); nothing without a directory."""
    if level_dir is None:
        return
    doc = {**stats, "pid": this_process(), "written_at": time.time()}
    raw = json.dumps(doc, default=str).encode()
    durable_write_in(level_dir, f"{INDEX_DIR}/{MONITOR_FILE}", raw, mode=file_mode)


def find_levels(path: str) -> list[str]:
    """The level directories ``path`` names, warm first: ``path`` itself when it is a store
    level, the levels of a config file, or a store root's level subdirectories (the layout of
    ``strata demo --dir``: ``warm/`` and ``cold/``). The one discovery fsck, repair and
    conformance use too: :func:`stratastore.ops.level_dirs.find_store_levels` (imported here:
    an engine's Store publishes its counters through this module and never loads the operator
    tools)."""
    from stratastore.ops.level_dirs import find_store_levels

    return list(find_store_levels([path]).checked)


def _scan(d: str, now: float) -> dict[str, Any]:
    entries, nbytes, oldest = 0, 0, None
    for name in survey.names_in(d):
        parsed = parse_name(name)
        if parsed is None:
            continue
        # never followed (spec F-DIR-8); None: removed while we looked, or a link, FIFO or
        # directory, which is not a store file (fsck reports it)
        st = survey.regular_file(pathnames.join(d, name))
        if st is None:
            continue
        nbytes += st.size
        if parsed[1] == "side":
            entries += 1
            oldest = st.mtime if oldest is None else min(oldest, st.mtime)
    return {
        "dir": d,
        "entries": entries,
        "bytes": nbytes,
        "oldest_age_s": round(now - oldest, 1) if oldest is not None else None,
    }


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def snapshot_problem(doc: dict[str, Any]) -> str | None:
    """Why a JSON document that parsed is still not a Store snapshot the monitor can show (a
    field of the wrong type: counters that are not integers, levels that are not a table, a
    time that is not a finite number), or ``None`` when it is one. The monitor ignores such a
    snapshot and says so, instead of failing on it."""
    if not finite(doc.get("written_at")):
        return "written_at is not a finite number"
    if doc.get("pid") is not None and not _is_count(doc["pid"]):
        return f"pid is {type(doc['pid']).__name__}, not an integer"
    for k, kind in _COUNTERS.items():
        v = doc.get(k)
        if kind == "table":
            if v is not None and not isinstance(v, dict):
                return f"{k} is {type(v).__name__}, not a table"
            continue
        text = kind == "info"
        if v is not None and not (isinstance(v, str) if text else _is_count(v)):
            return f"counter {k} is {type(v).__name__}, not {'text' if text else 'an integer'}"
    levels = doc.get("levels", {})
    if not isinstance(levels, dict):
        return f"levels is {type(levels).__name__}, not a table"
    for name, lv in levels.items():
        if not isinstance(lv, dict):
            return f"level {name} is {type(lv).__name__}, not a table"
        if lv.get("dir") is not None and not isinstance(lv["dir"], str):
            return f"level {name}: dir is {type(lv['dir']).__name__}, not text"
        for k in _LEVEL_NUMBERS:
            if lv.get(k) is not None and not _is_count(lv[k]):
                return f"level {name}: {k} is {type(lv[k]).__name__}, not an integer"
    return None


_JSON_KINDS = {
    list: "a JSON list",
    str: "a JSON string",
    bool: "a JSON boolean",
    int: "a JSON number",
    float: "a JSON number",
    type(None): "a JSON null",
}


def _unreadable(e: StrataIOError) -> str:
    """Why a snapshot file could not be read, in words."""
    if isinstance(e, SymlinkRefused):
        return "a symbolic link, never followed: spec F-DIR-8"
    if isinstance(e, NotARegularFile):
        return f"{e.kind}, not a regular file"
    return survey.error_text(e.errno)


def _snapshot(levels: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """The newest well-formed snapshot among the levels, and what was wrong with the last
    one ignored (when one was): unreadable (a FIFO, a link, an I/O error), not JSON, not a
    table, or a table of wrongly typed fields. A level without a snapshot is not a problem."""
    best: tuple[float, dict[str, Any]] | None = None
    problem: str | None = None
    for d in levels:
        path = pathnames.join(d, INDEX_DIR, MONITOR_FILE)
        try:  # the io layer never follows a link or opens a FIFO (spec F-DIR-8)
            raw = files.read_file(path, MAX_MONITOR_BYTES)
        except StrataIOError as e:
            if e.errno != errno.ENOENT:  # no snapshot (yet) is not a problem
                problem = f"{path} is unreadable ({_unreadable(e)}); ignored"
            continue
        try:
            doc = json.loads(raw)
        except ValueError as e:  # written whole (durable_write): not ours, or damaged
            problem = f"{path} is not JSON ({e}); ignored"
            continue
        if not isinstance(doc, dict):
            kind = _JSON_KINDS.get(type(doc), type(doc).__name__)
            problem = f"{path} is {kind}, not a Store snapshot (a table); ignored"
            continue
        why = snapshot_problem(doc)
        if why is not None:
            problem = f"{path} is not a well-formed Store snapshot ({why}); ignored"
            continue
        if best is None or doc["written_at"] > best[0]:
            best = (float(doc["written_at"]), doc)
    return (best[1] if best else None), problem


def _alive(pid: object) -> bool:
    return isinstance(pid, int) and 0 < pid < 2**31 and process_alive(pid)


def finite(v: object) -> bool:
    """Whether ``v`` is a number a float holds, finite (a snapshot's 10**400 is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _level_dirs(path: str | None, levels: list[str] | None) -> list[str]:
    """The level directories to read: ``levels``, else those ``path`` names; each must exist."""
    if levels is None:
        if path is None:
            raise StrataError("the monitor needs a path or the level directories")
        levels = find_levels(path)
    for d in levels:
        if not files.is_dir(d):
            raise StrataError(f"level directory {d} does not exist")
    return levels


def published_stats(path: str | None = None, *, levels: list[str] | None = None) -> dict[str, Any]:
    """The stats the Store of the store at ``path`` (or of the level directories ``levels``)
    last published, as ``Store.stats()`` reported them, with each disk level's entries, bytes
    and oldest entry's age as its folder holds them now; a level the snapshot does not name
    (or every level, when no Store has published yet) with what its folder holds alone. What
    ``strata monitor --prometheus`` writes: the rows ``Store.prometheus()`` writes."""
    now = time.time()
    levels = _level_dirs(path, levels)
    snap, _ = _snapshot(levels)
    doc = {k: v for k, v in (snap or {}).items() if k not in ("pid", "written_at")}
    known: dict[str, dict[str, Any]] = dict(doc.get("levels", {}))
    by_dir = {
        files.realpath(str(lv.get("dir", ""))): name
        for name, lv in known.items()
        if isinstance(lv, dict)
    }
    for d in levels:
        scan = _scan(d, now)
        name = by_dir.get(files.realpath(d), pathnames.basename(d) or d)
        held = {k: scan[k] for k in ("entries", "bytes", "oldest_age_s")}
        known[name] = {**known.get(name, {"dir": d}), **held}
    doc["levels"] = known
    return doc


def read_monitor(path: str | None = None, *, levels: list[str] | None = None) -> dict[str, Any]:
    """The monitor's document for the store at ``path`` (or of the level directories
    ``levels``): per level what the folder holds now (and its budget and counters from the last
    snapshot), the Store's counters, its per-slot speeds (GB/s, tokens/s and rates by slot,
    park or restore, and level, over its recent window), and where the snapshot came from."""
    now = time.time()
    levels = _level_dirs(path, levels)
    snap, problem = _snapshot(levels)
    by_dir = {}
    if snap is not None:
        for name, lv in snap.get("levels", {}).items():
            if isinstance(lv, dict):
                by_dir[files.realpath(str(lv.get("dir", "")))] = (name, lv)
    out_levels: dict[str, Any] = {}
    if snap is not None and isinstance(snap.get("levels", {}).get("ram"), dict):
        ram = snap["levels"]["ram"]
        out_levels["ram"] = {
            "dir": None,
            "entries": ram.get("entries"),
            "bytes": ram.get("bytes"),
            "budget": ram.get("budget"),
            "oldest_age_s": None,
            "evictions": ram.get("evictions"),
        }
    for d in levels:
        scan = _scan(d, now)
        name, lv = by_dir.get(files.realpath(d), (pathnames.basename(d) or d, {}))
        out_levels[name] = {
            **scan,
            "budget": lv.get("budget"),
            "hits": lv.get("hits"),
            "degradations": lv.get("degradations"),
            "evictions": (
                (lv.get("disk_evictions") or 0) + (lv.get("age_evictions") or 0) if lv else None
            ),
        }
    remote = snap.get("levels", {}).get("remote") if snap is not None else None
    if snap is not None and isinstance(remote, dict):  # the shared level: no credentials in dir
        out_levels["remote"] = {
            "dir": remote.get("dir"),
            "entries": remote.get("entries"),
            "bytes": remote.get("bytes"),
            "budget": remote.get("budget"),
            "oldest_age_s": None,
            "hits": snap.get("hits_remote"),
            **{k: remote.get(k) for k in _REMOTE},
        }
    cache = snap.get("levels", {}).get(PROMPT_CACHE) if snap is not None else None
    if snap is not None and isinstance(cache, dict):  # the system-prompt cache's own folder
        where = cache.get("dir")
        held = _scan(where, now) if isinstance(where, str) and files.is_dir(where) else {}
        out_levels[PROMPT_CACHE] = {
            "dir": where,
            "entries": held.get("entries", cache.get("entries")),
            "bytes": held.get("bytes", cache.get("bytes")),
            "budget": cache.get("budget"),
            "oldest_age_s": held.get("oldest_age_s"),
            "hits": snap.get("hits_prompt_cache"),
            "evictions": cache.get("evictions"),
        }
    rank = {"ram": 0, "warm": 1, "cold": 2}
    out_levels = dict(sorted(out_levels.items(), key=lambda kv: rank.get(kv[0], 3)))
    counters = {}
    if snap is not None:
        counters = {k: snap.get(k) for k, kind in _COUNTERS.items() if kind != "table"}
    return {
        "path": pathnames.abspath(path) if path else pathnames.PATH_LIST_SEP.join(levels),
        "time": now,
        "snapshot": None
        if snap is None
        else {
            "pid": snap.get("pid"),
            "written_at": snap.get("written_at"),
            "age_s": round(now - float(snap["written_at"]), 1),
            "writer_alive": _alive(snap.get("pid")),
        },
        "snapshot_problem": problem,
        "levels": out_levels,
        "counters": counters,
        #: per slot, per park/restore, per level over the Store's recent window
        #: (:mod:`stratastore.metrics.speeds`); None before a Store published
        "speeds": snap.get("speeds") if snap is not None else None,
    }
