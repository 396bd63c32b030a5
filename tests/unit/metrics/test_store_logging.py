"""A store's lines go through ``logging`` (the logger ``stratastore``): warnings at WARNING, the
admission lines and the park target ``auto`` chose at INFO, routed by the engine's handlers,
with the ``warn=`` callback still called with every line when given; and the demo's progress
bar, off a terminal, prints no carriage return."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from strata_harness import demo
from stratastore import Store
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
MIB = 1 << 20


def _low_ram_day(tmp_path: Path, warn: list[str] | None) -> None:
    """A warning (``park = disk`` with no disk level... then a store that has one) and
    admission lines (a disk hit under the transient floor, then one skipped)."""
    with Store.open(FP, {"ram_mib": 4, "park": "disk"}, warn=None if warn is None else warn.append):
        pass  # parking stays in RAM: said as a warning
    free = [1 << 40]
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 2560,
        "park_min_free_mib": 512,
    }
    store = Store.open(FP, cfg, probe=lambda: free[0], warn=None if warn is None else warn.append)
    with store:
        conv, kv = conversation_kv("c1", 100, 0, step=0)
        store.park(conv, kv)
        store.flush()
        free[0] = 1000 * MIB  # above the transient floor only
        assert store.restore(conv.tokens, np.zeros(kv.size, np.uint8)).tokens == 100


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, str]]:
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


@pytest.mark.parametrize("callback", [False, True])
def test_warnings_and_admission_lines_are_log_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, callback: bool
) -> None:
    lines: list[str] = []
    with caplog.at_level(logging.INFO, logger="stratastore"):
        _low_ram_day(tmp_path, lines if callback else None)
    got = _records(caplog)
    warning = [m for n, lv, m in got if lv == logging.WARNING and "needs a disk level" in m]
    info = [m for n, lv, m in got if lv == logging.INFO and m.startswith("disk hit under")]
    assert warning and info, got
    assert all(n == "stratastore" or n.startswith("stratastore.") for n, _, _ in got), got
    if callback:  # the engine's callback hears every line, the records are there too
        assert lines == [m for _, _, m in got], (lines, got)


def test_an_engine_routes_the_lines_with_its_own_handler(tmp_path: Path) -> None:
    heard: list[logging.LogRecord] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            heard.append(record)

    logger = logging.getLogger("stratastore")
    handler, level = Handler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # the engine's choice: warnings only
    try:
        _low_ram_day(tmp_path, None)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert heard and {r.levelno for r in heard} == {logging.WARNING}
    assert any("needs a disk level" in r.getMessage() for r in heard)


def test_the_demo_progress_bar_off_a_terminal_prints_no_carriage_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "_real_model_phase", lambda path: True)  # the store's part only
    assert demo.run_demo(str(tmp_path), 20, kept=False) == 0
    out = capsys.readouterr().out
    assert "\r" not in out
    bars = [ln for ln in out.splitlines() if ln.startswith("  [")]
    assert bars and bars[-1].startswith(f"  [{'#' * 30}] 20/20"), bars
