"""The admission Prometheus series from outside the process: ``strata monitor DIR --prometheus``
(what a scraper reads; the Store publishes its stats to monitor.json) must carry the series
``Store.prometheus()`` has: the admission state and the park target (text counters, info-style
series), and the pending hits and refusals. The CLI keeps only the integer counters of
``_COUNTERS``, so the admission state, the park target, ``hits{source="pending"}`` and the refusals
never reach it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.cli import main
from tests.conftest import tiny_fp

FP = tiny_fp()


def test_monitor_prometheus_has_the_series_the_store_publishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cold = tmp_path / "cold"
    cfg = {
        "ram_mib": 4,
        "cold_dir": str(cold),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    conv = Conversation("m", as_tokens(np.arange(40)), [Checkpoint(40)])
    kv = np.random.default_rng(3).integers(0, 256, 40 * FP.token_bytes, dtype=np.uint8)
    with Store.open(FP, cfg) as store:
        store.park(conv, kv)
        store.flush()
        in_process = store.prometheus()
    assert 'strata_admission_info{state="ram/parking"} 1' in in_process
    assert main(["monitor", str(cold), "--prometheus"]) == 0
    out = capsys.readouterr().out
    missing = [
        s
        for s in (
            'strata_admission_info{state="ram/parking"} 1',
            'strata_park_target_info{target="ram",source="configured"} 1',
            'strata_hits_total{source="pending"} 0',
            'strata_refusals_total{kind="spill"} 0',
        )
        if s not in out
    ]
    assert not missing, f"strata monitor --prometheus lacks {missing}:\n{out}"
