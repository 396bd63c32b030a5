"""The result of ``strata bench --peers``: medians, the table, the limits and the peer
targets as ratios (:func:`summarise`), and its text (:func:`render`)."""

from __future__ import annotations

import statistics
from typing import Any

from strata_harness.peer_protocol import Record

__all__ = ["POOL_TARGETS", "TARGETS", "op_stats", "render", "summarise", "table_row"]

LAYER, FLAT = "stratastore (LayerKV)", "stratastore (flat page layout)"
PAGED = "stratastore (PagedKV, validated)"  #: the engine-pool protocol's row
LIMITS = {  # label: (raw op)
    "raw write+fsync": "write+fsync",
    "raw read into a fresh buffer, hot": "read fresh hot",
    "raw read into a fresh buffer, cold": "read fresh cold",
    "raw read into a touched buffer, hot": "read touched hot",
    "raw read into a touched buffer, cold": "read touched cold",
    "memcpy into a touched buffer (numpy)": "memcpy touched",
    "BLAKE3 on every CPU (a page a call)": "blake3 both",
    "read + BLAKE3 on every CPU, hot": "read blake3 both hot",
}
#: (name, stratastore's figure, the peer's row or a limit or "best peer", the peer's figure,
#: target, higher is better); figures are keys of a row
TARGETS: list[tuple[str, str, str, str, float, bool]] = [
    ("durable park / raw write+fsync", "durable_write", "raw write+fsync", "", 1.0, True),
    ("durable park / numpy", "durable_write", "numpy", "durable_write", 1.0, True),
    ("durable park / LMCache disk", "durable_write", "LMCache disk", "durable_write", 1.0, True),
    ("hot restore / np.load", "read_hot", "numpy", "read_hot", 1.0, True),
    ("hot restore / LMCache RAM", "read_hot", "LMCache RAM", "read_hot", 1.0, True),
    ("hot restore / LMCache disk", "read_hot", "LMCache disk", "read_hot", 2.0, True),
    (
        "cold restore / raw cold read (fresh buffer)",
        "read_cold",
        "raw read into a fresh buffer, cold",
        "",
        0.9,
        True,
    ),
    ("cold restore / LMCache disk", "read_cold", "LMCache disk", "read_cold", 1.5, True),
    ("50% prefix hot / best peer", "prefix_hot", "best peer", "prefix_hot", 1.0, True),
    ("50% prefix cold / best peer", "prefix_cold", "best peer", "prefix_cold", 1.0, True),
    ("peak RSS of a restore / numpy's load", "rss_read", "numpy", "rss_read", 1.1, False),
]
#: the engine-pool protocol's targets (:mod:`strata_harness.peer_pool`), as :data:`TARGETS`;
#: "best peer" is the best read + copy into the pool, and the RSS target is in MiB, absolute
POOL_TARGETS: list[tuple[str, str, str, str, float, bool]] = [
    ("hot restore / best peer", "read_hot", "best peer", "read_hot", 1.0, True),
    (
        "hot restore / raw read into a touched buffer",
        "read_hot",
        "raw read into a touched buffer, hot",
        "",
        0.6,
        True,
    ),
    (
        "hot restore / BLAKE3 on every CPU",
        "read_hot",
        "BLAKE3 on every CPU (a page a call)",
        "",
        0.8,
        True,
    ),
    (
        "hot restore / read + BLAKE3 on every CPU",
        "read_hot",
        "read + BLAKE3 on every CPU, hot",
        "",
        0.8,
        True,
    ),
    ("cold restore / best peer", "read_cold", "best peer", "read_cold", 1.0, True),
    (
        "cold restore / raw cold read into a touched buffer",
        "read_cold",
        "raw read into a touched buffer, cold",
        "",
        0.8,
        True,
    ),
    ("50% prefix hot / best peer", "prefix_hot", "best peer", "prefix_hot", 1.0, True),
    ("50% prefix cold / best peer", "prefix_cold", "best peer", "prefix_cold", 1.0, True),
    ("durable park / raw write+fsync", "durable_write", "raw write+fsync", "", 0.8, True),
    ("durable park / numpy", "durable_write", "numpy", "durable_write", 1.0, True),
    ("durable park / LMCache disk", "durable_write", "LMCache disk", "durable_write", 1.0, True),
    ("RSS a restore adds to the pool, MiB", "rss_growth_read", "MiB", "", 64.0, False),
]


def op_stats(recs: list[Record]) -> dict[str, Any]:
    secs = statistics.median(r["seconds"] for r in recs)
    out = {
        "seconds": secs,
        "gb_per_s": recs[0]["bytes"] / secs / 1e9,
        "samples_s": [r["seconds"] for r in recs],
        "peak_rss_gib": max(r["maxrss"] for r in recs) / 2**30,
    }
    if "rss_growth" in recs[0]:
        out["rss_growth_mib"] = max(r["rss_growth"] for r in recs) / 2**20
    if "pack_seconds" in recs[0]:
        rest = statistics.median(r["seconds"] - r["pack_seconds"] for r in recs)
        out["gb_per_s_without_pack_pages"] = recs[0]["bytes"] / rest / 1e9
    return out


