"""``strata monitor [DIR]``: what a store's levels hold (scanned from their folders) and the
counters its Store last published (:mod:`stratastore.metrics.monitor`): a table that refreshes
in place until Ctrl-C, or one document for machines (``--json``, ``--prometheus``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from stratastore.cli.common import AddCommand, config_dirs
from stratastore.errors import ConfigError
from stratastore.metrics.monitor import finite

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    mon = command("monitor", help="what a store's levels hold and its Store's counters")
    mon.add_argument(
        "dir",
        nargs="?",
        help="a store level directory, or the folder holding its levels (default: "
        "--config's levels)",
    )
    mon.add_argument(
        "--once",
        action="store_true",
        help="print the table once (default: a live view; --json and --prometheus "
        "always print once)",
    )
    fmt = mon.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--prometheus", action="store_true")
    mon.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between refreshes, more than 0 (default 1)",
    )
    mon.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The table refreshes in place until Ctrl-C (unless ``--once``); ``--json`` and
    ``--prometheus`` are for machines: one document, printed once, no screen codes."""
    from stratastore.metrics.monitor import published_stats, read_monitor
    from stratastore.metrics.prometheus import prometheus_text

    if not (math.isfinite(args.interval) and args.interval > 0):  # sleep(-1) raises, 0 spins
        raise ConfigError(
            f"--interval {args.interval:g} must be a positive number of "
            "seconds (e.g. --interval 1, the default)"
        )
    once = args.once or args.json or args.prometheus
    while True:
        path, dirs = (args.dir, None) if args.dir else (None, config_dirs(args))
        if args.prometheus:  # the stats the Store published: the series Store.prometheus() has
            out = prometheus_text(published_stats(path, levels=dirs))
        else:
            doc = read_monitor(path, levels=dirs)
            out = json.dumps(doc, indent=2) if args.json else _table(doc)
        if once:
            print(out)
            return 0
        sys.stdout.write(
            f"\x1b[H\x1b[2J{out}\n(refreshing every {args.interval:g} s; Ctrl-C to stop)\n"
        )
        sys.stdout.flush()
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def _mib(v: object) -> str:
    return f"{float(v) / 2**20:,.0f}" if finite(v) else "-"  # type: ignore[arg-type]


def _val(v: object) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not finite(v):
        return "?"  # a snapshot's overflowing or infinite number
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else _printable(str(v))


def _printable(text: str) -> str:
    """``text`` without control characters (a snapshot's names never move the terminal)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _table(doc: dict[str, Any]) -> str:
    """The monitor's document as the table a person reads: one row per level, then the
    counters (``-`` where the snapshot does not hold one)."""
    snap = doc["snapshot"]
    if snap is None:
        source = "no Store has published counters here yet"
    else:
        state = "running" if snap["writer_alive"] else "exited"
        source = f"counters from pid {snap['pid']} ({state}), {snap['age_s']:.0f} s ago"
    lines = [f"strata monitor: {doc['path']}  {source}"]
    if doc.get("snapshot_problem"):
        lines.append(f"  warning: {doc['snapshot_problem']}")
    lines.append(
        f"  {'level':<12}{'entries':>9}{'MiB':>9}{'budget MiB':>12}{'oldest s':>10}"
        f"{'hits':>7}{'moved down':>12}{'evicted':>9}  folder"
    )
    for name, lv in doc["levels"].items():
        lines.append(
            f"  {name:<12}{_val(lv['entries']):>9}{_mib(lv['bytes']):>9}"
            f"{_mib(lv['budget']):>12}{_val(lv.get('oldest_age_s')):>10}"
            f"{_val(lv.get('hits')):>7}{_val(lv.get('degradations')):>12}"
            f"{_val(lv.get('evictions')):>9}  {lv['dir'] or '(in process)'}"
        )
    c = doc["counters"]
    if c:
        lines.append(
            f"  parks ram={_val(c['parks_ram'])} disk={_val(c['parks_disk'])}  "
            f"discards={_val(c['discards'])}  evictions spilled={_val(c['evict_spills'])}  "
            f"hits ram={_val(c['hits_ram'])} disk={_val(c['hits_disk'])}"
            + (
                f" prompt_cache={_val(c['hits_prompt_cache'])}"
                if c.get("hits_prompt_cache") is not None
                else ""
            )
            + "  "
            f"ladder restores={_val(c['ladder_restores'])}"
        )
        lines.append(
            f"  park target {c['park_target']} ({c['park_target_source']}); "
            f"admission: {c['admission']}"
        )
    lines.extend(_speeds(doc.get("speeds")))
    return "\n".join(lines)


def _speeds(speeds: object) -> list[str]:
    """The per-slot speeds as rows: slot, park or restore, level, GB/s and tokens/s of the
    calls, calls a second and MB a second of the window (none before a Store published)."""
    if not isinstance(speeds, dict) or not isinstance(speeds.get("slots"), dict):
        return []
    rows = [
        f"  speeds over the last {_val(speeds.get('window_s'))} s, per slot:",
        f"  {'slot':<8}{'call':<9}{'level':<14}{'GB/s':>8}{'tokens/s':>12}{'calls/s':>9}"
        f"{'MB/s':>9}{'calls':>7}",
    ]
    for slot, kinds in speeds["slots"].items():  # a snapshot's odd entries are left out
        for kind, levels in (kinds if isinstance(kinds, dict) else {}).items():
            for level, f in (levels if isinstance(levels, dict) else {}).items():
                if not isinstance(f, dict):
                    continue
                load = f.get("bytes_per_s")
                mb = round(float(load) / 1e6, 3) if finite(load) else None  # type: ignore[arg-type]
                rows.append(
                    f"  {_val(slot):<8}{_val(kind):<9}{_val(level):<14}{_val(f.get('gb_s')):>8}"
                    f"{_val(f.get('tokens_s')):>12}{_val(f.get('per_s')):>9}{_val(mb):>9}"
                    f"{_val(f.get('count')):>7}"
                )
    return rows
