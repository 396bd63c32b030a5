"""``strata``'s exit status per error class: the table (first match along the MRO), the store
checks' FSCK.md contract (2 whenever the check could not run), one stderr line and no traceback,
the table in ``strata --help`` and in ``docs/cli.md``, and an import of the CLI that loads no
harness."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

import stratastore.ops.repair  # bound to the real fsck before a test replaces it
import stratastore.testing.conformance  # noqa: F401  (likewise)
from stratastore.catalog import CatalogBusy
from stratastore.catalog.tables import NameTaken
from stratastore.cli import main
from stratastore.cli.exit_codes import TABLE, ExitCode, exit_code, markdown_table
from stratastore.errors import ConfigError, StrataError
from stratastore.facade import SpillError, StoreClosed
from stratastore.format.errors import (
    ChecksumMismatch,
    FormatError,
    IncompatibleFingerprint,
    KeyMismatch,
    UnsupportedVersion,
)
from stratastore.io.errors import ShortRead, StrataIOError, SymlinkRefused
from stratastore.levels.cascade import LevelRefused
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.local import SegmentStore
from stratastore.levels.redis.backend import RemoteError
from stratastore.ops.level_dirs import NoStoreLevels
from stratastore.restore.two_pass import RestoreFailed
from stratastore.tiers.records import InvalidConversation, SpillRefused
from tests.conftest import tiny_fp

ROOT = Path(__file__).resolve().parents[3]
A, B = b"\x01" * 32, b"\x02" * 32

#: one instance of every family, and of subclasses whose MRO decides between two rows
ERRORS: list[tuple[BaseException, int]] = [
    (ConfigError("a setting is invalid"), 2),
    (InvalidConversation("a conversation cannot be stored as given"), 2),  # a ConfigError
    (NoStoreLevels("/x holds no store level"), 2),
    (NameTaken("a name is the other namespace's"), 2),  # no family: the root's row
    (StoreClosed("park"), 2),
    (FormatError("not a valid v1 sidecar"), 3),
    (UnsupportedVersion("a newer major version"), 3),
    (IncompatibleFingerprint("another model's store"), 3),
    (ChecksumMismatch("seg", A, B, page=0), 4),
    (KeyMismatch("seg", "tokens [0, 16)", A, B), 4),  # a FormatError, but damage comes first
    (RestoreFailed("a damaged image with the ladder off"), 4),
    (StrataIOError("write", "/x", errno.ENOSPC), 5),
    (ShortRead("/x", 1, 2), 5),
    (SymlinkRefused("open", "/x"), 5),
    (RemoteError("get", "redis://127.0.0.1:1/0", "connection refused"), 6),  # an I/O error
    (CatalogBusy("pid 1 holds conversation 'c'"), 7),
    (StoreError("a network filesystem"), 8),
    (SegmentNotFound("no segment has that key"), 8),
    (LevelRefused("cold is full"), 8),
    (SpillRefused("cold refused the write"), 8),
    (SpillError([("c", OSError("disk"))]), 8),
]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("error", "code"), ERRORS, ids=lambda x: type(x).__name__)
def test_a_command_exits_with_its_error_class_code(
    error: StrataError,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr("stratastore.metrics.monitor.read_monitor", fail)
    assert main(["monitor", str(tmp_path), "--once"]) == code
    assert _one_line(capsys.readouterr().err) == f"strata: error: {error}"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (FormatError("not a valid v1 sidecar"), 3),
        (ChecksumMismatch("seg", A, B), 4),
        (StrataIOError("read", "/x", errno.EIO), 5),
        (RemoteError("get", "redis://127.0.0.1:1/0", "connection refused"), 6),
        (CatalogBusy("pid 1 holds conversation 'c'"), 7),
        (StoreError("a network filesystem"), 8),
    ],
    ids=lambda x: type(x).__name__,
)
def test_a_store_check_exits_2_whatever_stopped_it(
    error: StrataError,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fsck, conformance and inspect keep FSCK.md's contract: 2 when the check could not run."""
    SegmentStore.open(tmp_path / "cold", tiny_fp()).close()

    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr("stratastore.ops.fsck.fsck", fail)
    monkeypatch.setattr("stratastore.testing.conformance.check_conformance", fail)
    monkeypatch.setattr("stratastore.cli.inspect._inspect_level", fail)
    for command in ("fsck", "conformance", "inspect"):
        assert main([command, str(tmp_path / "cold")]) == 2, command
        assert _one_line(capsys.readouterr().err) == f"strata: error: {error}"
    assert exit_code(error) == code  # what every other command exits with


