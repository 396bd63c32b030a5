"""``tools/chunk_store_rates.py`` (the chunk store's rates against plain system calls, quoted in
docs/performance.md) runs end to end on a small store and reports every rate it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_tool_reports_every_rate(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "chunk_store_rates.py"), "--dir", str(tmp_path),
         "--chunks", "8", "--chunk-mib", "1", "--threads", "2", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=True,
    )  # fmt: skip
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("round 1:")]
    for name in ("plain store, fsynced", "plain store, no fsync", "put_many", "load cold, raw",
                 "load cold, chunk store", "load hot, chunk store",
                 "load hot beside a spinning thread, chunk store"):  # fmt: skip
        assert f"{name} " in row, (name, row)
    assert not list(tmp_path.iterdir()), "the scratch rounds are removed"
