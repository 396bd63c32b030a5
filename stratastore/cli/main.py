"""The ``strata`` command line: the parser and its global options, the dispatch to one module
per command, and the exit status of an error (:mod:`stratastore.cli.exit_codes`).

A command module registers its command (``add_parser``) and runs it (the ``func`` it sets), and
imports what it runs (the harnesses, the operator tools) inside its functions, so importing the
CLI loads none of them. A user error prints one line (``strata: error: ...``) and exits with
its class's code, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from collections.abc import Sequence

from stratastore import __version__
from stratastore.cli import bench, conformance, demo, fsck, init, inspect, monitor, replay, sim
from stratastore.cli.common import global_options
from stratastore.cli.exit_codes import ExitCode, epilog, exit_code
from stratastore.config import StoreConfig
from stratastore.errors import StrataError
from stratastore.io.system import silence_stdout

__all__ = ["build_parser", "main"]

#: the command modules, in the order ``strata --help`` lists them
COMMANDS = (demo, inspect, sim, replay, fsck, conformance, monitor, init, bench)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``strata``: ``--version``, ``--config`` (also accepted after the command)
    and one subcommand per module of :data:`COMMANDS`; the exit codes in its epilog."""
    p = argparse.ArgumentParser(
        prog="strata",
        description="stratastore: durable, tiered, validated storage for LLM conversation state",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"strata {__version__}")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a TOML config (strata init writes one): its level directories are the "
        "default DIRs of fsck, conformance, inspect and monitor; demo takes its "
        "settings but keeps its own small levels (also accepted after COMMAND)",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    command = functools.partial(sub.add_parser, parents=[global_options()])
    for module in COMMANDS:
        module.add_parser(command)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``strata`` with ``argv`` (default: the process's arguments) and return its exit
    status: the command's (0, or 1 for what it found), or the code of the error that stopped
    it (:func:`~stratastore.cli.exit_codes.exit_code`); argparse exits 2 on a usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _say_store_lines()
    if args.command is None:
        parser.print_help()
        return ExitCode.OK
    try:
        args.store_config = StoreConfig.from_toml(args.config) if args.config else None
        return int(args.func(args))
    except StrataError as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return int(exit_code(e, args.command))
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # `strata ... | head`: the reader left; not an error of ours
        silence_stdout()  # no second error when Python flushes at exit
        return ExitCode.BROKEN_PIPE


def _say_store_lines() -> None:
    """A store's warnings, as the commands print them: ``stratastore: <line>`` on stderr (the
    ``stratastore`` logger's records at WARNING and above), unless the logger already has a
    handler (a caller of :func:`main` that routes them itself)."""
    logger = logging.getLogger("stratastore")
    if logger.handlers:
        return
    handler = _Stderr(logging.WARNING)
    handler.setFormatter(logging.Formatter("stratastore: %(message)s"))
    logger.addHandler(handler)


class _Stderr(logging.Handler):
    """Writes each record to ``sys.stderr`` as it is when the record is emitted (a handler made
    once must not keep a stream that was replaced since, as a test's capture is)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)
