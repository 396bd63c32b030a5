"""The low-RAM episode through the Store: the admission log lines, the Prometheus series (admission
state, park target, held tokens, evictions, refusals; an absent counter absent, not 0) and a
held-tokens figure that counts each conversation once. Each test failed before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stratastore import Conversation, Store
from stratastore.metrics.prometheus import prometheus_text
from tests.conftest import conversation_kv, tiny_fp, writer_held

FP = tiny_fp()
MIB = 1 << 20


def conversation(cid: str, n: int, base: int) -> tuple[Conversation, np.ndarray]:
    return conversation_kv(cid, n, base, step=0)


def test_a_refused_park_says_skip_parking_with_the_figures() -> None:
    lines: list[str] = []
    cfg = {"ram_mib": 4, "min_free_mib": 2560, "park_min_free_mib": 512}
    with Store.open(FP, cfg, probe=lambda: 100 * MIB, warn=lines.append) as store:
        c, kv = conversation("c1", 100, 0)
        assert store.park(c, kv).where == "discard"
    line = next(x for x in lines if "c1" in x)
    assert line.startswith("skip parking (physical RAM admission: need 6.2 KiB plus 2560 MiB")
    assert "100 MiB free" in line and "discarded" in line
    assert "need 0 MiB" not in line and "a floor" not in line


def test_disk_hits_under_the_transient_floor_and_skipped(tmp_path: Path) -> None:
    lines: list[str] = []
    free = [1 << 40]
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 2560,
        "park_min_free_mib": 512,
    }
    with Store.open(FP, cfg, probe=lambda: free[0], warn=lines.append) as store:
        c, kv = conversation("c1", 100, 0)
        store.park(c, kv)
        store.flush()
        out = np.zeros(kv.size, np.uint8)
        free[0] = 1000 * MIB  # above the transient floor only
        assert store.restore(c.tokens, out).tokens == 100
        hit = [x for x in lines if x.startswith("disk hit under the transient RAM floor")]
        assert hit and "(need 6.2 KiB plus 512 MiB, not 2560 MiB)" in hit[0], lines
        free[0] = 100 * MIB  # below both: the disk copy is not read
        assert store.restore(c.tokens, out).tokens == 0
        assert any(x.startswith("disk hit skipped (physical RAM admission") for x in lines), lines
        # a park to disk under the transient floor says so too
        free[0] = 1000 * MIB
        d, kvd = conversation("d1", 100, 500)
        assert store.park(d, kvd).where == "disk"
        assert any(
            x.startswith("park to disk under the transient RAM floor") and "d1" in x for x in lines
        ), lines


def test_prometheus_has_the_admission_series_and_no_invented_zeros(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 4,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    with Store.open(FP, cfg) as store:
        c, kv = conversation("c1", 100, 0)
        store.park(c, kv)
        store.flush()
        prom = store.prometheus()
    assert 'strata_admission_info{state="ram/parking"} 1' in prom
    assert 'strata_park_target_info{target="ram",source="configured"} 1' in prom
    assert "strata_held_tokens 100" in prom
    assert 'strata_evictions_total{level="ram"} 0' in prom
    assert 'strata_evictions_total{level="cold"} 0' in prom
    assert 'strata_refusals_total{kind="disk_hit"} 0' in prom
    # what the stats do not hold is not reported (another version's monitor file, say)
    bare = prometheus_text({"parks_disk": 3, "levels": {}})
    assert 'strata_parks_total{destination="disk"} 3' in bare
    for absent in (
        'destination="ram"',
        "strata_discards_total",
        "strata_hits_total",
        "strata_held_tokens",
        "strata_admission_info",
    ):
        assert absent not in bare, absent


def test_held_tokens_counts_a_mirrored_conversation_once(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 4,
        "spill_on": "park",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    with Store.open(FP, cfg) as store:
        for i in range(10):
            c, kv = conversation(f"c{i}", 100, 1000 * i)
            assert store.park(c, kv).where == "ram"  # and mirrored to disk
        store.flush()
        assert store.stats()["held_tokens"] == 1000


def test_the_info_line_names_held_tokens_hits_by_source_and_the_levels_folders(
    tmp_path: Path,
) -> None:
    cfg = {
        "ram_mib": 4,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    with Store.open(FP, cfg) as store:
        c, kv = conversation("c1", 100, 0)
        store.park(c, kv)
        store.flush()
        line = store.info_line()
        cold_dir = store.stats()["levels"]["cold"]["dir"]
    assert "held_tokens=100" in line and "discards=0" in line
    assert "hits ram=0 pending=0 disk=0" in line
    assert cold_dir.endswith("/c") and f"/16MiB@{cold_dir} " in line
    assert "admission=ram/parking" in line and "park=ram(configured)" in line


def test_held_tokens_counts_a_park_whose_write_is_in_flight(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "c"), "cold_mib": 16}
    with Store.open(FP, cfg) as store:
        with writer_held(store) as entered:
            c, kv = conversation("c1", 100, 0)
            store.park(c, kv)
            assert entered.wait(30)
            assert store.stats()["held_tokens"] == 100  # restorable now, from the capture
        assert store.stats()["held_tokens"] == 100
