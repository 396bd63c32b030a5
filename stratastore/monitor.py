"""``strata monitor``: what a store's levels hold and what its Store has been doing.

A running :class:`~stratastore.Store` publishes its counters (``Store.stats()``) at most once a
second and when it closes, into ``strata-index/monitor.json`` of its last disk level (the index
directory is derived state, spec F-DIR-4: nothing there is a segment, and fsck and repair may
drop it). The monitor reads that snapshot and scans each level's folder itself for what it holds
now (bytes, entries, oldest entry's age), so it also works on a store no process has open.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .errors import StrataError
from .format.naming import INDEX_DIR, parse_name

__all__ = ["MONITOR_FILE", "find_levels", "prometheus_text", "read_monitor"]

MONITOR_FILE = "monitor.json"
MAX_MONITOR_BYTES = 1 << 20
#: the Store counters the monitor shows
_COUNTERS = (
    "park_target", "park_target_source", "parks_ram", "parks_disk", "discards", "evict_spills",
    "hits_ram", "hits_disk", "ladder_restores", "tokens_restored", "tokens_reread",
    "restore_misses", "spill_errors", "admission", "held_tokens",
)  # fmt: skip


def _is_level(d: str) -> bool:
    if os.path.isdir(os.path.join(d, INDEX_DIR)):
        return True
    try:
        return any(parse_name(n) for n in os.listdir(d))
    except OSError:
        return False


def find_levels(path: str) -> list[str]:
    """``path`` itself when it is a store level, else its subdirectories that are (the layout
    of ``strata demo --dir``: ``warm/`` and ``cold/``)."""
    if not os.path.isdir(path):
        raise StrataError(f"{path} is not a directory; pass a store level or its parent")
    if _is_level(path):
        return [path]
    subs = sorted(os.path.join(path, n) for n in os.listdir(path))
    levels = [d for d in subs if os.path.isdir(d) and _is_level(d)]
    if not levels:
        raise StrataError(f"{path} holds no store level (no strata-index/ or strata-conv- files "
                          "in it or in its subdirectories)")  # fmt: skip
    return levels


def _scan(d: str, now: float) -> dict[str, Any]:
    entries, nbytes, oldest = 0, 0, None
    for name in os.listdir(d):
        parsed = parse_name(name)
        if parsed is None:
            continue
        try:
            st = os.stat(os.path.join(d, name))
        except OSError:
            continue  # removed while we looked
        nbytes += st.st_size
        if parsed[1] == "side":
            entries += 1
            oldest = st.st_mtime if oldest is None else min(oldest, st.st_mtime)
    return {"dir": d, "entries": entries, "bytes": nbytes,
            "oldest_age_s": round(now - oldest, 1) if oldest is not None else None}  # fmt: skip


def _snapshot(levels: list[str]) -> dict[str, Any] | None:
    best: tuple[float, dict[str, Any]] | None = None
    for d in levels:
        path = os.path.join(d, INDEX_DIR, MONITOR_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_MONITOR_BYTES + 1)
            doc = json.loads(raw) if len(raw) <= MAX_MONITOR_BYTES else None
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("written_at"), (int, float)):
            continue  # not a snapshot (being written, or not ours)
        if best is None or doc["written_at"] > best[0]:
            best = (float(doc["written_at"]), doc)
    return best[1] if best else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_monitor(path: str | None = None, *, levels: list[str] | None = None) -> dict[str, Any]:
    """The monitor's document for the store at ``path`` (or of the level directories
    ``levels``): per level what the folder holds now (and its budget and counters from the last
    snapshot), the Store's counters, and where the snapshot came from."""
    now = time.time()
    if levels is None:
        if path is None:
            raise StrataError("read_monitor needs a path or the level directories")
        levels = find_levels(path)
    for d in levels:
        if not os.path.isdir(d):
            raise StrataError(f"level directory {d} does not exist")
    snap = _snapshot(levels)
    by_dir = {}
    if snap is not None:
        for name, lv in snap.get("levels", {}).items():
            if isinstance(lv, dict):
                by_dir[os.path.realpath(str(lv.get("dir", "")))] = (name, lv)
    out_levels: dict[str, Any] = {}
    if snap is not None and isinstance(snap.get("levels", {}).get("ram"), dict):
        ram = snap["levels"]["ram"]
        out_levels["ram"] = {"dir": None, "entries": ram.get("entries"),
                             "bytes": ram.get("bytes"), "budget": ram.get("budget"),
                             "oldest_age_s": None, "evictions": ram.get("evictions")}  # fmt: skip
    for d in levels:
        scan = _scan(d, now)
        name, lv = by_dir.get(os.path.realpath(d), (os.path.basename(d) or d, {}))
        out_levels[name] = {**scan, "budget": lv.get("budget"), "hits": lv.get("hits"),
                            "degradations": lv.get("degradations"),
                            "evictions": (lv.get("disk_evictions", 0) + lv.get("age_evictions", 0)
                                          if lv else None)}  # fmt: skip
    rank = {"ram": 0, "warm": 1, "cold": 2}
    out_levels = dict(sorted(out_levels.items(), key=lambda kv: rank.get(kv[0], 3)))
    counters = {}
    if snap is not None:
        counters = {k: snap.get(k) for k in _COUNTERS}
    return {
        "path": os.path.abspath(path) if path else os.pathsep.join(levels),
        "time": now,
        "snapshot": None if snap is None else {
            "pid": snap.get("pid"), "written_at": snap.get("written_at"),
            "age_s": round(now - float(snap["written_at"]), 1),
            "writer_alive": _alive(snap.get("pid")),
        },
        "levels": out_levels,
        "counters": counters,
    }  # fmt: skip


