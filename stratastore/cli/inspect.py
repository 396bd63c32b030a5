"""``strata inspect [PATH...]``: the segments of each level of a store, as a store opening the
level reads them (spec F-DIR-2: a segment is its name and its sidecar's identity), and the files
it did not adopt (a damaged sidecar; a symbolic link or a FIFO named like a segment, spec
F-DIR-8). PATH is what fsck takes (a store root, a level directory or a config file; default:
``--config``'s levels). It opens each level with ``create=False`` and changes no segment file
(spec F-DIR-5).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stratastore.cli.common import AddCommand, absolute, levels_doc, store_levels
from stratastore.errors import StrataError
from stratastore.levels.directory import directory_model, open_directory

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    ins = command("inspect", help="list the segments of a store's levels")
    ins.add_argument(
        "dirs",
        nargs="*",
        metavar="PATH",
        help="the store as fsck takes it: its root directory, a level directory or "
        "its config file (default: --config's levels)",
    )
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The segments of each level of the store named as fsck takes it (a store root, a level
    directory or a config file; default: ``--config``'s levels)."""
    levels = store_levels(args)
    found = [_inspect_level(d) for d in levels.checked]
    if args.json:
        models = {lv["model"] for lv in found if lv["model"] is not None}
        doc = {
            "dirs": args.dirs,
            **levels_doc(levels),
            "model": models.pop() if len(models) == 1 else None,  # None: none, or several
            "entries": sum(lv["entries"] for lv in found),  # the segments a store reads
            "disk_bytes": sum(lv["disk_bytes"] for lv in found),
            "segments": [{"level": lv["dir"], **r} for lv in found for r in lv["segments"]],
            "skipped": [{"level": lv["dir"], **s} for lv in found for s in lv["skipped"]],
            "by_level": [
                {k: v for k, v in lv.items() if k not in ("segments", "skipped")} for lv in found
            ],
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not (len(args.dirs) == 1 and levels.checked == (absolute(args.dirs[0]),)):
        print(levels.describe())  # how the levels were found, unless one level was named
    for lv in found:
        model = f", {lv['model']}" if lv["model"] else ""
        print(f"{lv['dir']}: {lv['entries']} segments, {lv['disk_bytes']:,} bytes{model}")
        for r in lv["segments"]:
            t0, t1 = r["tokens"]
            print(
                f"  {r['key'][:16]}  {r['kind']:<5} {r['codec']:<4} tokens [{t0}, {t1}) "
                f"{r['pages']} pages {r['bytes']:,} B"
            )
        for s in lv["skipped"]:
            print(f"  not adopted: {s['file']}: {s['reason']}")
    return 0


def _special_segment_file(d: str, key: bytes) -> dict[str, str] | None:
    """Why a segment's sidecar or data file is not one a store reads (a symbolic link, a FIFO:
    ``lstat``, spec F-DIR-8), as an entry of inspect's skipped list; None when both are."""
    from stratastore.format import data_name, sidecar_name
    from stratastore.io import guard, pathnames

    for name in (sidecar_name(key), data_name(key)):
        try:
            guard.require_regular(pathnames.join(d, name), missing_ok=True)
        except StrataError as e:
            return {"file": name, "reason": str(e)}
    return None


def _inspect_level(path: str) -> dict[str, Any]:
    """One level's segments (as a store opening it reads them) and what it did not adopt."""
    fp = directory_model(path)  # the check open and fsck share
    if fp is None:
        return {
            "dir": path,
            "model": None,
            "entries": 0,
            "disk_bytes": 0,
            "segments": [],
            "skipped": [],
        }
    with open_directory(path, fp, create=False) as store:
        rows: list[dict[str, Any]] = []
        skipped = [{"file": s.name, "reason": s.reason} for s in store.skipped]
        for key in store.keys():
            special = _special_segment_file(path, key)
            if special is not None:  # indexed, but a link or a FIFO now (spec F-DIR-8)
                skipped.append(special)
                continue
            rec = store.record(key)
            rows.append(
                {
                    "key": key.hex(),
                    "kind": rec.kind.name.lower(),
                    "codec": rec.codec.name.lower(),
                    "tokens": [rec.token_start, rec.token_end],
                    "pages": rec.page_count,
                    "bytes": rec.total_bytes,
                    "sealed_at_ns": rec.sealed_at_ns,
                }
            )
        disk_bytes = store.stats().disk_bytes
    return {
        "dir": path,
        "model": fp.describe(),
        "entries": len(rows),
        "disk_bytes": disk_bytes,
        "segments": rows,
        "skipped": skipped,
    }
