"""``strata fsck --deep`` of a store an engine's tests left (vLLM, llama.cpp), as an operator runs
it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def fsck_deep(store: Path) -> subprocess.CompletedProcess[str]:
    """Run ``strata fsck --deep STORE`` (this checkout's stratastore); its output is printed
    (``-s`` shows it)."""
    got = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "fsck", "--deep", str(store)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    print(f"fsck --deep {store.name}: exit {got.returncode}\n{got.stdout}{got.stderr}")
    return got
