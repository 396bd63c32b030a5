"""``strata replay``: the agent-edit, park-truncate and low-RAM-window workloads run through the
public :class:`~stratastore.Store` API turn by turn, as an engine drives it, beside the simulator's
figures and the reference tables (:mod:`strata_harness.replay`, loaded only when the
command runs); exit 1 when a figure of the Store differs from its reference."""

from __future__ import annotations

import argparse
import json

from stratastore.cli.common import AddCommand, absolute

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    rp = command(
        "replay",
        help="the agent-edit, park-truncate and low-RAM-window workloads through the Store, "
        "turn by turn, beside the simulator and the reference tables",
    )
    rp.add_argument(
        "--dir",
        help="where the replay's disk levels and system-prompt cache go (default: a temporary one)",
    )
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the replay's report (or its JSON); 0 when every Store figure matches, else 1."""
    from strata_harness.replay import format_replay, run_replay

    rep = run_replay(absolute(args.dir) if args.dir is not None else None)
    print(json.dumps(rep.to_json(), indent=2) if args.json else format_replay(rep))
    return 0 if rep.ok else 1
