"""The counter table: every figure ``Store.stats()`` reports, one row each, and what is derived
from it.

A row (:class:`Counter`) names a figure by its stats key, where the stats hold it (``place``:
their top level, or a level's table), what it belongs to (its ``owner``: the store itself,
every level, or the RAM, disk or remote level alone), what it is (``kind``: a counter only
grows, a gauge is a value now, a histogram counts durations into fixed buckets, ``info`` is
text that names a state, ``list`` a list of names), in which unit, what it counts, who keeps it
(``kept_by``: the object that starts it at zero and counts) and which Prometheus series it
feeds. :data:`COUNTERS` is in the order ``Store.stats()`` reports the figures, :data:`FAMILIES`
in the order the Prometheus text writes its families. From the two come:

* what a store reports (:func:`owners_on`, :func:`reported`): the rows of what it has
  configured, and no other. An absent counter is absent, not 0: a RAM-only store reports no
  disk hit, no park in flight to disk (the spill writer's outbox exists for a disk level
  only) and no remote hit, in ``Store.stats()``, ``Store.info_line()``, ``Store.prometheus()``
  and ``strata monitor`` alike;
* the counters each keeper starts with (:func:`counter_keys`, and each owner's
  :class:`~stratastore.metrics.counts.Counts` made from them): the flow's,
  the Store's, the spill writer's, the remote level's;
* what ``strata monitor`` shows of a snapshot and the types it checks there
  (:func:`shown_by_monitor`, :mod:`stratastore.metrics.monitor`);
* the Prometheus text (:func:`stratastore.metrics.prometheus.prometheus_text`): each family's
  HELP, its TYPE (:func:`family_type`), its series and labels, named by Prometheus's
  conventions (a counter ends in ``_total``, a unit is in the name: ``_bytes``, ``_seconds``);
* the counter table of ``docs/operations.md``, which
  ``tests/unit/metrics/test_counter_table.py`` holds to this one row for row, beside the keys
  a store with every level on reports.

The counters of the Redis client (``backend_*``), of the RAM level's cache
(:class:`~stratastore.chain.parking.ConversationCache`) and of a disk level
(:class:`~stratastore.levels.cascade.LevelCounters`) are kept by code that names each of its own
(the levels do not import this surface); their rows here are held to them by the same test.
A new counter is one row here (and, when it is a new Prometheus family, one row in
:data:`FAMILIES`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "COUNTERS",
    "FAMILIES",
    "Counter",
    "CHUNKS",
    "Family",
    "Series",
    "counter_keys",
    "family_rows",
    "family_type",
    "owners_on",
    "reported",
    "series_text",
    "shown_by_monitor",
]

#: ``counter``: only grows; ``gauge``: a value now; ``histogram``: durations counted into the
#: fixed buckets of :mod:`stratastore.metrics.histogram`; ``info``: text naming a state;
#: ``list``: names; ``table``: figures nested by name (the per-slot speeds)
Kind = Literal["counter", "gauge", "histogram", "info", "list", "table"]
#: what a figure belongs to, and so whether a store reports it: the store itself (always),
#: every level (in each level's table), the RAM level, a disk level (any: the catalog, the
#: spill writer, the parks in flight and the monitor's snapshot come with it), the remote
#: level or the system-prompt cache, each only while it is configured
Owner = Literal[
    "store", "level", "ram level", "disk level", "remote level", "prompt cache", "chunk store"
]
#: where ``Store.stats()`` holds it: its top level, or the owner's table(s) of ``levels``
Place = Literal["top", "levels"]
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
    "prompt cache",
    "backend",
    "chunk store",
]
#: ``always``: in ``Store.stats()`` while its owner is configured; ``sometimes``: only in the
#: state its help names
Presence = Literal["always", "sometimes"]

#: the owner of the rows a disk level brings (the table reads shorter with a name)
DISK: Owner = "disk level"
#: the owner (and keeper) of the system-prompt cache's rows
CACHE: Owner = "prompt cache"
#: the owner (and keeper) of a chunk store's rows (:meth:`~stratastore.chunks.ChunkStore.stats`)
CHUNKS: Owner = "chunk store"


@dataclass(frozen=True, slots=True)
class Series:
    """A Prometheus series a row feeds: ``strata_<family>`` with one label. A top-level counter
    or gauge carries ``label="value"`` as given; a level's row carries ``level="<its name>"``
    (``label`` and ``value`` empty; the remote level's rows carry no label); an info row is a
    label of its family's one series, its text the label's value (``value`` empty); a histogram
    writes its ``_bucket{le=...}``, ``_sum`` and ``_count``. Rows that feed one family with the
    same labels add up (a disk level's evictions by budget and by age), and the first of them
    decides whether the series is there."""

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
    place: Place = "top"


@dataclass(frozen=True, slots=True)
class Family:
    """A Prometheus family (``strata_<name>``) and its HELP line."""

    name: str
    help: str


def _remote(key: str, unit: str, help_: str) -> Counter:
    """A counter of the remote level as the flow keeps it: ``strata_<key>_total``."""
    return Counter(
        key,
        "counter",
        unit,
        help_,
        "remote level",
        "remote level",
        (Series(f"{key}_total"),),
        place="levels",
    )


def _backend(key: str, unit: str, help_: str) -> Counter:
    """A counter the remote level's client keeps (``backend_<name>``), not exported."""
    return Counter(
        f"backend_{key}", "counter", unit, help_, "remote level", "backend", place="levels"
    )


def _chunk(
    key: str, kind: Kind, unit: str, help_: str, family: str, kept_by: Keeper = CHUNKS
) -> Counter:
    """A figure of ``ChunkStore.stats()``: ``strata_chunk_<family>``, unlabelled."""
    return Counter(key, kind, unit, help_, CHUNKS, kept_by, (Series(f"chunk_{family}"),))


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
        key, kind, unit, help_, owner, owner, tuple(map(Series, families)), shown, present, "levels"
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
    Counter("parks_ram", "counter", "parks", "parks the RAM level took", "ram level",
            series=(Series("parks_total", "destination", "ram"),), shown=3),
    Counter("parks_disk", "counter", "parks", "parks written to a disk level instead", DISK,
            series=(Series("parks_total", "destination", "disk"),), shown=4),
    Counter("discards", "counter", "captures", "captures neither RAM nor disk could take",
            series=(Series("discards_total"),), shown=5),
    Counter("mirrors", "counter", "parks", "RAM parks also written to disk (`spill_on = park`)",
            DISK),
    Counter("hits_ram", "counter", "restores", "restores served from the RAM level",
            "ram level", series=(Series("hits_total", "source", "ram"),), shown=7),
    Counter("hits_pending", "counter", "restores",
            "restores served from a park whose disk write was in flight", DISK,
            series=(Series("hits_total", "source", "pending"),), shown=8),
    Counter("hits_disk", "counter", "restores", "restores served from the disk levels", DISK,
            series=(Series("hits_total", "source", "disk"),), shown=9),
    Counter("restores_cut_by_gc", "counter", "restores",
            "restores that stopped where GC had removed the next segment meanwhile (a miss "
            "past what was delivered, not damage)", DISK, shown=19),
    Counter("disk_hits_refused", "counter", "restores",
            "disk hits refused: neither RAM floor admits the read, or the conversation is gone",
            DISK, series=(Series("refusals_total", "kind", "disk_hit"),), shown=17),
    Counter("tokens_restored", "counter", "tokens", "tokens restored instead of re-read",
            series=(Series("tokens_restored_total"),), shown=11),
    Counter("restore_misses", "counter", "lookups",
            "lookups and restores that matched nothing (a point of zero tokens included)",
            shown=13),
    Counter("ladder_restores", "counter", "restores", "restores that stopped below damage",
            DISK, series=(Series("ladder_restores_total"),), shown=10),
    Counter("spills_refused", "counter", "writes",
            "disk writes of parks the disk levels refused (each said in a warning)", DISK,
            series=(Series("refusals_total", "kind", "spill"),), shown=18),
    Counter("hits_remote", "counter", "restores", "restores served from the remote level",
            "remote level", series=(Series("hits_total", "source", "remote"),), shown=20),
    Counter("prompt_cache_dir", "info", "", "the system-prompt cache's directory", CACHE,
            CACHE, (Series("prompt_cache_info", "dir"),)),
    Counter("hits_prompt_cache", "counter", "restores",
            "restores served from the system-prompt cache", CACHE, CACHE,
            (Series("hits_total", "source", "prompt_cache"),), shown=21),
    Counter("prompt_cache_hits_refused", "counter", "restores",
            "system-prompt-cache hits refused: neither RAM floor admits the read, or the entry "
            "is gone", CACHE, CACHE, (Series("refusals_total", "kind", "prompt_cache_hit"),),
            shown=22),
    Counter("prompt_cache_fills", "counter", "prefixes",
            "pinned prefixes written to the system-prompt cache", CACHE, CACHE,
            (Series("prompt_cache_fills_total"),)),
    Counter("prompt_cache_fill_errors", "counter", "prefixes",
            "pinned prefixes the system-prompt cache did not take (each said in a warning)",
            CACHE, CACHE, (Series("refusals_total", "kind", "prompt_cache_fill"),)),
    Counter("evict_spills", "counter", "conversations", "RAM evictions written to disk", DISK,
            kept_by="ram level", shown=6),
    Counter("gc_removed", "counter", "conversations", "conversations GC removed whole", DISK,
            kept_by="catalog"),
    Counter("gc_cut", "counter", "conversations",
            "conversations GC cut to their pinned prefix", DISK, kept_by="catalog"),
    Counter("held_tokens", "gauge", "tokens",
            "tokens a restore could bring back now (each conversation once)",
            series=(Series("held_tokens"),), shown=16),
    Counter("admission", "info", "", "the last admission decision (`where/floor`)",
            series=(Series("admission_info", "state"),), shown=15),
    Counter("damaged_segments", "list", "segments",
            "segments a restore found damaged (for fsck), by key", DISK),
    Counter("unreadable_manifests", "list", "manifests",
            "chain manifests skipped at open (unreadable), by name", DISK),
    Counter("free_ram", "gauge", "bytes",
            "free RAM, as the memory probe says when the stats are taken"),
    Counter("tokens_reread", "counter", "tokens", "tokens the engine had to prefill again",
            kept_by="store", series=(Series("tokens_reread_total"),), shown=12),
    Counter("spill_queue_waits", "counter", "parks",
            "parks that waited for room in the spill writer's queue", DISK,
            kept_by="spill writer"),
    Counter("spill_errors", "counter", "writes",
            "acknowledged parks whose disk write failed (each raised once by "
            "`flush()`/`close()`)", DISK, kept_by="spill writer", shown=14),
    Counter("monitor_errors", "counter", "writes",
            "failed writes of the monitor snapshot (never raised)", DISK, kept_by="store"),
    Counter("spill_queue", "gauge", "parks", "parks waiting for the spill writer now", DISK,
            kept_by="spill writer"),
    Counter("park_seconds", "histogram", "seconds",
            "how long `park()` took, until the capture was handed over", kept_by="store",
            series=(Series("park_seconds"),)),
    Counter("restore_seconds", "histogram", "seconds",
            "how long `restore()` took (a `restore_many()` call: once)", kept_by="store",
            series=(Series("restore_seconds"),)),
    Counter("flush_seconds", "histogram", "seconds",
            "how long `flush()` took, the queued disk writes included", kept_by="store",
            series=(Series("flush_seconds"),)),
    Counter("speeds", "table", "",
            "per engine slot (`slot=` of park and restore), per park or restore and per level, "
            "over the last 60 s: GB/s and tokens/s of the calls, calls and bytes a second, and "
            "the window's totals (`{window_s, slots: {slot: {kind: {level: figures}}}}`)",
            kept_by="store", shown=23),
    # -- every level's table: levels[name] ------------------------------------------------------
    _level("entries", "gauge", "entries", "entries the level holds", "level",
           "level_entries", shown=1),
    _level("bytes", "gauge", "bytes", "bytes the level holds", "level", "level_bytes", shown=2),
    _level("budget", "gauge", "bytes", "the level's byte budget", "level",
           "level_budget_bytes", shown=3),
    # -- the RAM level: levels["ram"] -----------------------------------------------------------
    _level("parks", "counter", "parks", "the RAM level's own parks", "ram level"),
    _level("truncated_parks", "counter", "parks", "parks of a truncated prefix", "ram level"),
    _level("discards", "counter", "parks", "parks the RAM level could not take", "ram level"),
    _level("evictions", "counter", "entries", "entries evicted to make room", "ram level",
           "evictions_total", shown=8),
    _level("truncations", "counter", "entries", "entries shrunk to make room for another",
           "ram level"),
    # -- a disk level: levels[name] -------------------------------------------------------------
    _level("dir", "info", "", "the level's directory", DISK),
    _level("oldest_age_s", "gauge", "seconds",
           "age of the oldest entry (`null` while the level is empty)", DISK,
           "level_oldest_age_seconds"),
    _level("disk_evictions", "counter", "conversations",
           "conversations the last level shortened to keep within its budget (whole chains)",
           DISK, "level_disk_evictions_total", "evictions_total", shown=6),
    _level("age_evictions", "counter", "conversations",
           "conversations the last level shortened by age (whole chains)", DISK,
           "level_age_evictions_total", "evictions_total", shown=7),
    _level("degradations", "counter", "entries", "entries handed to the next level",
           DISK, "level_degradations_total", shown=5),
    _level("adopted", "counter", "entries", "entries taken from the level above", DISK),
    _level("refusals", "counter", "entries", "entries the next level refused (they stayed)",
           DISK),
    _level("discards", "counter", "segments", "unreadable images deleted on the way", DISK),
    _level("raced", "counter", "entries", "entries another process moved or deleted first",
           DISK),
    _level("hits", "counter", "restores", "restores served from this level", DISK, shown=4),
    _level("unauthenticated", "counter", "segments",
           "segments refused (read as a miss) because they are not keyed by one of the "
           "level's keys (a keyed level: key_file, key_env)", DISK),
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
    _backend("unauthenticated", "records",
             "commit records refused (read as a miss) because they are not keyed by one of the "
             "level's keys (a keyed level: key_file, key_env)"),
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
    # -- the system-prompt cache: levels["prompt_cache"] ----------------------------------------
    _level("dir", "info", "", "the system-prompt cache's directory", CACHE),
    _level("evictions", "counter", "entries",
           "entries its own budget removed (the oldest first, whole)", CACHE, "evictions_total"),
    # -- a chunk store: ChunkStore.stats() (this process's calls; the levels' holdings now) ----
    _chunk("puts", "counter", "pages", "pages committed (durable where the first level is)",
           "puts_total"),
    _chunk("put_bytes", "counter", "bytes", "the payload bytes of the pages committed",
           "put_bytes_total"),
    _chunk("puts_deduped", "counter", "pages", "puts of a page already held (nothing written)",
           "puts_deduped_total"),
    _chunk("puts_refused", "counter", "pages",
           "puts not stored: no room beside pinned pages, or refused by a caller",
           "puts_refused_total"),
    _chunk("hits", "counter", "pages", "pages delivered, each validated first", "hits_total"),
    _chunk("hit_bytes", "counter", "bytes", "the payload bytes of the pages delivered",
           "hit_bytes_total"),
    _chunk("misses", "counter", "pages", "gets of a page not held (or removed meanwhile)",
           "misses_total"),
    _chunk("damaged", "counter", "pages",
           "pages whose stored copy failed validation or lost its data file: a miss, logged, "
           "removed", "damaged_total"),
    _chunk("read_errors", "counter", "pages",
           "gets that failed otherwise (an I/O error, closing): a miss, the page kept",
           "read_errors_total"),
    _chunk("removes", "counter", "pages", "pages removed by the engine", "removes_total"),
    _chunk("evictions", "counter", "pages",
           "pages the last level let go of, oldest first, to keep its budget", "evictions_total"),
    _chunk("in_flight_bytes", "gauge", "bytes", "bytes of puts being written now",
           "in_flight_bytes"),
    _chunk("pinned", "gauge", "pages", "pages pinned against eviction now", "pinned"),
    _chunk("entries", "gauge", "pages", "pages the levels hold", "entries"),
    _chunk("used_bytes", "gauge", "bytes", "bytes the levels hold", "bytes"),
    _chunk("budget_bytes", "gauge", "bytes", "the levels' byte budgets, summed", "budget_bytes"),
    _chunk("degradations", "counter", "pages",
           "pages a level handed to the next one (the cascade)", "degradations_total", "level"),
)

FAMILIES: tuple[Family, ...] = (
    Family("parks_total", "Conversations parked, by destination: the RAM level or a disk level."),
    Family("discards_total",
           "Captures neither the RAM level nor a disk level could take (prefilled again)."),
    Family("hits_total", "Restores served, by source: the RAM level, a park whose disk write "
                         "was in flight, the disk levels, the system-prompt cache, the remote "
                         "level."),
    Family("refusals_total", "Refused by kind: a disk hit or a system-prompt-cache hit neither "
                             "RAM floor admits, a park's disk write the disk levels refused, a "
                             "pinned prefix the system-prompt cache did not take."),
    Family("evictions_total", "Entries the RAM level evicted to make room, conversations the "
                              "last disk level shortened by budget and by age, or entries the "
                              "system-prompt cache's budget removed, per level."),
    Family("ladder_restores_total", "Restores that stopped at the deepest valid point below "
                                    "damage (the ladder)."),
    Family("tokens_restored_total", "Tokens restored instead of prefilled again."),
    Family("tokens_reread_total", "Tokens the engine had to prefill again."),
    Family("held_tokens", "Tokens a restore could bring back now, each conversation once."),
    Family("admission_info", "The last admission decision as where/floor (value 1)."),
    Family("park_target_info", "Where parks go (ram or disk) and why: configured, or what "
                               "park = auto saw (value 1)."),
    Family("prompt_cache_info", "The system-prompt cache's directory (value 1); its budget is "
                                "strata_level_budget_bytes{level=\"prompt_cache\"}."),
    Family("prompt_cache_fills_total", "Pinned prefixes written to the system-prompt cache."),
    Family("park_seconds", "Seconds a park() call took, until its capture was handed over."),
    Family("restore_seconds", "Seconds a restore() or restore_many() call took."),
    Family("flush_seconds", "Seconds a flush() call took, the queued disk writes included."),
    Family("level_entries", "Entries a level holds."),
    Family("level_bytes", "Bytes a level holds."),
    Family("level_budget_bytes", "A level's byte budget."),
    Family("level_oldest_age_seconds", "Age of the oldest entry of a disk level."),
    Family("level_disk_evictions_total", "Conversations the last disk level shortened to keep "
                                         "within its byte budget."),
    Family("level_age_evictions_total", "Conversations the last disk level shortened because "
                                        "they were older than its maximum age."),
    Family("level_degradations_total", "Entries a disk level handed to the next level."),
    *(Family(s.family, f"Remote level: {c.help}.")
      for c in COUNTERS if c.owner == "remote level" and c.place == "levels"
      for s in c.series),
    *(Family(s.family, f"Chunk store: {c.help}.")
      for c in COUNTERS if c.owner == CHUNKS for s in c.series),
)
# fmt: on


def counter_keys(kept_by: Keeper) -> tuple[str, ...]:
    """The keys of the counters ``kept_by`` keeps, in the table's order (the order
    ``Store.stats()`` reports them in)."""
    return tuple(c.key for c in COUNTERS if c.kept_by == kept_by and c.kind == "counter")


def owners_on(*, disk: bool, remote: bool, prompt_cache: bool = False) -> frozenset[Owner]:
    """The owners whose rows a store reports: the store's own, every level's and the RAM
    level's always (its table is always in the stats), a disk level's while one is configured,
    the remote level's and the system-prompt cache's while each is."""
    on: set[Owner] = {"store", "level", "ram level"}
    if disk:
        on.add("disk level")
    if remote:
        on.add("remote level")
    if prompt_cache:
        on.add(CACHE)
    return frozenset(on)


def reported(figures: Mapping[str, Any], owners: frozenset[Owner]) -> dict[str, Any]:
    """The top-level figures a store reports, in the table's order: each row's whose owner is
    configured (``owners``: :func:`owners_on`) and which ``figures`` holds; the rows of what is
    not configured are left out, never written as 0. ``levels`` (each configured level's
    table) comes last, as ``figures`` holds it."""
    doc = {
        c.key: figures[c.key]
        for c in COUNTERS
        if c.place == "top" and c.owner in owners and c.key in figures
    }
    if "levels" in figures:
        doc["levels"] = figures["levels"]
    return doc


def shown_by_monitor(*, levels: bool) -> tuple[Counter, ...]:
    """What ``strata monitor`` takes from a snapshot, in its order: the top-level figures (its
    counters), or (``levels``) the figures it checks in every level's table."""
    rows = [c for c in COUNTERS if c.shown is not None and (c.place == "levels") == levels]
    return tuple(sorted(rows, key=lambda c: c.shown or 0))


def family_rows(name: str) -> tuple[tuple[Counter, Series], ...]:
    """The rows that feed family ``name``, each with its series, in the table's order."""
    return tuple((c, s) for c in COUNTERS for s in c.series if s.family == name)


def family_type(name: str) -> Literal["counter", "gauge", "histogram"]:
    """A family's Prometheus TYPE: ``counter`` when its rows are counters, ``histogram`` when
    they are histograms, else ``gauge`` (a gauge, or an info row's series of value 1)."""
    kind = family_rows(name)[0][0].kind
    if kind == "counter" or kind == "histogram":
        return kind
    return "gauge"


def series_text(row: Counter, series: Series) -> str:
    """A series as the docs write it: ``strata_parks_total{destination="ram"}``,
    ``strata_level_entries{level=...}``, ``strata_admission_info{state=...}``."""
    if series.value:
        label = f'{series.label}="{series.value}"'
    elif series.label:
        label = f"{series.label}=..."
    elif row.place == "top":
        label = ""
    elif row.owner == "ram level":
        label = 'level="ram"'
    elif row.owner == CACHE:
        label = 'level="prompt_cache"'
    elif row.owner in ("level", "disk level"):
        label = "level=..."
    else:
        label = ""
    return f"strata_{series.family}" + (f"{{{label}}}" if label else "")
