"""What several commands share: the global options, argument types, plain-text tables, and the
store's levels as the store checks find them (``stratastore.ops.level_dirs``, FSCK.md "Which
levels")."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.io import pathnames

if TYPE_CHECKING:
    from stratastore.ops.level_dirs import StoreLevels

__all__ = [
    "AddCommand",
    "absolute",
    "config_dirs",
    "global_options",
    "int_list",
    "levels_doc",
    "positive",
    "print_rows",
    "store_levels",
]

#: how a command module registers its command: ``add_parser(name, help=...)`` of the top
#: parser's subcommands, with the global options (:func:`global_options`) as parents
AddCommand = Callable[..., argparse.ArgumentParser]


def global_options() -> argparse.ArgumentParser:
    """The options every command also takes after its name (``strata fsck --config FILE``):
    their default SUPPRESS leaves the value given before the name in place, so either position
    works, and one given after the name wins."""
    g = argparse.ArgumentParser(add_help=False)
    g.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="a TOML config (what strata init writes); the same as --config before the command",
    )
    return g


def positive(text: str) -> int:
    """An integer of at least 1 (an argument type: argparse reports the message, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def int_list(text: str) -> list[int]:
    """A comma-separated list of one or more integers >= 0 (an argument type)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} needs one or more integers >= 0")
    return values


def print_rows(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print ``rows`` under ``headers``, each column right-aligned to its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    for line in [headers, *rows]:
        print("  ".join(f"{x!s:>{w}}" for x, w in zip(line, widths, strict=True)))


def absolute(path: str) -> str:
    """``path`` made absolute against the working directory, as the levels are named."""
    return pathnames.abspath(path)


def store_levels(args: argparse.Namespace) -> StoreLevels:
    """The levels fsck, conformance and inspect check: those of the paths given (a store root,
    a level directory or a config file each), else those of ``--config``."""
    from stratastore.ops.level_dirs import find_store_levels

    return find_store_levels(args.dirs, args.store_config, args.config or "--config")


def levels_doc(levels: StoreLevels) -> dict[str, Any]:
    """Which levels a command checked, for its ``--json`` output."""
    return {
        "levels": list(levels.checked),
        "store_levels": list(levels.store),
        "levels_complete": levels.complete,
        "levels_from": levels.found_from,
    }


def config_dirs(args: argparse.Namespace) -> list[str]:
    """The level directories of ``--config`` (first level first), for commands given no DIR."""
    cfg: StoreConfig | None = args.store_config
    dirs = [] if cfg is None else [lv.dir for lv in cfg.disk_levels() if lv.dir]
    if not dirs:
        raise ConfigError(
            "name the store's level directories, or pass --config FILE whose "
            "levels (or warm_dir/cold_dir, with budgets) name them"
        )
    return dirs
