"""The counter table (:mod:`stratastore.metrics.counters`) is the one place a counter is declared:
the docs' table says what it says row for row, a store reports exactly the rows of what it has
configured (every row with every level on), and the Prometheus text writes only its families,
with their HELP and TYPE."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from stratastore.cli import main
from stratastore.metrics.counters import (
    CHUNKS,
    COUNTERS,
    FAMILIES,
    Counter,
    counter_keys,
    family_rows,
    family_type,
    owners_on,
    series_text,
    shown_by_monitor,
)
from stratastore.metrics.prometheus import prometheus_text
from tests.conftest import conversation_kv, tiny_fp
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip, redis_binaries_or_skip

FP = tiny_fp()
DOCS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
HEADER = "| name | there with | kind | unit | what it counts | Prometheus series |"
#: the docs' words for an owner: what must be configured for a store to report the row
THERE_WITH = {
    "store": "any store",
    "level": "each level",
    "ram level": "the RAM level",
    "disk level": "a disk level",
    "remote level": "the remote level",
    "prompt cache": "the system-prompt cache",
    "chunk store": "a chunk store",
}


def _name(c: Counter) -> str:
    """Where ``Store.stats()`` holds the row, as the docs write it."""
    where = {
        "level": "levels[name]",
        "ram level": 'levels["ram"]',
        "disk level": "levels[disk]",
        "remote level": 'levels["remote"]',
        "prompt cache": 'levels["prompt_cache"]',
    }
    return f"`{c.key}`" if c.place == "top" else f'`{where[c.owner]}["{c.key}"]`'


def docs_rows() -> list[list[str]]:
    """The docs' counter table as the code's table writes it, one row per counter."""
    return [
        [
            _name(c),
            THERE_WITH[c.owner],
            c.kind,
            c.unit or "-",
            c.help,
            ", ".join(f"`{series_text(c, s)}`" for s in c.series) or "-",
        ]
        for c in COUNTERS
    ]


def _markdown() -> str:
    rows = ["| " + " | ".join(r) + " |" for r in docs_rows()]
    return "\n".join([HEADER, "|---|---|---|---|---|---|", *rows])


def test_the_docs_table_is_the_code_table_row_for_row() -> None:
    lines = DOCS.read_text().splitlines()
    assert HEADER in lines, f"{DOCS} has no counter table headed {HEADER}"
    start = lines.index(HEADER) + 2
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    assert table == docs_rows(), f"{DOCS}'s counter table must read:\n{_markdown()}"


def test_the_table_holds_together() -> None:
    places = [(c.owner, c.key) for c in COUNTERS]
    assert len(places) == len(set(places)), "a figure is declared twice"
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names))
    for c in COUNTERS:
        for s in c.series:
            assert s.family in names, f"{c.key} feeds {s.family}, which FAMILIES lacks"
            if c.kind == "info" or c.place == "levels":
                assert not s.value, f"{c.key}: the label's value is the text or the level"
    for f in names:
        rows = family_rows(f)
        assert rows, f"family {f} is fed by no row"
        assert len({c.place for c, _ in rows}) == 1, f"{f} mixes the top level and levels"
        assert len({family_type(f) == "counter" for _ in rows}) == 1
        assert {c.kind == "counter" for c, _ in rows} == {family_type(f) == "counter"}
        labels = [(s.label, s.value) for _, s in rows]
        if rows[0][0].place == "top" and rows[0][0].kind != "info":
            assert len(labels) == len(set(labels)), f"{f}: two rows write one series"
    for levels in (False, True):
        shown = [c.shown for c in shown_by_monitor(levels=levels)]
        assert shown == list(range(1, len(shown) + 1)), "the monitor's places run 1, 2, ..."


def _owners(level: str) -> tuple[str, ...]:
    """The owners whose rows a level's table of ``Store.stats()`` holds."""
    if level == "ram":
        return ("level", "ram level")
    if level == "prompt_cache":
        return ("level", "prompt cache")
    return ("level", "remote level") if level == "remote" else ("level", "disk level")


def _check_stats(
    stats: dict[str, Any], *, disk: bool, remote: bool = False, prompt_cache: bool = False
) -> None:
    """Every key of ``stats`` is a row of its owner, of the kind the row says; every row of a
    level or feature that is on is there, and no row of one that is off (an absent counter
    is absent, not 0)."""
    on = owners_on(disk=disk, remote=remote, prompt_cache=prompt_cache)
    top = [c for c in COUNTERS if c.place == "top"]
    unknown = set(stats) - {c.key for c in top} - {"levels"}
    assert not unknown, f"Store.stats() reports {sorted(unknown)}, which the table lacks"
    missing = [c.key for c in top if c.owner in on and c.key not in stats]
    assert not missing, f"Store.stats() lacks {missing}"
    off = [c.key for c in top if c.owner not in on and c.key in stats]
    assert not off, f"Store.stats() reports {off}, of what is not configured"
    # the top-level figures come in the table's order
    assert [k for k in stats if k != "levels"] == [c.key for c in top if c.key in stats]
    for c in top:
        _check_kind(c, stats.get(c.key))
    for name, level in stats["levels"].items():
        rows = [c for c in COUNTERS if c.place == "levels" and c.owner in _owners(name)]
        unknown = set(level) - {c.key for c in rows}
        assert not unknown, f"levels[{name}] reports {sorted(unknown)}, which the table lacks"
        missing = [c.key for c in rows if c.present == "always" and c.key not in level]
        assert not missing, f"levels[{name}] lacks {missing}"
        for c in rows:
            _check_kind(c, level.get(c.key))