def prometheus_text(s: dict[str, Any]) -> str:
    """``Store.stats()`` (or the monitor's counters and levels) in the Prometheus text
    exposition format; an absent counter is written as 0."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, rows: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP strata_{name} {help_}")
        lines.append(f"# TYPE strata_{name} {kind}")
        lines.extend(f"strata_{name}{labels} {value}" for labels, value in rows)

    metric("parks_total", "counter", "Parks by destination.",
           [('{destination="ram"}', s.get("parks_ram", 0)),
            ('{destination="disk"}', s.get("parks_disk", 0))])  # fmt: skip
    metric("discards_total", "counter", "Captures neither RAM nor disk could take.",
           [("", s.get("discards", 0))])  # fmt: skip
    metric("hits_total", "counter", "Restores by source.",
           [('{source="ram"}', s.get("hits_ram", 0)),
            ('{source="disk"}', s.get("hits_disk", 0))])  # fmt: skip
    metric("ladder_restores_total", "counter", "Restores that stopped below damage.",
           [("", s.get("ladder_restores", 0))])  # fmt: skip
    metric("tokens_restored_total", "counter", "Tokens restored instead of re-read.",
           [("", s.get("tokens_restored", 0))])  # fmt: skip
    metric("tokens_reread_total", "counter", "Tokens the engine had to prefill again.",
           [("", s.get("tokens_reread", 0))])  # fmt: skip
    for key, kind, help_ in [
        ("entries", "gauge", "Entries per level."),
        ("bytes", "gauge", "Bytes held per level."),
        ("budget", "gauge", "Byte budget per level."),
        ("oldest_age_s", "gauge", "Age of the oldest entry per disk level, in seconds."),
        ("disk_evictions", "counter", "Deleted by budget (last level only)."),
        ("age_evictions", "counter", "Deleted by age (last level only)."),
        ("degradations", "counter", "Handed to the next level."),
    ]:
        rows = [(f'{{level="{n}"}}', float(d[key])) for n, d in s["levels"].items()
                if d.get(key) is not None]  # fmt: skip
        if rows:
            metric(f"level_{key}", kind, help_, rows)
    return "\n".join(lines) + "\n"
