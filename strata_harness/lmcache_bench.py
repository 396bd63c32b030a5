"""``strata bench --lmcache``: LMCache 0.5.6 with its own local disk backend
beside LMCache with the stratastore plugin (:mod:`stratastore.adapters.lmcache`), in one run, on
the same bytes, by the protocol of ``strata bench --peers`` (:mod:`strata_harness.peers`).

- **The same K/V**: ``mib`` MiB (1 GiB by default: 8,192 tokens) of the Llama-3.1-8B geometry
  (32 layers x 8 kv heads x 128 x fp16, 128 KiB a token), deterministic random bytes, stored
  and retrieved through LMCache's public engine on the CPU
  (:mod:`stratastore.adapters.lmcache.cpu`) in chunks of 256 tokens (halved until the 50%
  prefix is whole chunks), ``local_cpu`` off for both (nothing is served from RAM).
- **Durable store**: ``engine.store`` until the bytes are durable. The disk backend: its
  asynchronous file writes waited for, then every file and the directory fsynced (LMCache
  itself never fsyncs). The plugin: its ``flush()`` (every put committed by the store's own
  protocol: data fsynced, renamed in, directory fsynced, sidecar written durably, indexed).
- **Retrieve** into a fresh ``torch.empty`` in the engine layout, compared bit for bit outside
  the clock: the whole K/V and its first half (the 50% prefix), **hot** (after a read of the
  backend's files) and **cold** (after fsync + ``POSIX_FADV_DONTNEED`` of every file in the
  backend's directory, checked with ``mincore``). The plugin BLAKE3-validates every page it
  delivers; the disk backend checks nothing.
- **One process per backend and round** (LMCache's disk backend keeps its index in the process
  that stored), spawned; medians of ``rounds`` after one warmup round; the order alternates.

Targets: the plugin's durable store and cold retrieve at least the disk backend's
(1.0x), its hot retrieve at least 0.8x.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from typing import Any

from strata_harness.peer_protocol import GEOMETRY, TOKEN_BYTES, PeersBenchError
from strata_harness.peer_report import op_stats, table_row
from strata_harness.peers import Run, lmcache_engine, write_source

__all__ = ["TARGETS", "render_lmcache", "run_lmcache"]

DISK, PLUGIN = "LMCache disk (+ fsync)", "LMCache + stratastore plugin"
#: (name, figure, target): the plugin's figure over the disk backend's, at least ``target``
TARGETS = [
    ("durable store", "durable_write", 1.0),
    ("retrieve cold", "read_cold", 1.0),
    ("retrieve hot", "read_hot", 0.8),
]
_COLUMNS = [
    ("durable store", "durable_write"),
    ("hot", "read_hot"),
    ("cold", "read_cold"),
    ("50% prefix hot", "prefix_hot"),
    ("50% prefix cold", "prefix_cold"),
]


def run_lmcache(
    work_dir: str | None = None,
    *,
    mib: int = 1024,
    rounds: int = 3,
    cold: bool = True,
    warmup: bool = True,
) -> dict[str, Any]:
    """Run the protocol of the module docstring in a new directory under ``work_dir`` (default:
    the system's temporary directory), removed afterwards; the result document.
    :class:`~strata_harness.peer_protocol.PeersBenchError` when LMCache is not installed or a
    backend fails (a result that differs from the source included)."""
    if mib < 1 or rounds < 1:
        raise PeersBenchError(f"--mib ({mib}) and --rounds ({rounds}) must be at least 1")
    if importlib.util.find_spec("lmcache") is None or importlib.util.find_spec("torch") is None:
        raise PeersBenchError(
            "lmcache (with torch) is not installed: pip install 'stratastore[lmcache]'"
        )
    tokens = max(32, mib * 2**20 // TOKEN_BYTES // 32 * 32)
    base = work_dir or tempfile.gettempdir()
    if not os.path.isdir(base):
        raise PeersBenchError(f"--dir {base} is not a directory; create it or name another")
    if shutil.disk_usage(base).free < 4 * tokens * TOKEN_BYTES:
        raise PeersBenchError(
            f"{base} has too little room for {4 * tokens * TOKEN_BYTES:,} "
            "bytes: name a --dir with room, or a smaller --mib"
        )
    version = importlib.metadata.version("lmcache")
    backends = [
        ("lmcache-disk", lmcache_engine("disk", DISK)),
        ("lmcache-strata", lmcache_engine("strata", PLUGIN)),
    ]
    load_start = os.getloadavg()[0]
    root = tempfile.mkdtemp(prefix="strata-lmcache-", dir=base)
    run = Run(root, tokens, cold)
    try:
        write_source(run, packed=False)
        for rnd in range(0 if warmup else 1, rounds + 1):  # round 0 warms up and is dropped
            run.measuring = rnd > 0
            for _, go in backends if rnd % 2 else backends[::-1]:
                go(run)
                if run.skipped:
                    raise PeersBenchError("; ".join(run.skipped.values()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    engines: dict[str, dict[str, Any]] = {}
    for (row, op), recs in run.samples.items():
        engines.setdefault(row, {})[op] = op_stats(recs)
    rows = {n: table_row(n, engines[n]) for n in (DISK, PLUGIN)}
    ratios = []
    for name, key, target in TARGETS:
        mine, theirs = rows[PLUGIN][key], rows[DISK][key]
        if mine and theirs:
            ratios.append(
                {
                    "name": name,
                    "value": mine / theirs,
                    "target": target,
                    "met": mine / theirs >= target,
                }
            )
    return {
        "lmcache": version,
        "bytes": tokens * TOKEN_BYTES,
        "tokens": tokens,
        "prefix_tokens": run.half,
        "geometry": GEOMETRY,
        "rounds": rounds,
        "warmup_rounds": int(warmup),
        "cold": cold,
        "engines": engines,
        "rows": rows,
        "ratios": ratios,
        "load_1m": {"start": load_start, "end": os.getloadavg()[0]},
        "page_cache": {
            "method": "fsync + posix_fadvise(DONTNEED), checked with mincore",
            "max_resident_after_eviction": max(run.cold_resident.values(), default=0.0),
            "min_resident_before_hot": min(run.hot_resident, default=1.0),
        },
        "bit_for_bit": {
            "results_compared": run.compared[0],
            "bytes_compared": run.compared[1],
            "all_equal": True,
        },
    }


def render_lmcache(doc: dict[str, Any]) -> str:
    """The result as a table (GB/s, GB = 1e9 B), the ratios and the checks."""
    head = ["", *(c for c, _ in _COLUMNS), "peak RSS GiB"]
    rows = []
    for name, r in doc["rows"].items():
        cells = [f"{r[k]:.2f}" if r.get(k) else "-" for _, k in _COLUMNS]
        rss = max((v for v in (r["rss_write"], r["rss_read"]) if v), default=None)
        rows.append([name, *cells, f"{rss:.2f}" if rss else "-"])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [
        f"strata bench --lmcache: LMCache {doc['lmcache']}, {doc['bytes'] / 2**30:.2f} GiB "
        f"({doc['tokens']:,} tokens of 128 KiB), medians of {doc['rounds']} rounds, GB/s"
    ]
    for row in [head, *rows]:
        lines.append("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
    for r in doc["ratios"]:
        lines.append(
            f"  plugin / disk, {r['name']}: {r['value']:.2f}x (target >= "
            f"{r['target']:.1f}x: {'met' if r['met'] else 'missed'})"
        )
    pc, bb = doc["page_cache"], doc["bit_for_bit"]
    lines.append(
        f"  cold: {pc['method']}, at most {pc['max_resident_after_eviction']:.1%} left "
        f"resident; hot: at least {pc['min_resident_before_hot']:.0%} resident"
    )
    lines.append(
        f"  bit for bit: {bb['results_compared']} results, {bb['bytes_compared']:,} "
        f"bytes, all equal; 1-minute load {doc['load_1m']['start']:.2f} -> "
        f"{doc['load_1m']['end']:.2f}"
    )
    return "\n".join(lines)
