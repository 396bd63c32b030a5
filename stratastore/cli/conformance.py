"""``strata conformance [PATH...]``: check store directories written by any implementation
against the spec's MUST clauses (:mod:`stratastore.testing.conformance`); exit 0 when they
conform, 1 when a clause is violated, 2 when the check could not run (FSCK.md)."""

from __future__ import annotations

import argparse
import json

from stratastore.cli.common import AddCommand, levels_doc, store_levels

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    cf = command("conformance", help="check directories against the spec's MUST clauses")
    cf.add_argument(
        "dirs",
        nargs="*",
        metavar="PATH",
        help="a store written by any implementation: its root directory, a level "
        "directory or its config file (default: --config's levels)",
    )
    cf.add_argument("--json", action="store_true")
    cf.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Check the levels against the spec's MUST clauses; the verdict cites the spec and the
    finding ids by their paths in the installed package (the conformance kit it ships)."""
    from stratastore.testing.conformance import check_conformance
    from stratastore.testing.vectors import kit_path

    levels = store_levels(args)
    report = check_conformance(levels.checked, levels=levels)
    spec, ids = kit_path("SPEC.md"), kit_path("FSCK.md")
    if args.json:
        doc = {
            **levels_doc(levels),
            "spec": spec,
            "finding_ids": ids,
            "conforms": report.conforms,
            "violations": {c: [f.as_dict() for f in fs] for c, fs in report.violations.items()},
            "allowed": [f.as_dict() for f in report.allowed],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(levels.describe())
        for clause, found in sorted(report.violations.items()):
            for f in found:
                print(f"VIOLATES {clause}: {f.id}: {f.object}: {f.detail}")
        for f in report.allowed:
            print(f"allowed: {f.id}: {f.object}: {f.detail}")
        if report.conforms:
            print(f"conforms to {spec}")
        else:
            print(
                f"{len(report.violations)} MUST clauses violated (clauses: {spec}; "
                f"finding ids: {ids})"
            )
    return 0 if report.conforms else 1
