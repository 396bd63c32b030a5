"""A store's counters in the Prometheus text exposition format, derived from the counter table.

Each family of :data:`~stratastore.metrics.counters.FAMILIES`, in that order, is written when
the stats hold at least one of its series: ``# HELP strata_<name> ...``, ``# TYPE ...``
(:func:`~stratastore.metrics.counters.family_type`), then its samples. What a row of
:data:`~stratastore.metrics.counters.COUNTERS` feeds is read where the stats hold it: a
top-level figure from the stats, a level's from each table of ``levels`` (labelled
``level="<name>"``; each table gives the rows of every level and those of its own kind: the
RAM level's, the system-prompt cache's, a disk level's), the remote level's from
``levels["remote"]`` (no label). A figure the stats do not hold is absent, never written as 0:
a store reports only the rows of what it has configured
(:func:`~stratastore.metrics.counters.reported`), so the text of ``Store.prometheus()`` and of
``strata monitor --prometheus`` (the same stats, as the Store published them) write the same
series. Info rows are the labels of one series of value 1 (the admission state, the park
target and its source), there when the first of them is. A histogram
(:mod:`stratastore.metrics.histogram`) writes its cumulative ``_bucket{le=...}``, ``_sum`` and
``_count``. Counts are written as integers, durations and ages as decimals.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from stratastore.metrics.counters import FAMILIES, Counter, Family, Series, family_rows, family_type

__all__ = ["prometheus_text"]

#: the prefix of every family this store exports
PREFIX = "strata_"
#: the owner of a level's own rows, by the level's name (every other level is a disk level)
_KIND = {"ram": "ram level", "prompt_cache": "prompt cache", "remote": "remote level"}


def prometheus_text(s: Mapping[str, Any]) -> str:
    """``Store.stats()`` (or the snapshot a Store published for the monitor) in the
    Prometheus text exposition format (see the module)."""
    lines: list[str] = []
    for family in FAMILIES:
        name = PREFIX + family.name
        samples = [(k, v) for k, v in _samples(family, name, s) if _is_number(v)]
        if not samples:
            continue
        lines.append(f"# HELP {name} {family.help}")
        lines.append(f"# TYPE {name} {family_type(family.name)}")
        lines.extend(f"{series} {_number(value)}" for series, value in samples)
    return "\n".join(lines) + "\n"


def _samples(family: Family, name: str, s: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The family's samples (series name with labels, value) the stats hold, in order. Series
    with the same labels add up; the first of them decides whether the sample is there."""
    rows = family_rows(family.name)
    kind = rows[0][0].kind
    if kind == "info":
        return [(name + labels, v) for labels, v in _info(rows, s)]
    if kind == "histogram":
        return _histogram(name, s.get(rows[0][0].key))
    got: dict[str, Any] = {}
    for labels, value in _values(rows, s):
        if labels not in got:
            got[labels] = value
        elif got[labels] is not None and value is not None:
            got[labels] += value
    return [(name + k, v) for k, v in got.items() if v is not None]


def _values(
    rows: tuple[tuple[Counter, Series], ...], s: Mapping[str, Any]
) -> Iterator[tuple[str, Any]]:
    """Each series' labels and the value the stats hold for it (``None``: not held)."""
    levels: Mapping[str, Mapping[str, Any]] = s.get("levels", {})
    first = rows[0][0]
    if first.place == "top":
        for row, series in rows:
            label = f'{{{series.label}="{series.value}"}}' if series.label else ""
            yield label, s.get(row.key)
    elif first.owner == "remote level":
        for row, _ in rows:
            yield "", levels.get("remote", {}).get(row.key)
    else:  # a level's figure, per level in their order, from the rows of its kind alone
        for level_name, level in levels.items():
            kind = _KIND.get(level_name, "disk level")
            for row, _ in rows:
                if row.owner in ("level", kind):
                    yield f'{{level="{level_name}"}}', level.get(row.key)


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


def _histogram(name: str, h: object) -> list[tuple[str, Any]]:
    """A histogram's samples from its stats table (``buckets``, ``sum``, ``count``); none
    when the stats do not hold it."""
    if not isinstance(h, Mapping) or not isinstance(h.get("buckets"), Mapping):
        return []  # not held (or not a histogram: a snapshot's wrongly typed field)
    out: list[tuple[str, Any]] = [
        (f'{name}_bucket{{le="{le}"}}', n) for le, n in h["buckets"].items()
    ]
    return [*out, (f"{name}_sum", h.get("sum")), (f"{name}_count", h.get("count"))]


def _is_number(v: object) -> bool:
    """Whether a value is a sample's (a snapshot's wrongly typed field is left out)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v: float) -> str:
    """A sample's value: a count as an integer, a duration or an age as a decimal."""
    return str(v) if isinstance(v, int) else repr(float(v))


def _escape(v: object) -> str:
    """A label value as the exposition format writes it (backslash, quote, newline escaped)."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
