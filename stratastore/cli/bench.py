"""``strata bench``: a validated restore beside a raw read and ``np.load``, hot and cold
(:mod:`strata_harness.bench`); ``--peers`` and ``--lmcache`` run the peer benchmarks
(:mod:`strata_harness.peers`, :mod:`strata_harness.lmcache_bench`). Each harness is
loaded only when its benchmark runs: the library never imports one."""

from __future__ import annotations

import argparse
import json

from stratastore.cli.common import AddCommand, positive, print_rows

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    bench = command("bench", help="validated restore vs raw read and np.load, hot and cold")
    bench.add_argument("--dir", help="where to write the image (default: a temporary directory)")
    bench.add_argument("--mib", type=positive, default=1024, help="image size (default 1024)")
    bench.add_argument("--rounds", type=positive, default=3)
    bench.add_argument("--hot-only", action="store_true", help="skip the cold-cache reads")
    bench.add_argument("--json", action="store_true")
    bench.add_argument(
        "--peers",
        action="store_true",
        help="durable park and reads in the engine's paged pool (allocated once), and into "
        "fresh arrays, vs the disk's limits, numpy, safetensors, torch and LMCache (those "
        "installed), on the same bytes, every result compared bit for bit, cold reads "
        "verified uncached",
    )
    bench.add_argument(
        "--lmcache",
        action="store_true",
        help="LMCache with its local disk backend (+ fsync) beside LMCache with the stratastore "
        "plugin: durable store, retrieve hot and cold, 50%% prefix (the lmcache extra)",
    )
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark asked for and print its figures (or its JSON document)."""
    if args.peers:
        return _peers(args)
    if args.lmcache:
        return _lmcache(args)
    from strata_harness.bench import run_bench

    doc = run_bench(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"strata bench: {doc['bytes'] / 2**30:.2f} GiB in {doc['segments']} segments, "
        f"medians of {doc['rounds']} rounds, cold cache by {doc['cold_cache']}"
    )
    print_rows(["", "GB/s"], [[k, f"{v:.2f}"] for k, v in doc["gb_per_s"].items()])
    print_rows(["ratio", ""], [[k, f"{v:.2f}x"] for k, v in doc["ratios"].items()])
    print_rows(
        ["restore split", "GB/s"],
        [[k, f"{v:.2f}"] for k, v in doc["restore_passes_gb_per_s"].items()],
    )
    return 0


def _peers(args: argparse.Namespace) -> int:
    from strata_harness.peers import render_peers, run_peers

    doc = run_peers(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    print(json.dumps(doc, indent=2) if args.json else render_peers(doc))
    return 0


def _lmcache(args: argparse.Namespace) -> int:
    from strata_harness.lmcache_bench import render_lmcache, run_lmcache

    doc = run_lmcache(args.dir, mib=args.mib, rounds=args.rounds, cold=not args.hot_only)
    print(json.dumps(doc, indent=2) if args.json else render_lmcache(doc))
    return 0