def test_a_damaged_sidecar_exits_2_in_inspect_and_3_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"strata-conv-{'ab' * 32}.side").write_bytes(b"junk" * 100)
    assert main(["inspect", str(tmp_path)]) == 2  # the check could not run (FSCK.md)
    err = _one_line(capsys.readouterr().err)
    assert "not a valid v1 sidecar" in err
    from stratastore.levels.local import SegmentStore

    def read_monitor(*_: object, **__: object) -> object:  # the same sidecar, read by monitor
        return SegmentStore.fingerprint_in(str(tmp_path))

    monkeypatch.setattr("stratastore.metrics.monitor.read_monitor", read_monitor)
    assert main(["monitor", str(tmp_path), "--once"]) == ExitCode.FORMAT
    assert _one_line(capsys.readouterr().err) == err


def test_real_usage_and_io_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", str(tmp_path / "none")]) == 2  # NoStoreLevels
    assert "does not exist" in _one_line(capsys.readouterr().err)
    assert main(["monitor", str(tmp_path), "--interval", "0"]) == 2  # ConfigError
    assert "--interval 0" in _one_line(capsys.readouterr().err)
    assert main(["--config", str(tmp_path / "none.toml"), "monitor"]) == 2  # ConfigError
    assert "none.toml does not exist" in _one_line(capsys.readouterr().err)
    out = tmp_path / "no" / "such" / "strata.toml"  # the config's folder does not exist
    assert main(["init", "--yes", "--model-size", "8b", "--output", str(out)]) == ExitCode.IO
    err = _one_line(capsys.readouterr().err)
    assert str(out.parent) in err and f"errno {errno.ENOENT}" in err
    (tmp_path / "strata.toml").write_text("")
    assert main(["init", "--yes", "--output", str(tmp_path / "strata.toml")]) == 2
    assert "--force" in _one_line(capsys.readouterr().err)


def test_a_benchmark_that_cannot_run_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A harness's own error (no family of the table) takes the root's row."""
    import importlib.util

    find_spec = importlib.util.find_spec

    def without_lmcache(name: str, *args: object) -> object:
        return None if name == "lmcache" else find_spec(name)

    monkeypatch.setattr(importlib.util, "find_spec", without_lmcache)
    assert main(["bench", "--lmcache"]) == 2
    assert "stratastore[lmcache]" in _one_line(capsys.readouterr().err)


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["nosuchcommand"], ["demo", "--requests", "0"], ["sim"]):
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2, argv
        assert "Traceback" not in capsys.readouterr().err


def test_interrupted_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("stratastore.metrics.monitor.read_monitor", interrupt)
    assert main(["monitor", str(tmp_path), "--once"]) == ExitCode.INTERRUPTED == 130


def _strata_errors() -> set[type[StrataError]]:
    seen: set[type[StrataError]] = set()
    todo = [StrataError]
    while todo:
        cls = todo.pop()
        if cls not in seen and cls.__module__.startswith("stratastore."):
            seen.add(cls)
            todo += cls.__subclasses__()
    return seen


def test_the_table_is_one_code_per_class_and_covers_every_error() -> None:
    rows = [e for row in TABLE for e in row.errors]
    assert len(rows) == len(set(rows)) and all(issubclass(e, StrataError) for e in rows)
    codes = [row.code for row in TABLE]
    assert codes == sorted(set(codes)) and set(codes) == set(ExitCode)
    assert StrataError in rows  # the root's row: no error goes without a documented code
    for cls in _strata_errors():
        assert exit_code(cls.__new__(cls)) in codes, cls
    for error, code in ERRORS:
        assert exit_code(error) == code


def test_help_and_docs_print_the_table() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "exit status" in r.stdout
    for row in TABLE:
        assert f"\n  {row.code.value:<5}" in r.stdout, row.code
        for e in row.errors:
            assert e.__name__ in r.stdout, e
    assert markdown_table() in (ROOT / "docs" / "cli.md").read_text()


def test_importing_the_cli_loads_no_harness() -> None:
    code = (
        "import stratastore.cli, sys; "
        "print(sorted(m for m in sys.modules if m.startswith('strata_harness')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
