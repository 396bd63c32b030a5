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
    return subprocess.run(
        [sys.executable, "-m", "stratastore.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


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
    for row in ("discards", "ladder restores", "tokens served from RAM / disk"):
        assert row in r.stdout
    assert "fsck                              only the flipped byte: " in r.stdout
    assert "real model:" in r.stdout and "DIFFER" not in r.stdout
    # strata monitor on the demo's directory: the levels it scans, the counters it published
    m = run_cli("monitor", str(tmp_path / "d"), "--once", "--json")
    assert m.returncode == 0, m.stderr
    doc = json.loads(m.stdout)
    assert set(doc["levels"]) == {"ram", "warm", "cold"}
    cold = doc["levels"]["cold"]
    assert cold["entries"] > 0 and cold["budget"] == 1024 << 20 and cold["oldest_age_s"] >= 0
    assert doc["counters"]["ladder_restores"] == 1 and doc["counters"]["parks_ram"] > 0
    assert doc["snapshot"]["writer_alive"] is False


def test_monitor_views(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stratastore import Store
    from tests.unit.facade.test_store_facade import conversation

    fp = tiny_fp()
    cold = tmp_path / "cold"
    with Store.open(fp, {"ram_mib": 0, "cold_dir": str(cold), "cold_mib": 4}) as store:
        conv, kv = conversation("m", 40, 3)
        assert store.park(conv, kv).where == "disk"
        store.flush()  # the disk writer has written it
        stats_live = store.stats()
    assert main(["monitor", str(cold), "--once", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["counters"]["parks_disk"] == stats_live["parks_disk"] == 1
    live_cold = stats_live["levels"]["cold"]
    assert doc["levels"]["cold"]["entries"] == live_cold["entries"] == 3  # 3 segments
    assert doc["levels"]["cold"]["bytes"] == live_cold["bytes"]
    assert main(["monitor", str(cold), "--once", "--prometheus"]) == 0
    prom = capsys.readouterr().out
    assert 'strata_parks_total{destination="disk"} 1' in prom
    assert 'strata_level_entries{level="cold"} 3\n' in prom  # a count: an integer
    assert main(["monitor", str(cold), "--once"]) == 0
    table = capsys.readouterr().out
    assert "cold" in table and "parks ram=0 disk=1" in table
    # the live view redraws until interrupted
    calls = []

    def sleep(s: float) -> None:
        calls.append(s)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    assert main(["monitor", str(cold), "--interval", "0.5"]) == 0
    assert calls == [0.5, 0.5] and capsys.readouterr().out.count("strata monitor:") == 2
    # a folder without a store is a clear error
    assert main(["monitor", str(tmp_path / "nothing-here")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["monitor", str(tmp_path / "empty"), "--once"]) == 2
    assert "holds no store level" in capsys.readouterr().err


def test_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stratastore.levels.local import SegmentStore

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
        (["inspect", "/nonexistent/x"], "does not exist"),  # fsck's discovery, and its words
        (["inspect", "{empty}"], "holds no store level"),
        (["inspect", "{garbage}"], "not a valid v1 sidecar"),
        (["demo", "--requests", "0"], "must be at least 1"),
        (["demo", "--requests", "many"], "is not an integer"),
        (["nosuchcommand"], "invalid choice"),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / f"strata-conv-{'ab' * 32}.side").write_bytes(b"junk" * 100)
    args = [a.format(empty=tmp_path / "empty", garbage=tmp_path / "garbage") for a in args]
    r = run_cli(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_runs_small(tmp_path: Path) -> None:
    r = run_cli(
        "bench", "--mib", "16", "--rounds", "1", "--hot-only", "--json", "--dir", str(tmp_path)
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ratios"]["restore/raw hot"] > 0 and not (tmp_path / "raw.bin").exists()


def test_bad_config_and_monitor_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(tmp_path / "none.toml"), "fsck"]) == 2
    assert "does not exist; create it with strata init" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("ram_mib = -5\n")
    assert main(["--config", str(bad), "fsck"]) == 2
    assert "ram_mib=-5 must be an integer" in capsys.readouterr().err
    # a garbage snapshot is ignored, never a traceback: the folder scan still answers
    from stratastore.levels.local import SegmentStore

    fp = tiny_fp()
    with SegmentStore.open(tmp_path / "lvl", fp) as s:
        s.put_kv(s.root_key, [1, 2, 3], kv_bytes(fp, 3), token_start=0)
    (tmp_path / "lvl" / "strata-index" / "monitor.json").write_bytes(b"\xff{not json")
    assert main(["monitor", str(tmp_path / "lvl"), "--once", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["snapshot"] is None and doc["levels"]["lvl"]["entries"] == 1
