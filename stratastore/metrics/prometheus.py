"""A store's counters in the Prometheus text exposition format, derived from the counter table.

Each family of :data:`~stratastore.metrics.counters.FAMILIES`, in that order, is written when
the stats hold at least one of its series: ``# HELP strata_<name> ...``, ``# TYPE ...``
(:func:`~stratastore.metrics.counters.family_type`), then one sample per series. What a row of
:data:`~stratastore.metrics.counters.COUNTERS` feeds is read where its owner keeps it: a
top-level figure from the stats, a level's from each table of ``levels`` (labelled
``level="<name>"``; a RAM level's row from ``levels["ram"]`` only), the remote level's from
``levels["remote"]`` (no label). A figure the stats do not hold is absent, never written as 0:
an absent counter is not a zero. Info rows are the labels of one series of value 1 (the
admission state, the park target and its source), there when the first of them is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from stratastore.metrics.counters import FAMILIES, Counter, Family, Series, family_rows, family_type

__all__ = ["prometheus_text"]

#: the prefix of every family this store exports
PREFIX = "strata_"


def prometheus_text(s: Mapping[str, Any]) -> str:
    """``Store.stats()`` (or the monitor's counters and levels) in the Prometheus text
    exposition format (see the module)."""
    lines: list[str] = []
    for family in FAMILIES:
        samples = _samples(family, s)
        if not samples:
            continue
        name = PREFIX + family.name
        lines.append(f"# HELP {name} {family.help}")
        lines.append(f"# TYPE {name} {family_type(family.name)}")
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)
    return "\n".join(lines) + "\n"


def _samples(family: Family, s: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The family's samples (labels, value) the stats hold, in order. Series with the same
    labels add up; the first of them decides whether the sample is there."""
    rows = family_rows(family.name)
    if rows[0][0].kind == "info":
        return _info(rows, s)
    got: dict[str, Any] = {}
    for labels, value in _values(rows, s):
        if labels not in got:
            got[labels] = value
        elif got[labels] is not None and value is not None:
            got[labels] += value
    return [(k, float(v) if family.floats else v) for k, v in got.items() if v is not None]


def _values(
    rows: tuple[tuple[Counter, Series], ...], s: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Each series' labels and the value the stats hold for it (``None``: not held)."""
    levels: Mapping[str, Mapping[str, Any]] = s.get("levels", {})
    if rows[0][0].owner == "store":
        for row, series in rows:
            label = f'{{{series.label}="{series.value}"}}' if series.label else ""
            yield label, s.get(row.key)
    elif rows[0][0].owner == "remote level":
        for row, _ in rows:
            yield "", levels.get("remote", {}).get(row.key)
    else:  # a level's figure, per level in their order (the RAM level's only from "ram")
        for name, level in levels.items():
            for row, _ in rows:
                if row.owner != "ram level" or name == "ram":
                    yield f'{{level="{name}"}}', level.get(row.key)


def _info(rows: tuple[tuple[Counter, Series], ...], s: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """An info family's one sample: its rows' texts as labels, value 1; absent when the stats
    do not hold the first row."""
    first = s.get(rows[0][0].key)
    if first is None:
        return []
    texts = [first, *(s.get(row.key, "") for row, _ in rows[1:])]
    labels = ",".join(
        f'{series.label}="{_escape(t)}"' for (_, series), t in zip(rows, texts, strict=True)
    )
    return [(f"{{{labels}}}", 1)]


def _escape(v: object) -> str:
    """A label value as the exposition format writes it (backslash, quote, newline escaped)."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
