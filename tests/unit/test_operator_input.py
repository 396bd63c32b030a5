"""Bad operator input is one clear line: a CLI argument, a setting or a call argument that
cannot work is refused with a typed error naming it and the fix, never a traceback, a busy
loop or a silent surprise on the filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratastore import SegmentStore
from stratastore.cli import main
from tests.conftest import tiny_fp


def _one_line_error(err: str) -> str:
    """The single ``strata: error: ...`` line of a user error (no traceback, no usage block)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), err
    return lines[0]


@pytest.mark.parametrize("interval", ["-1", "0", "-0.5", "nan", "inf"])
def test_monitor_refuses_an_interval_that_is_not_a_positive_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    interval: str,
) -> None:  # fmt: skip
    SegmentStore.open(tmp_path / "cold", tiny_fp()).close()
    slept: list[float] = []

    def sleep(s: float) -> None:  # the live view would loop: stop it after two refreshes
        slept.append(s)
        if len(slept) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    assert main(["monitor", str(tmp_path / "cold"), "--interval", interval]) == 2
    assert slept == []  # refused before the first refresh
    line = _one_line_error(capsys.readouterr().err)
    assert f"--interval {interval}" in line and "positive" in line
