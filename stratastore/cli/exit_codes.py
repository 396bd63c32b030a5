"""The exit status of ``strata``: one table from error class to code, as borg's errors carry
theirs.

An error reaches the command line as one line on stderr (``strata: error: ...``, its message
naming the object and the fix), never a traceback, and as the code of the first class along its
MRO that :data:`TABLE` lists: a backend's "cannot reach the level" error (the Redis level's
``RemoteError``) is a :class:`LevelUnavailable` and an I/O error (:class:`StrataIOError`), and
exits with the unreachable level's code, because :class:`LevelUnavailable` comes first in its
MRO. No backend is named here. Every
:class:`StrataError` has a row (the root's, 2, catches what no family claims).

The store checks (``fsck``, ``conformance``, ``inspect``) keep the contract FSCK.md documents
for them and scripts rely on: 0 clean, 1 an error finding, 2 the check could not run, whatever
stopped it (their stderr line says what). :func:`exit_code` applies it; the table is what every
other command exits with. ``strata --help`` prints the table (:func:`epilog`) and
``docs/cli.md`` holds it (:func:`markdown_table`; a test keeps the two equal).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from enum import IntEnum

from stratastore.catalog import CatalogBusy
from stratastore.errors import ConfigError, LevelUnavailable, StrataError
from stratastore.facade import SpillError
from stratastore.format.errors import (
    ChecksumMismatch,
    FormatError,
    IncompatibleFingerprint,
    KeyMismatch,
)
from stratastore.io.errors import StrataIOError
from stratastore.levels.cascade import LevelRefused
from stratastore.levels.errors import StoreError
from stratastore.ops.level_dirs import NoStoreLevels
from stratastore.restore.two_pass import RestoreFailed
from stratastore.tiers.records import SpillRefused

__all__ = ["STORE_CHECKS", "TABLE", "ExitCode", "Row", "epilog", "exit_code", "markdown_table"]


class ExitCode(IntEnum):
    """The codes ``strata`` exits with (:data:`TABLE` says what each means)."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    FORMAT = 3
    DAMAGE = 4
    IO = 5
    REMOTE = 6
    BUSY = 7
    LEVEL = 8
    INTERRUPTED = 130
    BROKEN_PIPE = 141


@dataclass(frozen=True, slots=True)
class Row:
    """One exit code: what it means, and the error classes that exit with it."""

    code: ExitCode
    meaning: str
    errors: tuple[type[StrataError], ...] = ()


TABLE: tuple[Row, ...] = (
    Row(ExitCode.OK, "success: the command did what it was asked; a check found no error"),
    Row(
        ExitCode.FINDINGS,
        "the command ran and found a problem it reports: an error finding of fsck or "
        "conformance, a remote namespace fsck --remote leaves not clean, a figure of strata "
        "replay that differs",
    ),
    Row(
        ExitCode.USAGE,
        "usage or configuration: a bad argument (argparse), setting or config file, a path "
        "that names no store level, a repair refused until it knows the whole store; and any "
        "error no family below claims",
        (ConfigError, NoStoreLevels, StrataError),
    ),
    Row(
        ExitCode.FORMAT,
        "bytes that are not the format this reader reads (garbage, truncated, a newer "
        "version), or were written for another model",
        (FormatError, IncompatibleFingerprint),
    ),
    Row(
        ExitCode.DAMAGE,
        "stored bytes that fail validation: a BLAKE3 mismatch, a record under a key its "
        "content does not derive, a damaged image with the ladder off (run strata fsck)",
        (ChecksumMismatch, KeyMismatch, RestoreFailed),
    ),
    Row(
        ExitCode.IO,
        "an I/O call failed or was refused: a full volume, a permission, a file cut short "
        "while read, a symbolic link or a FIFO where a store file belongs",
        (StrataIOError,),
    ),
    Row(
        ExitCode.REMOTE,
        "a level could not be reached: the remote level refused, dropped or timed out a "
        "call, a cluster down, authentication refused",
        (LevelUnavailable,),
    ),
    Row(
        ExitCode.BUSY,
        "another live process held a conversation or a segment the command needs (the "
        "message names it): run it again when that process is done",
        (CatalogBusy,),
    ),
    Row(
        ExitCode.LEVEL,
        "a level cannot be used as asked (its filesystem, its index) or refused a write "
        "(full, or an entry over its budget); acknowledged parks whose write did not land",
        (StoreError, LevelRefused, SpillRefused, SpillError),
    ),
    Row(ExitCode.INTERRUPTED, "interrupted (Ctrl-C)"),
    Row(ExitCode.BROKEN_PIPE, "the reader of the output left (a pipe into head, say)"),
)

#: the commands whose exit status FSCK.md fixes: 0 clean, 1 an error finding, 2 the check
#: could not run (whatever stopped it)
STORE_CHECKS = ("fsck", "conformance", "inspect")

_CODE_OF: dict[type[StrataError], ExitCode] = {e: row.code for row in TABLE for e in row.errors}
assert len(_CODE_OF) == sum(len(row.errors) for row in TABLE), "a class in two rows"


def exit_code(error: StrataError, command: str | None = None) -> ExitCode:
    """The code ``strata COMMAND`` exits with when ``error`` stops it: :data:`ExitCode.USAGE`
    for a store check (FSCK.md: the check could not run), else the row of the first class in
    ``error``'s MRO that :data:`TABLE` lists."""
    if command in STORE_CHECKS:
        return ExitCode.USAGE
    for cls in type(error).__mro__:
        code = _CODE_OF.get(cls)
        if code is not None:
            return code
    return ExitCode.USAGE  # unreachable: StrataError has a row


def _classes(row: Row, quote: str = "") -> str:
    return ", ".join(f"{quote}{e.__name__}{quote}" for e in row.errors)


def epilog() -> str:
    """The table as ``strata --help`` prints it below the commands."""
    lines = ["exit status (the first class in an error's MRO that has a code):"]
    for row in TABLE:
        text = row.meaning + (f" [{_classes(row)}]" if row.errors else "")
        lines += textwrap.wrap(
            text, 78, initial_indent=f"  {row.code:<5}", subsequent_indent=" " * 7
        )
    lines += textwrap.wrap(
        f"{', '.join(STORE_CHECKS)}: 0 clean, 1 an error finding, 2 the check could not run "
        "(whatever stopped it; FSCK.md)",
        78,
        initial_indent="  ",
        subsequent_indent="  ",
    )
    return "\n".join(lines)


def markdown_table() -> str:
    """The table as ``docs/cli.md`` holds it (a Markdown table, one row per code)."""
    lines = ["| code | meaning | error classes |", "| ---: | --- | --- |"]
    lines += [
        f"| {row.code.value} | {row.meaning} | {_classes(row, '`') or '-'} |" for row in TABLE
    ]
    return "\n".join(lines)
