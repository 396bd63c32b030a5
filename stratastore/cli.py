"""The ``strata`` command line. User errors print one line and exit non-zero, never a traceback.

Commands: ``demo`` (the main job: a small end-to-end run of what exists), ``inspect DIR``
(list a store's segments). Later issues add fsck, monitor, init, bench and sim.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import ConfigError, StrataError
from .format import ModelFingerprint, decode_sidecar
from .format.sidecar import MAX_SIDECAR_BYTES
from .io import files
from .store import SegmentStore

__all__ = ["main"]


def _fingerprint_from_dir(path: str) -> ModelFingerprint:
    """The fingerprint of the first committed sidecar in ``path`` (inspect needs no model)."""
    if not os.path.isdir(path):
        raise ConfigError(f"{path} is not a directory; pass a store directory")
    for name in sorted(files.listdir(path)):
        if name.startswith("strata-conv-") and name.endswith(".side"):
            raw = files.read_file(os.path.join(path, name), MAX_SIDECAR_BYTES)
            return decode_sidecar(raw, name).fingerprint
    raise ConfigError(f"{path} holds no stratastore segments (no strata-conv-*.side files)")


def cmd_inspect(args: argparse.Namespace) -> int:
    path = os.path.abspath(args.dir)
    fp = _fingerprint_from_dir(path)
    with SegmentStore.open(path, fp, create=False) as store:
        rows: list[dict[str, Any]] = []
        for key in store.keys():
            rec = store.record(key)
            rows.append({
                "key": key.hex(), "kind": rec.kind.name.lower(), "codec": rec.codec.name.lower(),
                "tokens": [rec.token_start, rec.token_end], "pages": rec.page_count,
                "bytes": rec.total_bytes, "sealed_at_ns": rec.sealed_at_ns,
            })  # fmt: skip
        stats = store.stats()
        skipped = [{"file": s.name, "reason": s.reason} for s in store.skipped]
    if args.json:
        doc = {"dir": path, "model": fp.describe(), "entries": stats.entries,
               "disk_bytes": stats.disk_bytes, "segments": rows, "skipped": skipped}  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{path}: {stats.entries} segments, {stats.disk_bytes:,} bytes, {fp.describe()}")
    for r in rows:
        t0, t1 = r["tokens"]
        print(f"  {r['key'][:16]}  {r['kind']:<5} {r['codec']:<4} tokens [{t0}, {t1}) "
              f"{r['pages']} pages {r['bytes']:,} B")  # fmt: skip
    for s in skipped:
        print(f"  not adopted: {s['file']}: {s['reason']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.dir is not None:
        return run_demo(os.path.abspath(args.dir), args.tokens)
    with tempfile.TemporaryDirectory(prefix="strata-demo-") as d:
        return run_demo(d, args.tokens)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="strata",
        description="stratastore: durable, tiered, validated storage for LLM conversation state",
    )
    p.add_argument("--version", action="version", version=f"strata {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the end-to-end demo (the main job of `make demo`)")
    demo.add_argument("--dir", help="store directory to use (default: a temporary one)")
    demo.add_argument("--tokens", type=_positive, default=2048,
                      help="tokens per conversation (default 2048)")  # fmt: skip
    demo.set_defaults(func=cmd_demo)
    ins = sub.add_parser("inspect", help="list the segments of a store directory")
    ins.add_argument("dir", help="store directory")
    ins.add_argument("--json", action="store_true", help="machine-readable output")
    ins.set_defaults(func=cmd_inspect)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except StrataError as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
