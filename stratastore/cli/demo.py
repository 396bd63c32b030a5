"""``strata demo``: a small end-to-end run of the whole store (parks, restores, the cascade, a
damaged segment, fsck, the counters): the main job of ``make demo``
(:mod:`strata_harness.demo`, loaded only when the command runs)."""

from __future__ import annotations

import argparse
import tempfile

from stratastore.cli.common import AddCommand, absolute, positive

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    demo = command("demo", help="run the end-to-end demo (the main job of `make demo`)")
    demo.add_argument("--dir", help="store directory to use (default: a temporary one)")
    demo.add_argument(
        "--requests", type=positive, default=60, help="requests to serve (default 60)"
    )
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The demo in ``--dir`` (kept), else in a temporary directory removed afterwards; it takes
    ``--config``'s settings but keeps its own small levels."""
    from strata_harness.demo import run_demo

    if args.dir is not None:
        return run_demo(absolute(args.dir), args.requests, args.store_config)
    with tempfile.TemporaryDirectory(prefix="strata-demo-") as d:
        return run_demo(d, args.requests, args.store_config, kept=False)
