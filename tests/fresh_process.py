"""One step of a test in a process of its own: ``python -m MODULE ARGS_JSON`` from the
repository root, whose last line of output is the step's result as JSON (a restart between two
steps is two calls)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_step(module: str, args: dict[str, Any], *, timeout: float = 300) -> dict[str, Any]:
    """Run ``module`` with ``args`` (paths given as strings) in a fresh interpreter and return
    the JSON object on its last line of output; the step failing is a test failure showing the
    end of its standard error."""
    args = {k: str(v) if isinstance(v, Path) else v for k, v in args.items()}
    done = subprocess.run(
        [sys.executable, "-m", module, json.dumps(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
