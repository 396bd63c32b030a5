"""An absent counter is absent, not 0: a store reports the counters of what it has configured
and no others, in ``Store.stats()``, ``Store.info_line()``, ``Store.prometheus()`` and
``strata monitor --prometheus`` alike, and the monitor writes the very series the Store does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Store
from stratastore.cli import main
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
FLOORS = {"min_free_mib": 0, "park_min_free_mib": 0}


def _park_and_restore(store: Store) -> None:
    conv, kv = conversation_kv("a", 48, 0)
    store.park(conv, kv)
    store.flush()
    store.restore(conv.tokens, np.zeros_like(kv))


def test_a_ram_only_store_reports_no_disk_pending_or_remote_counter() -> None:
    with Store.open(FP, {"ram_mib": 4, **FLOORS}) as store:
        _park_and_restore(store)
        stats, line, prom = store.stats(), store.info_line(), store.prometheus()
    for key in ("hits_disk", "hits_pending", "hits_remote", "parks_disk", "spill_errors"):
        assert key not in stats, f"a RAM-only store reports {key}={stats[key]}"
    assert stats["hits_ram"] == 1 and stats["parks_ram"] == 1
    assert " parks ram=1 discards=0 hits ram=1 restored=48 " in line, line
    assert "pending=" not in line and "disk=" not in line, line
    assert 'strata_hits_total{source="ram"} 1' in prom
    for absent in ('source="disk"', 'source="pending"', 'source="remote"', 'destination="disk"'):
        assert absent not in prom, f"{absent} in a RAM-only store's Prometheus text:\n{prom}"


def _series(text: str) -> set[str]:
    """The series a Prometheus text writes (name and labels, not values)."""
    return {ln.rsplit(" ", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


def test_the_monitor_writes_the_series_the_store_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {"ram_mib": 4, "cold_dir": str(tmp_path / "cold"), "cold_mib": 16, **FLOORS}
    with Store.open(FP, cfg) as store:
        _park_and_restore(store)
        stats, line, in_process = store.stats(), store.info_line(), store.prometheus()
    assert "hits_remote" not in stats and "remote=" not in line
    assert 'source="remote"' not in in_process
    assert 'strata_hits_total{source="pending"}' in in_process  # a disk level: parks in flight
    assert "hits ram=1 pending=0 disk=0" in line
    assert main(["monitor", str(tmp_path / "cold"), "--prometheus"]) == 0
    from_monitor = capsys.readouterr().out
    assert _series(from_monitor) == _series(in_process), (
        f"only in the monitor: {sorted(_series(from_monitor) - _series(in_process))}; "
        f"only in the Store: {sorted(_series(in_process) - _series(from_monitor))}"
    )
