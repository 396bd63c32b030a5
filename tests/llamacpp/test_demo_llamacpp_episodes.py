"""``strata demo`` with llama-cpp-python installed runs the agent-edit, park-truncate and low-RAM
episodes of ``strata sim`` through llama.cpp (:mod:`strata_harness.demo_llamacpp`): the
200-turn edit re-reads what the simulation says, the prefix that fits comes back where the
simulation says (and nothing without ``park_truncate``), the low-RAM window spills every park
to disk and discards none; each restore replies as a full evaluation does. The demo is run as a
user runs it, its output read back."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def number(text: str) -> int:
    return int(text.replace(",", ""))


def test_strata_demo_runs_the_episodes_on_llamacpp(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "demo", "--dir", str(tmp_path / "demo")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    assert out.count("same reply as a full evaluation") == 3, out[-4000:]

    edit = re.search(
        r"checkpoints kept \[([\d, ]+)\] tokens before the end \(simulation: \[([\d, ]+)\]\); "
        r"an edit 96 back re-reads ([\d,]+) of ([\d,]+) tokens \(simulation: ([\d,]+); keeping "
        r"the 6 newest: ([\d,]+)\)",
        out,
    )
    assert edit, out[-4000:]
    kept, sim_kept, reread, total, sim_reread, newest = edit.groups()
    assert kept == sim_kept and len(kept.split(",")) == 6
    assert number(reread) == number(sim_reread) < number(newest) < number(total)

    fits = re.search(
        r"A returns to ([\d,]+) tokens restored \(simulation: ([\d,]+)\), to ([\d,]+) without "
        r"park_truncate \(simulation: ([\d,]+)\)",
        out,
    )
    assert fits, out[-4000:]
    restored, sim_restored, without, sim_without = map(number, fits.groups())
    assert restored == sim_restored > 0
    assert without == sim_without == 0

    low = re.search(
        r"(\d+) parks to RAM, (\d+) to disk, (\d+) discarded; ([\d,]+) tokens restored, "
        r"(\d+) lost",
        out,
    )
    assert low, out[-4000:]
    _, to_disk, discarded, back, lost = map(number, low.groups())
    assert to_disk > 0 and discarded == 0 and lost == 0 and back > 0