def table_row(name: str, ops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def gbps(op: str) -> float | None:
        return ops[op]["gb_per_s"] if op in ops else None

    writes = [v["peak_rss_gib"] for k, v in ops.items() if not k.startswith(("read", "prefix"))]
    reads = [v["peak_rss_gib"] for k, v in ops.items() if k.startswith(("read", "prefix"))]
    dw = ops.get("durable write", {})
    growth = [v["rss_growth_mib"] for k, v in ops.items() if "rss_growth_mib" in v]
    return {
        "engine": name,
        "durable_write": gbps("durable write"),
        "durable_write_without_pack_pages": dw.get("gb_per_s_without_pack_pages"),
        "read_hot": gbps("read hot"),
        "read_cold": gbps("read cold"),
        "prefix_hot": gbps("prefix hot"),
        "prefix_cold": gbps("prefix cold"),
        "rss_write": max(writes, default=None),
        "rss_read": max(reads, default=None),
        "rss_growth_read": max(growth, default=None),
    }


def _short(name: str) -> str:
    """A row's name in a ratio: numpy, LMCache disk, LMCache RAM, safetensors, torch."""
    if name.startswith("LMCache"):
        return "LMCache disk" if "disk" in name else "LMCache RAM"
    return name.split()[0]


def _ratios(
    rows: dict[str, dict[str, Any]],
    limits: dict[str, float],
    notes: list[str],
    targets: list[tuple[str, str, str, str, float, bool]] = TARGETS,
    mine_row: str = LAYER,
    protocol: str = "fresh result",
) -> list[dict[str, Any]]:
    ours = rows.get(mine_row, {})
    peers = {_short(n): r for n, r in rows.items() if not n.startswith("stratastore")}
    out = []
    for name, mine, other, key, target, higher in targets:
        against = other
        if other == "MiB":  # an absolute bound
            theirs = 1.0 if ours.get(mine) is not None else None
        elif other == "best peer":
            have = {n: r[key] for n, r in peers.items() if r.get(key)}
            best = max(have, key=lambda n: have[n], default=None)
            theirs, against = (have[best], best) if best else (None, other)
        elif other in limits or other.startswith("raw"):
            theirs = limits.get(other)
        else:
            theirs = peers.get(other, {}).get(key)
        if ours.get(mine) is None or not theirs:
            notes.append(f"target {name!r} ({protocol}) not measured in this run")
            continue
        value = ours[mine] / theirs
        met = value >= target if higher else value <= target
        missed = (1 - value / target if higher else value / target - 1) * 100
        out.append(
            {
                "name": name,
                "against": against,
                "value": value,
                "target": target,
                "better": "higher" if higher else "lower",
                "met": met,
                "missed_by_pct": 0.0 if met else missed,
            }
        )
    return out


def _engines(samples: dict[tuple[str, str], list[Record]]) -> dict[str, dict[str, Any]]:
    engines: dict[str, dict[str, Any]] = {}
    for (row, op), recs in samples.items():
        engines.setdefault(row, {})[op] = op_stats(recs)
    return engines


def summarise(
    samples: dict[tuple[str, str], list[Record]],
    pool_samples: dict[tuple[str, str], list[Record]],
    doc: dict[str, Any],
) -> dict[str, Any]:
    """``doc`` with ``engines`` (each operation's median seconds, GB/s, the samples and the
    peak RSS), ``rows`` (the table), ``limits`` and ``ratios`` (the targets), and the same for
    the engine-pool protocol under ``pool`` (``engines``, ``rows``, ``ratios``)."""
    engines = _engines(samples)
    raw = engines.pop("raw", {})
    limits = {k: raw[op]["gb_per_s"] for k, op in LIMITS.items() if op in raw}
    order = [
        LAYER,
        FLAT,
        *sorted(n for n in engines if n.startswith("LMCache")),
        *(n for n in engines if not n.startswith(("LMCache", "stratastore"))),
    ]
    rows = {n: table_row(n, engines[n]) for n in order if n in engines}
    if FLAT in rows and LAYER in rows:  # one park serves both
        rows[FLAT]["rss_write"] = rows[LAYER]["rss_write"]
    notes = doc["notes"]
    ratios = _ratios(rows, limits, notes)
    pool = _engines(pool_samples)
    pool_order = [PAGED, *sorted(n for n in pool if n.startswith("LMCache")), *sorted(pool)]
    pool_rows = {n: table_row(n, pool[n]) for n in dict.fromkeys(pool_order) if n in pool}
    return {
        **doc,
        "engines": {**engines, "raw": raw},
        "rows": list(rows.values()),
        "limits": limits,
        "ratios": ratios,
        "pool": {
            "engines": pool,
            "rows": list(pool_rows.values()),
            "ratios": _ratios(pool_rows, limits, notes, POOL_TARGETS, PAGED, "engine pool"),
        },
        "notes": notes,
    }


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(rows: list[dict[str, Any]], *, pool: bool = False) -> list[str]:
    rss = "peak RSS GiB (write) / a read adds, MiB" if pool else "peak RSS GiB (write / read)"
    head = ["engine", "durable write GB/s", "read hot", "read cold", "50% prefix hot / cold", rss]
    body = []
    for r in rows:
        dw = _f(r["durable_write"])
        if r["engine"] == FLAT:
            dw = "same"
        elif r["durable_write"] is None and r["engine"].startswith("LMCache"):
            dw = "RAM only"
        elif r["durable_write_without_pack_pages"]:
            dw += f" ({r['durable_write_without_pack_pages']:.2f} without pack_pages)"
        memory = (
            f"{_f(r['rss_write'])} / {_f(r['rss_growth_read'], 0)}"
            if pool
            else f"{_f(r['rss_write'])} / {_f(r['rss_read'])}"
        )
        body.append(
            [
                r["engine"],
                dw,
                _f(r["read_hot"]),
                _f(r["read_cold"]),
                f"{_f(r['prefix_hot'])} / {_f(r['prefix_cold'])}",
                memory,
            ]
        )
    width = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, width, strict=True)) + " |"

    return [line(head), "|" + "|".join("-" * (w + 2) for w in width) + "|", *map(line, body)]


