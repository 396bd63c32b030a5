"""A process parking to disk (the spill writer) crashes at every I/O step: after reopening, an
acknowledged park restores whole and validated, and an interrupted one is whole or invisible
(its manifest is the commit record, spec F-CHAIN-3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from stratastore import Store
from stratastore.io.faults import CRASH_ENV, CRASH_EXIT
from tests.unit.facade.test_store_facade import FP, conversation

ROOT = Path(__file__).resolve().parents[2]

_WRITER = """
import sys
from stratastore import Store
from tests.unit.facade.test_store_facade import FP, conversation
cfg = {"ram_mib": 1, "park": "disk", "cold_dir": sys.argv[1], "cold_mib": 64, "min_free_mib": 1}
with Store.open(FP, cfg) as store:
    for i in range(2):
        conv, kv = conversation(f"k{i}", 40, 1000 * (i + 1))
        store.park(conv, kv)
        store.flush()
        print(f"ACK {i}", flush=True)
"""


def test_crash_at_every_io_step_of_a_spill(tmp_path: Path) -> None:
    k, done, states = 0, False, 0
    while not done:
        k += 1
        cold = tmp_path / f"k{k}"
        env = {**os.environ, CRASH_ENV: str(k), "PYTHONPATH": str(ROOT)}
        r = subprocess.run(
            [sys.executable, "-c", _WRITER, str(cold)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        done = r.returncode == 0
        assert done or r.returncode == CRASH_EXIT, r.stderr
        acked = {int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("ACK")}
        if not cold.exists():
            continue
        with Store.open(FP, {"ram_mib": 1, "cold_dir": str(cold), "cold_mib": 64}) as store:
            for i in range(2):
                conv, kv = conversation(f"k{i}", 40, 1000 * (i + 1))
                out = np.zeros_like(kv)
                got = store.restore(conv.tokens, out).tokens
                if i in acked:
                    assert got == 40, f"crash at op {k}: acknowledged park {i} lost"
                assert got in (0, 40), f"crash at op {k}: park {i} half visible ({got})"
                assert np.array_equal(out[: got * FP.token_bytes], kv[: got * FP.token_bytes])
        states += 1
        assert k < 400
    assert states >= 20
