"""The connector's figures in vLLM's own metrics: ``/metrics`` of vLLM's OpenAI server and vLLM's
periodic ``KV Transfer metrics`` log line.

vLLM asks each side of the connector for what it did since the last step
(``get_kv_connector_stats``: the worker's loads and parks, the scheduler's lookups), carries
the :class:`StrataStats` to its logger process, adds them up (:meth:`StrataStats.aggregate`)
and hands them to :class:`StrataPromMetrics`, which feeds these series (one child per engine,
vLLM's ``engine`` and ``model_name`` labels first):

================================  =========  ==============================================
series                            kind       what
================================  =========  ==============================================
``vllm:strata_lookups``           counter    prompts looked up in the store
``vllm:strata_lookup_hits``       counter    lookups that promised tokens past vLLM's cache
``vllm:strata_loads``             counter    restores into vLLM's blocks
``vllm:strata_tokens_loaded``     counter    tokens restored (validated) into vLLM's blocks
``vllm:strata_load_shortfalls``   counter    restores that stopped short (a page that failed
                                             validation, a segment gone: the ladder)
``vllm:strata_blocks_recomputed`` counter    blocks reported to vLLM to recompute
``vllm:strata_parks``             counter    parks durable on disk (or kept by a RAM level)
``vllm:strata_tokens_parked``     counter    tokens of those parks
``vllm:strata_parks_dropped``     counter    parks not kept, by ``reason``: ``refused`` (no
                                             level could take it), ``write_failed`` (its
                                             disk write did not land), ``error``
``vllm:strata_bytes``             counter    K/V bytes, by ``direction``: ``load``, ``park``
``vllm:strata_load_seconds``      histogram  one restore, in the forward's step
``vllm:strata_park_seconds``      histogram  one park, from its hand-over to durable
================================  =========  ==============================================

Counters gain ``_total`` in the exposition (Prometheus's convention, as vLLM's own)."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

from stratastore.adapters.vllm.tally import COUNTS, DROP_REASONS, TIMINGS

__all__ = ["StrataPromMetrics", "StrataStats"]

_HELP = {
    "lookups": "Prompts the StrataConnector looked up in the store.",
    "lookup_hits": "Lookups that promised tokens past vLLM's own prefix cache.",
    "loads": "Restores into vLLM's blocks.",
    "tokens_loaded": "Tokens restored, validated, into vLLM's blocks.",
    "load_shortfalls": "Restores that stopped short (a page failed validation, a segment gone).",
    "blocks_recomputed": "Blocks the connector reported to vLLM to recompute.",
    "parks": "Parks durable in the store.",
    "tokens_parked": "Tokens of the parks durable in the store.",
}
#: latency buckets (seconds): a small page in a millisecond up to a long conversation's park
_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


class StrataStats(KVConnectorStats):  # type: ignore[misc]
    """What the connector did in an interval, as a plain dict (vLLM sends it between
    processes): each name of :data:`.tally.COUNTS` an integer, ``dropped`` the parks not kept
    by reason, ``bytes_load``/``bytes_park``, and the seconds of each load and park
    (:data:`.tally.TIMINGS`) as lists. Missing keys count as zero."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def is_empty(self) -> bool:
        return not any(self.data.values())

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        mine, theirs = self.data, other.data
        for key, value in theirs.items():
            if isinstance(value, list):
                mine[key] = [*mine.get(key, []), *value]
            elif isinstance(value, dict):
                into = dict(mine.get(key, {}))
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
                mine[key] = into
            else:
                mine[key] = mine.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: int(self.data.get(k, 0)) for k in COUNTS}
        out["parks_dropped"] = sum(self.data.get("dropped", {}).values())
        for name in TIMINGS:
            seconds = self.data.get(name, [])
            out[f"{name}_avg_ms"] = round(1e3 * sum(seconds) / len(seconds), 3) if seconds else 0
        return out


class StrataPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """The series of the module's table, made once per vLLM logger process."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counts = {
            k: self._counter_cls(
                name=f"vllm:strata_{k}", documentation=_HELP[k], labelnames=labelnames
            )
            for k in COUNTS
        }
        self._dropped = self._counter_cls(
            name="vllm:strata_parks_dropped",
            documentation=f"Parks the store did not keep, by reason ({', '.join(DROP_REASONS)}).",
            labelnames=[*labelnames, "reason"],
        )
        self._bytes = self._counter_cls(
            name="vllm:strata_bytes",
            documentation="K/V bytes the StrataConnector moved, by direction (load, park).",
            labelnames=[*labelnames, "direction"],
        )
        self._seconds = {
            name: self._histogram_cls(
                name=f"vllm:strata_{name}",
                documentation=doc,
                buckets=_BUCKETS,
                labelnames=labelnames,
            )
            for name, doc in TIMINGS.items()
        }
        # every series shows from the start, at zero (a dashboard sees the connector at once)
        for values in per_engine_labelvalues.values():
            for c in self._counts.values():
                c.labels(*values)
            for reason in DROP_REASONS:
                self._dropped.labels(*values, reason)
            for direction in ("load", "park"):
                self._bytes.labels(*values, direction)
            for h in self._seconds.values():
                h.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        values = self.per_engine_labelvalues[engine_idx]
        data = transfer_stats_data or {}
        for key, counter in self._counts.items():
            if n := data.get(key, 0):
                counter.labels(*values).inc(n)
        for reason, n in data.get("dropped", {}).items():
            self._dropped.labels(*values, reason).inc(n)
        for direction in ("load", "park"):
            if n := data.get(f"bytes_{direction}", 0):
                self._bytes.labels(*values, direction).inc(n)
        for name, histogram in self._seconds.items():
            child = histogram.labels(*values)
            for seconds in data.get(name, []):
                child.observe(seconds)
