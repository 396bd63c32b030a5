"""``strata monitor`` for machines: ``--json`` and ``--prometheus`` print one document and exit, and
a snapshot of the right syntax but the wrong types is reported, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stratastore import Store
from stratastore.cli import main
from stratastore.format.naming import INDEX_DIR
from stratastore.metrics.monitor import MONITOR_FILE
from tests.conftest import tiny_fp
from tests.unit.facade.test_store_facade import conversation

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def level(tmp_path: Path) -> Path:
    """A cold level with one parked conversation and a published snapshot."""
    cold = tmp_path / "cold"
    with Store.open(tiny_fp(), {"ram_mib": 0, "cold_dir": str(cold), "cold_mib": 4}) as store:
        conv, kv = conversation("m", 40, 3)
        store.park(conv, kv)
    return cold


@pytest.mark.parametrize("fmt", ["--json", "--prometheus"])
def test_machine_formats_print_once_and_exit(level: Path, fmt: str) -> None:
    try:
        r = subprocess.run(
            [sys.executable, "-m", "stratastore.cli", "monitor", str(level), fmt],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=15,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"strata monitor {fmt} did not exit (it refreshes forever)")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout  # no screen codes in a machine format
    if fmt == "--json":
        doc = json.loads(r.stdout)  # exactly one document
        assert doc["counters"]["parks_disk"] == 1
    else:
        assert r.stdout.count("# TYPE strata_parks_total counter") == 1


@pytest.mark.parametrize(
    "garbage",
    [
        {"levels": "cold"},
        {"levels": {"cold": ["not", "a", "table"]}},
        {"levels": {"cold": {"dir": "x", "disk_evictions": "3", "age_evictions": 1}}},
        {"levels": {"cold": {"budget": "4194304"}}},
        {"parks_ram": [1, 2], "levels": {}},
        {"parks_disk": "1", "levels": {}},
        {"written_at": float("inf"), "levels": {}},
    ],
)
def test_a_wrongly_typed_snapshot_is_reported_not_a_traceback(
    level: Path, garbage: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {"pid": os.getpid(), "written_at": time.time(), **garbage}
    for name, lv in doc.get("levels", {}).items() if isinstance(doc["levels"], dict) else ():
        if isinstance(lv, dict) and lv.get("dir") == "x":
            doc["levels"][name]["dir"] = str(level)  # so the monitor pairs it with the folder
    (level / INDEX_DIR / MONITOR_FILE).write_text(json.dumps(doc))
    assert main(["monitor", str(level), "--once", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["snapshot"] is None and out["counters"] == {}
    assert "not a well-formed Store snapshot" in out["snapshot_problem"]
    assert out["levels"]["cold"]["entries"] > 0  # the folder scan still shows what it holds
    for fmt in ("--prometheus", "--once"):
        assert main(["monitor", str(level), "--once", fmt]) == 0
    assert "not a well-formed Store snapshot" in capsys.readouterr().out