def _check_kind(c: Counter, v: object) -> None:
    want: type | tuple[type, ...] = {
        "counter": int,
        "gauge": float if c.unit == "seconds" else int,
        "histogram": dict,
        "info": str,
        "list": list,
        "table": dict,
    }[c.kind]
    assert v is None or isinstance(v, want), f"{c.key} is {v!r}, not {want}"


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    import_or_skip("redis")
    with RedisServer(tmp_path / "redis", binaries=redis_binaries_or_skip()) as server:
        yield server.url


def _use(store: Store) -> None:
    """Parks (some written down to the disk levels), a restore and a miss."""
    for i in range(6):
        store.park(*conversation_kv(f"c{i}", 48, 100 * i))
    store.flush()
    conv, kv = conversation_kv("c5", 48, 500)
    store.restore(conv.tokens, np.zeros_like(kv))
    store.restore(conversation_kv("none", 48, 9000)[0].tokens, np.zeros_like(kv))


def test_a_store_with_every_level_reports_the_tables_rows(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = {
        "ram_mib": 1,
        "warm_dir": str(tmp_path / "warm"),
        "warm_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
        "remote_url": redis_url,
        "remote_mib": 64,
        "prompt_cache_dir": str(tmp_path / "system-prompts"),
        "prompt_cache_mib": 4,
    }
    with Store.open(FP, cfg) as store:
        _use(store)
        stats = store.stats()
        assert list(stats["levels"]) == ["ram", "warm", "cold", "remote", "prompt_cache"]
        _check_stats(stats, disk=True, remote=True, prompt_cache=True)
        assert tuple(store.describe().counters) == counter_keys("flow")
        in_process = store.prometheus()
    assert main(["monitor", str(tmp_path), "--prometheus"]) == 0
    from_monitor = capsys.readouterr().out
    stores = {f.name for f in FAMILIES if family_rows(f.name)[0][0].owner != CHUNKS}
    assert _families(in_process) == stores, "every family of a Store is written"
    assert _families(from_monitor) == _families(in_process), "the monitor writes the same"


def test_a_ram_only_store_reports_the_rows_of_what_is_on() -> None:
    cfg = {"ram_mib": 4, "min_free_mib": 0, "park_min_free_mib": 0}
    with Store.open(FP, cfg) as store:
        _use(store)
        stats = store.stats()
        assert list(stats["levels"]) == ["ram"]
        _check_stats(stats, disk=False)
        _families(store.prometheus())


def _families(text: str) -> set[str]:
    """The families a Prometheus text writes, each checked against the table: its HELP and
    TYPE as the table says, and no sample outside a family of the table."""
    known = {f"strata_{f.name}": f for f in FAMILIES}
    seen: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            assert name in known, f"{name} is not a family of the counter table"
            assert help_ == known[name].help
            seen.add(name)
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind == family_type(known[name].name), line
        elif line:
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            histogram = family in seen and family_type(known[family].name) == "histogram"
            assert name in seen or histogram, f"{line!r}: a sample outside the table's families"
    return {n.removeprefix("strata_") for n in seen}


def test_a_chunk_store_reports_its_rows_in_stats_the_info_line_and_prometheus(
    tmp_path: Path,
) -> None:
    from dataclasses import fields

    from stratastore.chunks import ChunkCounters, ChunkLevel, ChunkStore

    rows = [c for c in COUNTERS if c.owner == CHUNKS]
    assert tuple(f.name for f in fields(ChunkCounters)) == counter_keys(CHUNKS)
    levels = [ChunkLevel(str(tmp_path / "a"), 1 << 20), ChunkLevel(str(tmp_path / "b"), 1 << 20)]
    with ChunkStore.open(levels, FP) as store:
        store.put(b"k" * 32, b"a page")
        assert store.get(b"k" * 32) == b"a page" and store.get(b"x" * 32) is None
        stats = store.stats()
        line = store.info_line()
        text = store.prometheus()
    assert list(stats) == [c.key for c in rows], "the chunk store reports its rows, in order"
    for c in rows:
        _check_kind(c, stats[c.key])
        assert f" {c.key}={stats[c.key]}" in line
    assert stats["puts"] == stats["hits"] == stats["misses"] == 1
    assert _families(text) == {s.family for c in rows for s in c.series}
    assert "strata_chunk_hits_total 1\n" in text


def test_prometheus_writes_only_what_the_stats_hold() -> None:
    assert prometheus_text({"levels": {}}) == "\n"
    bare = prometheus_text({"hits_disk": 2, "levels": {"cold": {"disk_evictions": 1}}})
    assert _families(bare) == {"hits_total", "evictions_total", "level_disk_evictions_total"}
    assert 'strata_hits_total{source="disk"} 2' in bare
    assert 'strata_evictions_total{level="cold"} 1' in bare  # age_evictions absent: adds 0
    assert 'strata_level_disk_evictions_total{level="cold"} 1\n' in bare  # a count: an integer
