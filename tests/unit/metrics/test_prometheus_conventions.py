"""Metrics an operator can route: the Prometheus text of ``Store.prometheus()`` and of ``strata
monitor --prometheus`` reads with ``prometheus_client``'s own parser; counters end in ``_total``
and print as integers, units are in the names, every family has real HELP text, and park,
restore and flush have latency histograms over fixed buckets from 1 ms to 60 s."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from stratastore import Store
from stratastore.cli import main
from stratastore.metrics.histogram import BUCKETS
from tests.conftest import conversation_kv, tiny_fp

parser = pytest.importorskip("prometheus_client.parser")

FP = tiny_fp()


def _store_text(tmp_path: Path) -> str:
    cfg = {
        "ram_mib": 4,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    with Store.open(FP, cfg) as store:
        for i in range(3):
            conv, kv = conversation_kv(f"c{i}", 48, 100 * i)
            store.park(conv, kv)
        store.flush()
        conv, kv = conversation_kv("c1", 48, 100)
        store.restore(conv.tokens, np.zeros_like(kv))
        store.restore_many([(conv.tokens, np.zeros_like(kv))])
        return store.prometheus()


def _check(text: str, *, flush_calls: int) -> None:
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    for f in families.values():
        assert f.documentation and f.documentation != f.name, f"{f.name} has no real HELP"
        assert f.name.startswith("strata_"), f.name
        if f.type == "counter":
            for s in f.samples:
                assert s.name.endswith(("_total", "_created")), s.name
                assert float(s.value).is_integer(), s
    # the parser names a counter family without its _total; the text must carry it
    counters = [ln.split()[2] for ln in text.splitlines() if ln.endswith(" counter")]
    assert counters and all(n.endswith("_total") for n in counters), counters
    for ln in text.splitlines():
        name = ln.split("{")[0].split(" ")[0]
        if not ln.startswith("#") and name in counters:
            assert "." not in ln.rsplit(" ", 1)[1], f"a counter not written as an integer: {ln}"
    for name in ("strata_level_bytes", "strata_level_budget_bytes"):
        assert families[name].type == "gauge", name
    assert families["strata_level_oldest_age_seconds"].samples[0].labels == {"level": "cold"}
    for old in ("strata_level_budget ", "strata_level_oldest_age_s{", "_evictions{", "ations{"):
        assert old not in text, f"the old series {old!r} is still written"
    bounds = [*map(float, BUCKETS), math.inf]
    assert bounds[0] == 0.001 and bounds[-2] == 60.0
    calls = {"park": 3, "restore": 2, "flush": flush_calls}
    for call, n in calls.items():
        h = families[f"strata_{call}_seconds"]
        assert h.type == "histogram", h
        buckets = [s for s in h.samples if s.name.endswith("_bucket")]
        assert [float(s.labels["le"]) for s in buckets] == bounds
        count = next(s.value for s in h.samples if s.name.endswith("_count"))
        assert count == n == buckets[-1].value, (call, h.samples)
        assert next(s.value for s in h.samples if s.name.endswith("_sum")) >= 0


def test_the_stores_prometheus_text_reads_with_the_prometheus_parser(tmp_path: Path) -> None:
    _check(_store_text(tmp_path), flush_calls=1)


def test_the_monitors_prometheus_text_reads_with_the_prometheus_parser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_text(tmp_path)  # published on close, after the last call
    assert main(["monitor", str(tmp_path / "cold"), "--prometheus"]) == 0
    _check(capsys.readouterr().out, flush_calls=1)