def _targets(ratios: list[dict[str, Any]], title: str) -> list[str]:
    out = ["", title]
    names = [r["name"] + (f" ({r['against']})" if "best" in r["name"] else "") for r in ratios]
    width = max(map(len, names), default=0)
    for name, r in zip(names, ratios, strict=True):
        sign = ">=" if r["better"] == "higher" else "<="
        verdict = "met" if r["met"] else f"missed by {r['missed_by_pct']:.0f}%"
        if r["against"] == "MiB":
            figure = f"{r['value']:5.0f}   (target {sign} {r['target']:.0f} MiB)"
        else:
            figure = f"{r['value']:5.2f}x  (target {sign} {r['target']:.1f}x)"
        out.append(f"  {name:<{width}}  {figure}  {verdict}")
    return out


def render(doc: dict[str, Any]) -> str:
    """The engine-pool table and its targets, the fresh-tensor table and its targets, the
    limits line, the notes."""
    pc, bit, lim = doc["page_cache"], doc["bit_for_bit"], doc["limits"]
    out = [
        f"strata bench --peers: {doc['bytes'] / 2**30:.2f} GiB of K/V ({doc['tokens']:,} tokens "
        "of 128 KiB: 32 layers x 8 kv heads x 128 x fp16)",
        (f"medians of {doc['rounds']} rounds" if doc["rounds"] > 1 else "one round")
        + " after a warmup round, engine order alternating; "
        f"1-minute load {doc['load_1m']['start']:.2f} at the start, "
        f"{doc['load_1m']['end']:.2f} at the end",
        f"stratastore: {doc['stratastore']}",
        f"bit for bit: {bit['results_compared']} results compared "
        f"({bit['bytes_compared'] / 2**30:.2f} GiB), all equal",
    ]
    if doc["cold"]:
        out.append(
            f"cold: {pc['method']}; after {pc['evictions']} evictions at most "
            f"{pc['max_resident_after_eviction']:.2%} of the data files' pages stayed "
            f"resident; hot: at least {pc['min_resident_before_hot']:.1%}"
        )

    def reads(buffer: str) -> str:
        hot, cold = (lim.get(f"raw read into {buffer} buffer, {h}") for h in ("hot", "cold"))
        return f"{_f(hot)} hot, {_f(cold)} cold"

    out += [
        "",
        "The engine's pool: per layer [2, blocks, 16, heads, head_dim] allocated and touched "
        "once, a shuffled block table; stratastore restores into it (PagedKV, every page "
        "validated) and parks from it; each peer reads with its best API and copies into it",
        "",
        *_table(doc["pool"]["rows"], pool=True),
        *_targets(doc["pool"]["ratios"], f"Targets ({PAGED}, ratios of GB/s):"),
        "",
        "A fresh result: each engine returns a new [layers, 2, tokens, heads, head_dim] array",
        "",
        *_table(doc["rows"]),
        *_targets(doc["ratios"], f"Targets ({LAYER}, ratios of GB/s; of GiB for RSS):"),
        "",
        f"Limits: raw write+fsync {_f(lim.get('raw write+fsync'))} GB/s; raw read into a "
        f"fresh buffer {reads('a fresh')}; into a touched buffer {reads('a touched')}; "
        f"memcpy into a touched buffer {_f(lim.get('memcpy into a touched buffer (numpy)'))}"
        f" (numpy); BLAKE3 on every CPU {_f(lim.get('BLAKE3 on every CPU (a page a call)'))}, "
        f"a read + BLAKE3 on every CPU {_f(lim.get('read + BLAKE3 on every CPU, hot'))} hot",
    ]
    out += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(out)
