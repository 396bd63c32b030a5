"""The counter table: every figure ``Store.stats()`` reports, one row each, and what is derived
from it.

A row (:class:`Counter`) names a figure by its stats key and where the stats hold it (its
``owner``: the top level of ``Store.stats()``, every level's table, or the RAM, disk or remote
level's only), says what it is (``kind``: a counter only grows, a gauge is a value now, ``info``
is text that names a state, ``list`` a list of names), in which unit, what it counts, who keeps
it (``kept_by``: the object that starts it at zero and counts) and which Prometheus series it
feeds. :data:`COUNTERS` is in the order ``Store.stats()`` reports the figures, :data:`FAMILIES`
in the order the Prometheus text writes its families. From the two come:

* the counters each keeper starts with (:func:`zero_counts`, :func:`counter_keys`): the flow's,
  the Store's, the spill writer's, the remote level's;
* what ``strata monitor`` shows of a snapshot and the types it checks there
  (:func:`shown_by_monitor`, :mod:`stratastore.metrics.monitor`);
* the Prometheus text (:func:`stratastore.metrics.prometheus.prometheus_text`): each family's
  HELP, its TYPE (``counter`` when its rows are counters, else ``gauge``), its series and labels;
* the counter table of ``docs/operations.md``, which ``tests/unit/test_counter_table.py`` holds
  to this one row for row, beside the keys a store with every level on reports.

The counters of the Redis client (``backend_*``), of the RAM level's cache
(:class:`~stratastore.chain.parking.ConversationCache`) and of a disk level
(:class:`~stratastore.tiers.disk.LevelCounters`) are kept by code that names each of its own
(the levels do not import this surface); their rows here are held to them by the same test.
A new counter is one row here (and, when it is a new Prometheus family, one row in
:data:`FAMILIES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COUNTERS",
    "FAMILIES",
    "Counter",
    "Family",
    "Series",
    "counter_keys",
    "family_rows",
    "family_type",
    "series_text",
    "shown_by_monitor",
    "zero_counts",
]

#: ``counter``: only grows; ``gauge``: a value now; ``info``: text naming a state; ``list``: names
Kind = Literal["counter", "gauge", "info", "list"]
#: where ``Store.stats()`` holds it: its top level (``store``), every table of ``levels``
#: (``level``), or only the RAM level's (``levels["ram"]``), a disk level's, the remote level's
Owner = Literal["store", "level", "ram level", "disk level", "remote level"]
#: who starts it at zero and counts, or reports it (``catalog``: the GC of the catalog, there
#: while a disk level is; ``level``: each level; ``backend``: the remote level's client)
Keeper = Literal[
    "flow",
    "store",
    "spill writer",
    "catalog",
    "level",
    "ram level",
    "disk level",
    "remote level",
    "backend",
]
#: ``always``: in ``Store.stats()`` while its owner is on; ``sometimes``: only in the state its
#: help names; ``monitor``: only in ``strata monitor``'s document (scanned from the level's folder)
Presence = Literal["always", "sometimes", "monitor"]


@dataclass(frozen=True, slots=True)
class Series:
    """A Prometheus series a row feeds: ``strata_<family>`` with one label. A top-level counter
    or gauge carries ``label="value"`` as given; a level's row carries ``level="<its name>"``
    (``label`` and ``value`` empty; the remote level's rows carry no label); an info row is a
    label of its family's one series, its text the label's value (``value`` empty). Rows that
    feed one family with the same labels add up (a disk level's evictions by budget and by age),
    and the first of them decides whether the series is there."""

    family: str
    label: str = ""
    value: str = ""


@dataclass(frozen=True, slots=True)
class Counter:
    """One figure of ``Store.stats()`` (see the module): ``shown`` is its place among what
    ``strata monitor`` takes from a snapshot and checks the type of (a top-level figure: among
    its counters; a level's: among the figures it checks in every level's table), ``None``
    when the monitor does not take it."""

    key: str
    kind: Kind
    unit: str
    help: str
    owner: Owner = "store"
    kept_by: Keeper = "flow"
    series: tuple[Series, ...] = ()
    shown: int | None = None
    present: Presence = "always"


@dataclass(frozen=True, slots=True)
class Family:
    """A Prometheus family (``strata_<name>``): its HELP line, and whether its samples are
    written as floats (the per-level gauges and counters: ``3.0``) or as the stats hold them."""

    name: str
    help: str
    floats: bool = False


def _remote(key: str, unit: str, help_: str) -> Counter:
    """A counter of the remote level as the flow keeps it: ``strata_<key>_total``."""
    return Counter(
        key, "counter", unit, help_, "remote level", "remote level", (Series(f"{key}_total"),)
    )


def _backend(key: str, unit: str, help_: str) -> Counter:
    """A counter the remote level's client keeps (``backend_<name>``), not exported."""
    return Counter(f"backend_{key}", "counter", unit, help_, "remote level", "backend")


def _level(
    key: str,
    kind: Kind,
    unit: str,
    help_: str,
    owner: Owner,
    *families: str,
    shown: int | None = None,
    present: Presence = "always",
) -> Counter:
    """A figure of a level's table, kept by the level, labelled with its name."""
    return Counter(
        key, kind, unit, help_, owner, owner, tuple(map(Series, families)), shown, present
    )


# The tables read as tables (a row a line or two, aligned): the formatter leaves them as written.
# fmt: off
COUNTERS: tuple[Counter, ...] = (
    # -- the top level of Store.stats() ---------------------------------------------------------
    Counter("park_target", "info", "", "where parks go: `ram` or `disk`",
            series=(Series("park_target_info", "target"),), shown=1),
    Counter("park_target_source", "info", "",
            "why parks go there: `configured`, or what `park = auto` saw",
            series=(Series("park_target_info", "source"),), shown=2),
    Counter("parks_ram", "counter", "parks", "parks the RAM level took",
            series=(Series("parks_total", "destination", "ram"),), shown=3),
    Counter("parks_disk", "counter", "parks", "parks written to a disk level instead",
            series=(Series("parks_total", "destination", "disk"),), shown=4),
    Counter("discards", "counter", "captures", "captures neither RAM nor disk could take",
            series=(Series("discards_total"),), shown=5),
    Counter("mirrors", "counter", "parks", "RAM parks also written to disk (`spill_on = park`)"),
    Counter("hits_ram", "counter", "restores", "restores served from the RAM level",
            series=(Series("hits_total", "source", "ram"),), shown=7),
    Counter("hits_pending", "counter", "restores",
            "restores served from a park whose disk write was in flight",
            series=(Series("hits_total", "source", "pending"),), shown=8),
    Counter("hits_disk", "counter", "restores", "restores served from the disk levels",
            series=(Series("hits_total", "source", "disk"),), shown=9),
    Counter("restores_cut_by_gc", "counter", "restores",
            "restores that stopped where GC had removed the next segment meanwhile (a miss "
            "past what was delivered, not damage)", shown=19),
    Counter("disk_hits_refused", "counter", "restores",
            "disk hits refused: neither RAM floor admits the read, or the conversation is gone",
            series=(Series("refusals_total", "kind", "disk_hit"),), shown=17),
    Counter("tokens_restored", "counter", "tokens", "tokens restored instead of re-read",
            series=(Series("tokens_restored_total"),), shown=11),
    Counter("restore_misses", "counter", "lookups",
            "lookups and restores that matched nothing (a point of zero tokens included)",
            shown=13),
    Counter("ladder_restores", "counter", "restores", "restores that stopped below damage",
            series=(Series("ladder_restores_total"),), shown=10),
    Counter("spills_refused", "counter", "writes",
            "disk writes of parks the disk levels refused (each said in a warning)",
            series=(Series("refusals_total", "kind", "spill"),), shown=18),
    Counter("hits_remote", "counter", "restores", "restores served from the remote level",
            series=(Series("hits_total", "source", "remote"),), shown=20),
    Counter("evict_spills", "counter", "conversations", "RAM evictions written to disk",
            kept_by="ram level", shown=6),
    Counter("gc_removed", "counter", "conversations",
            "conversations GC removed whole (while a disk level is on)", kept_by="catalog"),
    Counter("gc_cut", "counter", "conversations",
            "conversations GC cut to their pinned prefix (while a disk level is on)",
            kept_by="catalog"),
    Counter("held_tokens", "gauge", "tokens",
            "tokens a restore could bring back now (each conversation once)",
            series=(Series("held_tokens"),), shown=16),
    Counter("admission", "info", "", "the last admission decision (`where/floor`)",
            series=(Series("admission_info", "state"),), shown=15),
    Counter("damaged_segments", "list", "segments",
            "segments a restore found damaged (for fsck), by key"),
    Counter("unreadable_manifests", "list", "manifests",
            "chain manifests skipped at open (unreadable), by name"),
    Counter("free_ram", "gauge", "bytes",
            "free RAM, as the memory probe says when the stats are taken"),
    Counter("tokens_reread", "counter", "tokens", "tokens the engine had to prefill again",
            kept_by="store", series=(Series("tokens_reread_total"),), shown=12),
    Counter("spill_queue_waits", "counter", "parks",
            "parks that waited for room in the spill writer's queue", kept_by="spill writer"),
    Counter("spill_errors", "counter", "writes",
            "acknowledged parks whose disk write failed (each raised once by "
            "`flush()`/`close()`)", kept_by="spill writer", shown=14),
    Counter("monitor_errors", "counter", "writes",
            "failed writes of the monitor snapshot (never raised)", kept_by="store"),
    Counter("spill_queue", "gauge", "parks", "parks waiting for the spill writer now",
            kept_by="spill writer"),
    # -- every level's table: levels[name] ------------------------------------------------------
    _level("entries", "gauge", "entries", "entries the level holds", "level",
           "level_entries", shown=1),
    _level("bytes", "gauge", "bytes", "bytes the level holds", "level", "level_bytes", shown=2),
    _level("budget", "gauge", "bytes", "the level's byte budget", "level", "level_budget",
           shown=3),
    # -- the RAM level: levels["ram"] -----------------------------------------------------------
    _level("parks", "counter", "parks", "the RAM level's own parks", "ram level"),
    _level("truncated_parks", "counter", "parks", "parks of a truncated prefix", "ram level"),
    _level("discards", "counter", "parks", "parks the RAM level could not take", "ram level"),
    _level("evictions", "counter", "entries", "entries evicted to make room", "ram level",
           "evictions_total", shown=8),
    _level("truncations", "counter", "entries", "entries shrunk to make room for another",
           "ram level"),
    # -- a disk level: levels[name] -------------------------------------------------------------
    _level("dir", "info", "", "the level's directory", "disk level"),
    _level("oldest_age_s", "gauge", "seconds",
           "age of the oldest entry (in the monitor's document only: scanned from the folder)",
           "disk level", "level_oldest_age_s", present="monitor"),
    _level("disk_evictions", "counter", "conversations",
           "conversations the last level shortened to keep within its budget (whole chains)",
           "disk level", "level_disk_evictions", "evictions_total", shown=6),
    _level("age_evictions", "counter", "conversations",
           "conversations the last level shortened by age (whole chains)", "disk level",
           "level_age_evictions", "evictions_total", shown=7),
    _level("degradations", "counter", "entries", "entries handed to the next level",
           "disk level", "level_degradations", shown=5),
    _level("adopted", "counter", "entries", "entries taken from the level above", "disk level"),
    _level("refusals", "counter", "entries", "entries the next level refused (they stayed)",
           "disk level"),
    _level("discards", "counter", "segments", "unreadable images deleted on the way",
           "disk level"),
    _level("raced", "counter", "entries", "entries another process moved or deleted first",
           "disk level"),
    _level("hits", "counter", "restores", "restores served from this level", "disk level",
           shown=4),
    # -- the remote level: levels["remote"] -----------------------------------------------------
    _level("dir", "info", "", "the server, without credentials", "remote level"),
    _level("namespace", "info", "", "the prefix of every key this store writes there",
           "remote level"),
    _level("eviction", "info", "", "who evicts: `store` (within `remote_mib`) or `redis`",
           "remote level"),
    _backend("errors", "calls", "Redis calls that failed"),
    _backend("timeouts", "calls", "Redis calls that timed out"),
    _backend("missing_parts", "parts", "parts of a segment missing when read"),
    _backend("raced_puts", "segments", "puts another node made first"),
    _backend("stale_index", "entries", "index entries naming a segment that is gone"),
    _level("problem", "info", "",
           "damage found in the namespace (only then; `strata fsck --remote` says what)",
           "remote level", present="sometimes"),
    _remote("remote_hits", "lookups", "lookups that found a prefix there"),
    _remote("remote_misses", "lookups", "lookups that found nothing there (damage read as a miss)"),
    _remote("remote_puts", "segments", "segments stored there"),
    _remote("remote_put_errors", "pushes", "pushes that failed (the park stands locally)"),
    _remote("remote_errors", "calls", "calls that failed (each opens the breaker)"),
    _remote("remote_skipped", "calls", "calls skipped while the breaker was open"),
    _remote("remote_ladder_stops", "restores", "restores from it that stopped short or fell short"),
    _remote("remote_kept_local", "restores", "restores from it kept on the local levels"),
    _remote("remote_kept_local_errors", "restores", "restores from it not kept locally"),
    _remote("remote_evictions", "segments", "segments deleted to keep it within `remote_mib`"),
    _remote("remote_damaged", "segments", "damaged segments found and removed"),
)

FAMILIES: tuple[Family, ...] = (
    Family("parks_total", "Parks by destination."),
    Family("discards_total", "Captures neither RAM nor disk could take."),
    Family("hits_total", "Restores by source."),
    Family("refusals_total", "Admissions refused, by what asked."),
    Family("evictions_total", "Entries evicted (RAM) or deleted (the last disk level, by budget "
                              "and by age), per level."),
    Family("ladder_restores_total", "Restores that stopped below damage."),
    Family("tokens_restored_total", "Tokens restored instead of re-read."),
    Family("tokens_reread_total", "Tokens the engine had to prefill again."),
    Family("held_tokens", "Tokens a restore could bring back now (each conversation once)."),
    Family("admission_info", "The last admission decision (where/floor)."),
    Family("park_target_info", "Where parks go, and why (configured or auto)."),
    Family("level_entries", "Entries per level.", floats=True),
    Family("level_bytes", "Bytes held per level.", floats=True),
    Family("level_budget", "Byte budget per level.", floats=True),
    Family("level_oldest_age_s", "Age of the oldest entry per disk level, in seconds.",
           floats=True),
    Family("level_disk_evictions", "Deleted by budget (last level only).", floats=True),
    Family("level_age_evictions", "Deleted by age (last level only).", floats=True),
    Family("level_degradations", "Handed to the next level.", floats=True),
    *(Family(s.family, f"The remote level: {c.key.removeprefix('remote_')}.")
      for c in COUNTERS if c.owner == "remote level" for s in c.series),
)
# fmt: on


def counter_keys(kept_by: Keeper) -> tuple[str, ...]:
    """The keys of the counters ``kept_by`` keeps, in the table's order (the order
    ``Store.stats()`` reports them in)."""
    return tuple(c.key for c in COUNTERS if c.kept_by == kept_by and c.kind == "counter")


def zero_counts(kept_by: Keeper) -> dict[str, int]:
    """The counters ``kept_by`` keeps, each at zero (what it starts with)."""
    return dict.fromkeys(counter_keys(kept_by), 0)


def shown_by_monitor(*, levels: bool) -> tuple[Counter, ...]:
    """What ``strata monitor`` takes from a snapshot, in its order: the top-level figures (its
    counters), or (``levels``) the figures it checks in every level's table."""
    rows = [c for c in COUNTERS if c.shown is not None and (c.owner != "store") == levels]
    return tuple(sorted(rows, key=lambda c: c.shown or 0))


def family_rows(name: str) -> tuple[tuple[Counter, Series], ...]:
    """The rows that feed family ``name``, each with its series, in the table's order."""
    return tuple((c, s) for c in COUNTERS for s in c.series if s.family == name)


def family_type(name: str) -> Literal["counter", "gauge"]:
    """A family's Prometheus TYPE: ``counter`` when its rows are counters, else ``gauge`` (a
    gauge, or an info row's series of value 1)."""
    return "counter" if family_rows(name)[0][0].kind == "counter" else "gauge"


def series_text(row: Counter, series: Series) -> str:
    """A series as the docs write it: ``strata_parks_total{destination="ram"}``,
    ``strata_level_entries{level=...}``, ``strata_admission_info{state=...}``."""
    if series.value:
        label = f'{series.label}="{series.value}"'
    elif series.label:
        label = f"{series.label}=..."
    elif row.owner == "ram level":
        label = 'level="ram"'
    elif row.owner in ("level", "disk level"):
        label = "level=..."
    else:
        label = ""
    return f"strata_{series.family}" + (f"{{{label}}}" if label else "")
