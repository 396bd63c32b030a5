"""The ``strata`` CLI: version/help, the demo, inspect, and one-line errors (no tracebacks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stratastore import __version__
from stratastore.cli import main
from tests.conftest import kv_bytes, tiny_fp


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stratastore.cli", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_version_and_help() -> None:
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"strata {__version__}"
    r = run_cli("--help")
    assert r.returncode == 0 and "demo" in r.stdout and "inspect" in r.stdout


def test_demo_end_to_end(tmp_path: Path) -> None:
    r = run_cli("demo", "--dir", str(tmp_path / "d"), "--requests", "40")
    assert r.returncode == 0, r.stderr
    assert "stopping at the damaged segment" in r.stdout
    for level in ("ram", "warm", "cold"):
        assert f"\n  {level} " in r.stdout
    assert "discards" in r.stdout


def test_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stratastore import SegmentStore

    fp = tiny_fp()
    with SegmentStore.open(tmp_path, fp) as s:
        s.put_kv(s.root_key, [1, 2, 3], kv_bytes(fp, 3), token_start=0)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["entries"] == 1 and doc["segments"][0]["tokens"] == [0, 3]
    assert main(["inspect", str(tmp_path)]) == 0
    assert "1 segments" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "/nonexistent/x"], "is not a directory"),
        (["inspect", "{empty}"], "holds no stratastore segments"),
        (["inspect", "{garbage}"], "not a valid v1 sidecar"),
        (["demo", "--requests", "0"], "must be at least 1"),
        (["demo", "--requests", "many"], "is not an integer"),
        (["nosuchcommand"], "invalid choice"),
    ],
)
def test_user_errors_are_one_line_without_traceback(tmp_path: Path, args: list[str],
                                                    message: str) -> None:  # fmt: skip
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / f"strata-conv-{'ab' * 32}.side").write_bytes(b"junk" * 100)
    args = [a.format(empty=tmp_path / "empty", garbage=tmp_path / "garbage") for a in args]
    r = run_cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_runs_small(tmp_path: Path) -> None:
    r = run_cli("bench", "--mib", "16", "--rounds", "1", "--hot-only", "--json", "--dir",
                str(tmp_path))  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ratios"]["restore/raw hot"] > 0 and not (tmp_path / "raw.bin").exists()
