"""``strata init``: measure this machine, ask a few questions (the slots, the disk, then the
context size; no answer: the default), write a TOML config that ``Store.open(fp, path)`` and
every command's ``--config`` read (:mod:`stratastore.ops.installer`). ``--yes`` asks nothing
and writes exactly the defaults."""

from __future__ import annotations

import argparse

from stratastore.cli.common import AddCommand, absolute
from stratastore.config import StoreConfig

__all__ = ["add_parser", "run"]


def add_parser(command: AddCommand) -> None:
    from stratastore.ops.installer import MODEL_SIZES

    ini = command("init", help="measure this machine, ask a few questions, write a config")
    ini.add_argument("--yes", action="store_true", help="ask nothing: write the defaults")
    ini.add_argument("--output", default="strata.toml", help="where to write (strata.toml)")
    ini.add_argument(
        "--model-size",
        choices=sorted(MODEL_SIZES),
        help="the model: its K/V a token and its context, for the estimates it prints and the "
        "context size's default (asked otherwise)",
    )
    ini.add_argument("--force", action="store_true", help="replace an existing file")
    ini.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Write the config to ``--output`` (refused when it exists, unless ``--force``) and name
    the settings that differ from the defaults."""
    from stratastore.ops.installer import measure_machine, run_init, write_config

    def ask(question: str) -> str:
        try:
            return input(question)
        except EOFError:  # no answer: the default
            print()
            return ""

    cfg = run_init(
        yes=args.yes, ask=ask, say=print, machine=measure_machine(), model_size=args.model_size
    )
    write_config(cfg, absolute(args.output), force=args.force)
    changed = {k: v for k, v in cfg.to_mapping().items() if getattr(StoreConfig(), k) != v}
    shown = ", ".join(f"{k}={v!r}" for k, v in changed.items()) if changed else "the defaults"
    print(f"wrote {args.output}: {shown}")
    return 0
