"""The connector's figures in vLLM's metrics classes (needs vLLM, not a vLLM process): what each
side counted since the last step adds up across workers and steps, reduces to vLLM's log line,
and feeds Prometheus series under vLLM's labels, parsed back with ``prometheus_client``'s parser:
every series there from the start, at zero."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stratastore.adapters.vllm.tally import Tally

# vLLM (and its prometheus_client) is imported in the tests: where it is not installed, the
# conftest skips them (or, under STRATA_REQUIRE_VLLM=1, fails them) before they run


def _bound(registry: Any) -> dict[type, Any]:
    """vLLM's metric types, registered in a registry of the test's own."""
    from prometheus_client import Counter, Gauge, Histogram

    return {
        kind: (lambda kind=kind, **kw: kind(registry=registry, **kw))
        for kind in (Counter, Gauge, Histogram)
    }


def test_stats_add_up_across_workers_and_steps() -> None:
    from stratastore.adapters.vllm.connector import StrataConnector
    from stratastore.adapters.vllm.metrics import StrataStats

    worker, scheduler = Tally(), Tally()
    worker.add(loads=2, tokens_loaded=300, bytes_load=3000)
    worker.time("load_seconds", 0.25)
    worker.drop("write_failed")
    scheduler.add(lookups=5, lookup_hits=2)
    a = StrataConnector.build_kv_connector_stats(worker.take())
    b = StrataConnector.build_kv_connector_stats(scheduler.take())
    assert worker.take() is None  # taken once
    got = a.aggregate(b)
    assert got.data["loads"] == 2 and got.data["lookups"] == 5
    assert got.data["dropped"] == {"write_failed": 1}
    reduced = got.reduce()
    assert reduced["tokens_loaded"] == 300 and reduced["parks_dropped"] == 1
    assert reduced["load_seconds_avg_ms"] == 250.0
    assert StrataStats().is_empty() and not got.is_empty()


def test_the_series_in_prometheus_text() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stratastore.adapters.vllm.connector import StrataConnector

    registry = CollectorRegistry()
    vllm_config = SimpleNamespace(kv_transfer_config=None)  # all the base class reads
    labels = {0: ["/models/m", "0"]}
    prom = StrataConnector.build_prom_metrics(
        vllm_config, _bound(registry), ["model_name", "engine"], labels
    )
    text = generate_latest(registry).decode()
    families = {f.name for f in text_string_to_metric_families(text)}
    for name in ("loads", "tokens_loaded", "parks", "parks_dropped", "bytes", "park_seconds"):
        assert f"vllm:strata_{name}" in families, families
    tally = Tally()
    tally.add(loads=1, tokens_loaded=128, parks=3, tokens_parked=640, bytes_park=6400)
    tally.time("park_seconds", 0.03)
    tally.drop("refused")
    prom.observe(tally.take(), 0)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    on = (("engine", "0"), ("model_name", "/models/m"))
    assert samples[("vllm:strata_loads_total", on)] == 1
    assert samples[("vllm:strata_tokens_parked_total", on)] == 640
    assert (
        samples[("vllm:strata_parks_dropped_total", (*on[:1], on[1], ("reason", "refused")))] == 1
    )
    assert samples[("vllm:strata_bytes_total", (("direction", "park"), *on))] == 6400
    assert samples[("vllm:strata_park_seconds_count", on)] == 1
