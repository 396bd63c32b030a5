"""The flow of the tiers: one store's levels, and the park, lookup and restore flows over them.

:class:`Tiers` is the policy core of :class:`~stratastore.Store`. It opens the levels
(:mod:`.levels`: the one place a backend is named), makes the context the flow's parts share
(:mod:`.context`: settings, model, the flow's lock, admission, voice) and the write queue, and
hands each call to the module of its concept: a park goes to RAM under the parking floor,
else to disk under the transient floor, else it is discarded and counted (:mod:`.park`); a
lookup is the deepest hit among the restore sources, in their order (:mod:`.lookup`,
:mod:`.sources`); a restore copies that hit into the caller's buffer, every disk page
validated, and falls back to the local sources when the remote level delivers less
(:mod:`.restore`); sessions are explicit saves (:mod:`.sessions`); the write queue writes
acknowledged parks down in the background (:mod:`.write_queue`). Each part keeps its own
counts; the flow's figures are their sum (:meth:`Tiers.counts`). The conversations on disk, their
chain membership and the GC live in the shared catalog (:mod:`stratastore.catalog`), which every
process opening the store sees alike.

The lock is taken where plans and accounts are made (each flow takes it itself, a park once, a
restore twice, a third time to ask a remote level); it is reentrant. No call holds it over
disk I/O, hashing or a network call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.catalog import Catalog
from stratastore.catalog.gc import Collector
from stratastore.chain import Conversation, Match
from stratastore.config import StoreConfig
from stratastore.config.environment import at_open
from stratastore.format import ModelFingerprint
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.cascade import DiskLevel
from stratastore.metrics.counters import Owner, owners_on, reported
from stratastore.metrics.counts import total
from stratastore.metrics.logs import Voice
from stratastore.restore import Destination
from stratastore.tiers.admission import Admission, park_target
from stratastore.tiers.context import FlowContext
from stratastore.tiers.describe import LevelDescription, RamDescription, StoreDescription
from stratastore.tiers.disk_read import DiskReader
from stratastore.tiers.levels import attach_catalog, open_levels, open_remote
from stratastore.tiers.lookup import Hit, Lookup, Prompt, Source, deepest
from stratastore.tiers.park import Parking
from stratastore.tiers.prompt_cache import NAME as PROMPT_CACHE
from stratastore.tiers.prompt_cache import PromptCache, open_prompt_cache
from stratastore.tiers.ram import RamLevel, fit_default_ram
from stratastore.tiers.records import (
    ParkReport,
    Placement,
    Restored,
    Snapshot,
)
from stratastore.tiers.remote import RemoteLevel
from stratastore.tiers.restore import Request, Restorer, destinations
from stratastore.tiers.sessions import Sessions
from stratastore.tiers.sources import DiskSource, PendingSource, RamSource, RemoteSource
from stratastore.tiers.view import DiskView
from stratastore.tiers.write_queue import WriteQueue
from stratastore.tiers.writer import DiskWriter

__all__ = ["Tiers"]


class Tiers:
    def __init__(
        self,
        cfg: StoreConfig,
        fp: ModelFingerprint,
        *,
        probe: Callable[[], int] | None = None,
        legacy_admission: bool = False,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        #: the lines this store says: records of the ``stratastore`` logger, and ``warn``'s
        self.warn = Voice(warn)
        cfg = at_open(cfg, self.warn)  # the environment's switches; a default directory named
        cfg = fit_default_ram(cfg, self.warn)  # the defaults open on an 8 GiB machine
        self.cfg, self.fp, self.root, self.tb = cfg, fp, fp.digest(), fp.token_bytes
        self.admission = Admission(cfg, probe, legacy=legacy_admission)
        #: what the flow's parts share, the flow's lock among it
        self.ctx = FlowContext(cfg, fp, threading.RLock(), self.admission, self.warn)
        self.lock = self.ctx.lock
        #: the owner of the disk writes of parks: the outbox, the writer thread, their errors
        self.writes = WriteQueue(self.root)
        # where parks go is decided first, from the config (a disk level is on when its
        # settings say so: open_levels opens exactly those), so the RAM level reserves its arena
        # only for a RAM target, and a bad ram_mib fails before any level is opened
        self.target, self.target_source = park_target(
            cfg, self.admission, bool(cfg.disk_levels()), self.tb, self.warn
        )
        self.ram = RamLevel(
            cfg,
            fp,
            lambda snap: self.parking.spill(snap),
            reserve=self.target == "ram",
            admission=self.admission,
        )
        try:
            self.levels = open_levels(cfg, fp, self.warn)
        except BaseException:
            self.ram.close()
            raise
        self.catalog: Catalog | None = None
        self.gc: Collector | None = None
        self.writer: DiskWriter | None = None
        self.manifest_dir = self.levels[-1].store.path if self.levels else None
        self.skipped_manifests: list[tuple[str, str]] = []
        self.remote: RemoteLevel | None = None
        self.prompt_cache: PromptCache | None = None
        try:
            if self.levels:
                assert self.manifest_dir is not None
                self.catalog, self.gc, self.writer, self.skipped_manifests = attach_catalog(
                    self.levels, self.root, self.tb, self.manifest_dir, cfg.file_mode, self.warn
                )
            self.remote = open_remote(cfg, fp, self.levels, self.warn)
            self.prompt_cache = open_prompt_cache(cfg, fp, self.warn)
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self.close()
            raise
        self.view = DiskView(self.catalog, self.root)
        self.reader = DiskReader(cfg, fp, self.levels, self.holder, self.warn)
        self.parking = Parking(
            self.ctx,
            self.target,
            self.ram,
            self.levels,
            self.writer,
            self.catalog,
            self.view,
            self.remote,
            self.writes,
            self.prompt_cache,
        )
        self.sessions = Sessions(
            self.ctx,
            self.writer,
            self.reader,
            self.view,
            lambda n: n in self.ram or n in self.writes.outbox,
            self.writes,
        )
        self.lookups, remote = self._sources()
        self.restorer = Restorer(
            self.ctx,
            self.lookups,
            remote,
            self.parking.spill if self.writer is not None else None,
            self.writes,
        )

    def _sources(self) -> tuple[Lookup, RemoteSource | None]:
        """The restore sources in their order: RAM, parks in flight, the disk levels, the
        system-prompt cache, then the shared remote level (asked last, and only for what the
        others do not hold)."""
        page = self.fp.page_tokens if self.cfg.page_resume else None
        disk = DiskSource(
            self.view,
            self.reader,
            self.admission,
            self.tb,
            page,
            self.holder,
            self.warn,
        )
        remote = None if self.remote is None else RemoteSource(self.remote, disk)
        local: tuple[Source, ...] = (
            RamSource(self.ram, self.root, page),
            PendingSource(self.writes.outbox, page),
            disk,
        )
        if self.prompt_cache is not None:
            local = (*local, self.prompt_cache.source(self.admission, self.warn))
        return Lookup(local, remote), remote

    def close(self) -> None:
        restorer = getattr(self, "restorer", None)  # a failed open has none yet
        if restorer is not None and restorer.agenda is not None:
            restorer.agenda.close()
        for lvl in self.levels:
            lvl.store.close()
        if self.prompt_cache is not None:
            self.prompt_cache.close()
        if self.remote is not None:
            self.remote.close()
        self.ram.close()

    @property
    def monitor_dir(self) -> str | None:
        """Where the Store publishes its counters for ``strata monitor``: the last disk level,
        else the system-prompt cache's folder; ``None`` with neither."""
        if self.manifest_dir is not None:
            return self.manifest_dir
        return None if self.prompt_cache is None else self.prompt_cache.path

    def holder(self, key: bytes) -> SegmentBackend | None:
        """The level that holds segment ``key`` now: a local level first, else the remote
        level (a remote failure reads as not held)."""
        for lvl in self.levels:
            if key in lvl.store:
                return lvl.store
        if self.remote is not None and self.remote.holds(key):
            return self.remote.store
        return None

    # -- parking ------------------------------------------------------------------------------
    def place(self, snap: Snapshot, *, pin: bool = False) -> Placement:
        """Place a snapshot (:meth:`.park.Parking.park`): under the flow's lock, once; what it
        acknowledged for a disk write waits in the outbox for the next hand-over."""
        return self.parking.park(snap, pin=pin)

    def streams(self) -> bool:
        """Whether a park in the engine's layout is written from there within its call
        (:meth:`.park.Parking.streams`)."""
        return self.parking.streams()

    def park(self, snap: Snapshot, *, pin: bool = False) -> ParkReport:
        """Place a snapshot and hand the outbox's writes to the write queue, then run its
        streamed write, if any, on this thread: the report once it landed. A park stopped
        anywhere on the way (Ctrl-C, an error) gives back what its placement reserved for a
        streamed write that never started (:meth:`.park.Parking.abandon`); the other writes it
        acknowledged wait in the outbox for the next hand-over."""
        try:
            report = self.writes.submit(self.place(snap, pin=pin))
        except BaseException:
            self.parking.abandon(snap)
            raise
        assert report is not None  # a park's placement carries its report
        return report

    def fill_prompt_cache(self) -> int:
        """Write the pinned prefixes the parks found for the system-prompt cache
        (:mod:`.prompt_cache`; chosen under the lock by each park), each performed by the write
        queue after the writes queued before it, this call waiting for them (a new
        conversation with the same system prompt finds it once the park returned). Returns how
        many landed (a failed write is said and counted, never raised). Stopped on the way,
        those not queued yet wait for the next park's call (those queued are written)."""
        if self.prompt_cache is None or not self.parking.fills:  # (a park's own fill is
            return 0  # seen by its own thread: no lock to find there is none, the usual case)
        cache = self.prompt_cache
        with self.lock:
            fills, self.parking.fills = self.parking.fills, []
        queued: list[Future[object]] = []
        try:
            for entry in fills:
                queued.append(self.writes.enqueue(functools.partial(cache.fill, entry, self.lock)))
        finally:
            if len(queued) < len(fills):
                with self.lock:
                    self.parking.fills[:0] = fills[len(queued) :]
        return sum(bool(f.result()) for f in queued)

    def start_writes(
        self,
        depth: int,
        after_write: Callable[[], object],
        written: Callable[[Snapshot, float], object] | None = None,
    ) -> WriteQueue:
        """From now on the disk writes of parks wait in the outbox and are written by the write
        queue's thread (a queue of ``depth``), so a park returns once its capture is handed
        over. ``written(snap, seconds)``: told of each write that landed and how long it took
        (the per-slot speeds)."""

        def write(snap: Snapshot) -> None:
            start = time.perf_counter()
            try:
                self.write_disk_now(snap)
            except Exception as e:
                if not self.parking.write_failed(snap, e):
                    raise
                return
            if written is not None:
                written(snap, time.perf_counter() - start)

        self.writes.start(depth, write, after_write)
        return self.writes

    def write_disk_now(self, snap: Snapshot) -> None:
        """Write a snapshot to disk at once (:meth:`.park.Parking.write_disk_now`)."""
        self.parking.write_disk_now(snap)

    def spill_ram_on_close(self) -> None:
        """Offer what only RAM holds to the disk writer (before close:
        :meth:`.park.Parking.spill_ram_on_close`), for the write queue's next hand-over."""
        self.parking.spill_ram_on_close()

    # -- lookup and restore -------------------------------------------------------------------
    def lookup_here(
        self,
        prompt: Prompt,
        media: Mapping[int, bytes] | None = None,
        max_tokens: int | None = None,
    ) -> tuple[Hit | None, bool]:
        """The local sources' deepest resume point for ``prompt`` (capped at ``max_tokens``),
        and whether the remote level is worth asking (:meth:`.lookup.Lookup.worth_asking`)."""
        with self.lock:
            here = self.lookups.here(prompt if max_tokens is None else prompt[:max_tokens], media)
            return here, self.lookups.worth_asking(prompt, here, max_tokens)

    def find_remote(self, prompt: Prompt, media: Mapping[int, bytes] | None = None) -> Hit | None:
        """The deepest prefix of ``prompt`` the shared remote level holds, or None (no remote
        level, a miss, a failure). Network calls: without the lock; hand it to :meth:`lookup`."""
        return self.lookups.there(prompt, media)

    def lookup(
        self, prompt: Prompt, media: Mapping[int, bytes] | None = None, remote: Hit | None = None
    ) -> tuple[str, Match] | None:
        """The deepest resume point for ``prompt`` (with ``media``: position -> digest of each
        picture in it; a stored prefix matches only where its pictures match too, spec
        F-KEY-4): ``("ram" | "pending" | "disk" | "prompt_cache" | "remote", match)``.
        ``remote``: the remote level's hit (:meth:`find_remote`), taken only where it holds
        more of the prompt."""
        with self.lock:
            hit = deepest((self.lookups.here(prompt, media), remote))
        return None if hit is None else (hit.source.name, hit.match)

    def restore(
        self,
        prompt: Prompt,
        out: npt.NDArray[np.uint8] | Destination,
        media: Mapping[int, bytes] | None = None,
        max_tokens: int | None = None,
    ) -> Restored:
        """Restore the deepest stored prefix of ``prompt`` (and its ``media``, as in
        :meth:`lookup`) into ``out``: a flat buffer in the stored page layout (at least
        ``len(prompt) * token_bytes``) or a :class:`~stratastore.restore.Destination`; returns
        how many tokens it holds now (at most ``max_tokens``, when given)."""
        got = self.restorer.restore_many([(prompt, out)], [media], [max_tokens])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def restore_many(
        self,
        requests: Sequence[Request],
        media: Sequence[Mapping[int, bytes] | None] = (),
        max_tokens: Sequence[int | None] = (),
    ) -> list[Restored | Exception]:
        """:meth:`restore` for several prompts at once (:meth:`.restore.Restorer.restore_many`):
        per request, its :class:`Restored` or the error that request alone raised. With
        ``batch_agenda`` off each is restored on its own, in order (every destination still
        checked before anything runs)."""
        if self.cfg.batch_agenda:
            return self.restorer.restore_many(requests, media, max_tokens)
        destinations(self.fp, requests, max_tokens)
        return [
            self.restorer.restore_many(
                [req], [media[i] if media else None], [max_tokens[i] if max_tokens else None]
            )[0]
            for i, req in enumerate(requests)
        ]

    # -- sessions (explicit save/load: never removed by GC) -----------------------------------
    def save_session(self, snap: Snapshot) -> None:
        """Save a session: checked and admitted under the lock, written (durably) and the
        levels' budgets enforced without it (:class:`~.sessions.Sessions`)."""
        self.sessions.save(snap)
        for lvl in self.levels:
            lvl.enforce_budget()

    def load_session(self, name: str, out: npt.NDArray[np.uint8]) -> Conversation:
        return self.sessions.load(name, out)

    def delete_session(self, name: str) -> bool:
        return self.sessions.delete(name, self.catalog, self.gc)

    # -- state --------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """The flow's counter figures: the sum of its parts' own counts (the park flow, the
        restore flow, its sources and readers), in the counter table's order. Under the lock."""
        parts: list[Mapping[str, int]] = [
            self.parking.counts,
            self.restorer.counts,
            self.reader.counts,
        ]
        sources = [*self.lookups.local, self.lookups.remote]
        parts += [s.counts for s in sources if s is not None]
        return total("flow", parts)

    @property
    def damaged(self) -> list[bytes]:
        return self.reader.damaged

    def level(self, name: str) -> DiskLevel | None:
        """The disk level called ``name``, if it is on."""
        return next((lvl for lvl in self.levels if lvl.name == name), None)

    @property
    def warm(self) -> DiskLevel | None:
        return self.level("warm")

    @property
    def cold(self) -> DiskLevel | None:
        return self.level("cold")

    def _held_tokens(self) -> int:
        """Tokens a restore could bring back now, each conversation counted once (a RAM entry
        mirrored on disk is one conversation): its RAM entry, its park in flight or its disk
        chain, whichever is deeper, the disk chain only up to the first segment a restore found
        damaged or missing (what the ladder would stop at)."""
        held = {cid: len(e.conv.tokens) for cid, e in self.ram.entries.items()}
        for cid, snap in self.writes.outbox.newest():  # a park in flight restores too
            held[cid] = max(held.get(cid, 0), len(snap.conv.tokens))
        bad = set(self.damaged)
        for cid, dc in self.view.convs.items():
            n = len(dc.conv.tokens)
            if bad:
                n = next((s for s, _, k in dc.segments if k in bad), n)
            held[cid] = max(held.get(cid, 0), n)
        return sum(held.values())

    @property
    def owners(self) -> frozenset[Owner]:
        """What this store has configured, as the counter table's owners: the rows it reports
        (:func:`~stratastore.metrics.counters.owners_on`)."""
        return owners_on(
            disk=bool(self.levels),
            remote=self.remote is not None,
            prompt_cache=self.prompt_cache is not None,
        )

    def stats(self) -> dict[str, Any]:
        """The figures of the counter table this store reports (only those of what it has
        configured: :func:`~stratastore.metrics.counters.reported`), and each level's table.
        The remote level's figures are asked first, without the lock (network calls)."""
        remote = None if self.remote is None else self.remote.stats()
        with self.lock:
            levels: dict[str, Any] = {"ram": self.ram.stats()}
            for lvl in self.levels:
                levels[lvl.name] = {
                    "dir": lvl.store.path,
                    "entries": len(lvl.store),
                    "bytes": lvl.store.used(),
                    "budget": lvl.budget,
                    "oldest_age_s": lvl.oldest_age_s(),
                    **lvl.counters.as_dict(),
                    # refused as not keyed by one of the level's keys (spec F-KEYED-5)
                    "unauthenticated": getattr(lvl.store, "unauthenticated", 0),
                }
            if self.remote is not None and remote is not None:
                levels["remote"] = {**remote, **self.remote.counters}
            cache: dict[str, Any] = {}
            if self.prompt_cache is not None:
                levels[PROMPT_CACHE] = self.prompt_cache.stats()
                cache = {"prompt_cache_dir": self.prompt_cache.path, **self.prompt_cache.counters}
            self.view.sync()
            gc = {"gc_removed": self.gc.removed, "gc_cut": self.gc.cut} if self.gc else {}
            return reported(
                {
                    "park_target": self.target,
                    "park_target_source": self.target_source,
                    **self.counts(),
                    "evict_spills": self.ram.evict_spills,
                    **gc,
                    **cache,
                    "held_tokens": self._held_tokens(),
                    "admission": self.parking.last_admission,
                    "damaged_segments": [k.hex() for k in self.damaged],
                    "unreadable_manifests": [n for n, _ in self.skipped_manifests],
                    "free_ram": self.admission.probe(),
                    "levels": levels,
                },
                self.owners,
            )

    def describe(self) -> StoreDescription:
        """A read-only snapshot of the levels, the RAM level, the parks in flight, the park
        target, the last admission and the counters (:mod:`.describe`). The remote level's
        figures are asked first, without the lock (network calls)."""
        r = None if self.remote is None else self.remote.stats()
        with self.lock:
            levels = [
                LevelDescription(
                    lvl.name, lvl.store.path, lvl.budget, lvl.store.used(), len(lvl.store)
                )
                for lvl in self.levels
            ]
            if self.prompt_cache is not None:
                pc = self.prompt_cache.level
                levels.append(
                    LevelDescription(
                        PROMPT_CACHE, pc.store.path, pc.budget, pc.store.used(), len(pc.store)
                    )
                )
            if self.remote is not None and r is not None:
                levels.append(
                    LevelDescription(
                        "remote",
                        str(r["dir"]),
                        self.remote.settings.budget_bytes,
                        _count(r["bytes"]),
                        _count(r["entries"]),
                    )
                )
            c = self.ram.cache
            ram = RamDescription(c.budget, c.used, c.slots, tuple(c.entries), self.ram.on)
            return StoreDescription(
                tuple(levels),
                ram,
                tuple(cid for cid, _ in self.writes.outbox.newest()),
                self.target,
                self.target_source,
                self.parking.last_admission,
                MappingProxyType(reported(self.counts(), self.owners)),
                tuple(n for n, _ in self.skipped_manifests),
            )


def _count(v: object) -> int | None:
    """A figure the remote level reported (``None`` while it cannot be asked)."""
    return v if isinstance(v, int) else None
