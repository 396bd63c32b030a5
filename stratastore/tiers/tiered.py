"""The flow of the tiers: where each park goes, and where each restore comes from.

:class:`Tiers` is the policy core of :class:`~stratastore.Store`. A park goes to RAM under the
parking floor, else to disk under the transient floor, else it is discarded and counted (seed
000); a restore takes the deepest resume point across RAM and the disk levels and copies it into
the caller's buffer, every disk page validated. Each concept lives in a module of its own: the
RAM level (:mod:`.ram`), the disk levels and their cascade (:mod:`.disk`), writing a snapshot
down (:mod:`.writer`), reading one back (:mod:`.disk_read`), this process's lookup tree
(:mod:`.view`), sessions (:mod:`.sessions`), the checks before a park (:mod:`.checks`); the
conversations on disk, their chain membership and the GC live in the shared catalog
(:mod:`stratastore.catalog`), which every process opening the store sees alike. Not thread-safe
by itself (the Store serialises calls).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..catalog import Catalog, NameTaken
from ..catalog.gc import Collector
from ..chain import Conversation, Match, enforce_count
from ..config import StoreConfig
from ..format import ModelFingerprint
from ..levels.backend import SegmentBackend
from ..restore import Destination, DestinationRefused, Job, as_destination, restore_batch
from .admission import Admission, park_target
from .checks import check_snapshot
from .disk import DiskLevel
from .disk_read import DiskReader
from .levels import attach_catalog, open_levels
from .outbox import Outbox
from .ram import RamLevel
from .records import (
    MAX_STATE_BYTES,
    InvalidConversation,
    ParkReport,
    Restored,
    Snapshot,
    SpillRefused,
)
from .sessions import Sessions
from .view import DiskConv, DiskView
from .writer import DiskWriter

__all__ = ["MAX_STATE_BYTES", "InvalidConversation", "ParkReport", "Restored", "Snapshot",
           "SpillRefused", "Tiers"]  # fmt: skip

_COUNTERS = ("parks_ram", "parks_disk", "discards", "mirrors", "hits_ram",
             "hits_disk", "disk_hits_refused", "tokens_restored", "restore_misses",
             "ladder_restores", "spills_refused")  # fmt: skip


class Tiers:
    def __init__(self, cfg: StoreConfig, fp: ModelFingerprint, *,
                 probe: Callable[[], int] | None = None, legacy_admission: bool = False,
                 warn: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.cfg, self.fp, self.root, self.tb = cfg, fp, fp.digest(), fp.token_bytes
        self.warn = warn or (lambda msg: print(f"stratastore: {msg}", file=sys.stderr))
        self.admission = Admission(cfg, probe, legacy=legacy_admission)
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.ram = RamLevel(cfg, fp, self._spill)  # first: a bad ram_mib fails before any level
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
        try:
            self._open_catalog()
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self.close()
            raise
        self.view = DiskView(self.catalog, self.root)
        self.reader = DiskReader(cfg, fp, self.levels, self.holder, self.counters, self.warn)
        self.sessions = Sessions(fp, self.admission, self.writer, self.reader, self.view,
                                 lambda n: n in self.ram or n in self.outbox)  # fmt: skip
        #: with ``defer_spills`` the disk writes of parks wait in ``outbox`` for the caller (the
        #: Store's spill writer) instead of happening inside ``park``
        self.defer_spills = False
        self.outbox = Outbox()
        self.last_admission = "none yet"
        self.target, self.target_source = park_target(
            cfg, self.admission, self.writer is not None, self.tb, self.warn
        )

    def _open_catalog(self) -> None:
        if self.levels:
            assert self.manifest_dir is not None
            self.catalog, self.gc, self.writer, self.skipped_manifests = attach_catalog(
                self.levels, self.root, self.tb, self.manifest_dir, self.cfg.file_mode, self.warn
            )

    def close(self) -> None:
        for lvl in self.levels:
            lvl.store.close()
        self.ram.close()

    def holder(self, key: bytes) -> SegmentBackend | None:
        """The level that holds segment ``key`` now."""
        for lvl in self.levels:
            if key in lvl.store:
                return lvl.store
        return None

    # -- parking ------------------------------------------------------------------------------
    def park(self, snap: Snapshot) -> ParkReport:
        """Place a snapshot: RAM under the parking floor, else disk under the transient floor,
        else discard (counted). The caller must not change ``snap`` afterwards."""
        check_snapshot(snap, self.fp)
        cid = snap.conv.conv_id
        if self.catalog is not None and self.catalog.is_session(cid):
            raise InvalidConversation(
                f"park: conversation {cid!r}: the id is a saved session's name; sessions and "
                "conversations share one namespace (spec F-CHAIN-4): park under another id, or "
                "delete_session() it"
            )
        # retention: at most cfg.checkpoints per conversation, the policy choosing who leaves
        snap.conv.checkpoints = list(snap.conv.checkpoints)
        for gone in enforce_count(snap.conv.checkpoints, self.cfg.checkpoints,
                                  self.cfg.retention):  # fmt: skip
            snap.states.pop(gone.length, None)
        disk = self.writer is not None
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=self.target == "ram"
                                 and self.ram.on, disk=disk)  # fmt: skip
        self.last_admission = f"{p.where}/{p.floor}"
        if p.where == "ram" and self.ram.park(snap):
            self.counters["parks_ram"] += 1
            if self.cfg.spill_on == "park" and disk and self._spill(snap):
                self.counters["mirrors"] += 1
            return ParkReport("ram", p.floor, len(snap.conv.tokens))
        if p.where != "discard" and disk and self._spill(snap):
            self.counters["parks_disk"] += 1
            return ParkReport("disk", p.floor if p.where == "disk" else "parking",
                              len(snap.conv.tokens))  # fmt: skip
        self.counters["discards"] += 1
        return ParkReport("discard", "none", 0)

    def _spill(self, snap: Snapshot) -> bool:
        """Write ``snap`` to disk, or with ``defer_spills`` hand it to the spill writer (the
        outbox checks first what the levels can take: a park the disk is certain to refuse is
        reported a discard now, issue 11 item 9)."""
        assert self.writer is not None
        if not self.defer_spills:
            return self._write(snap)
        why = self.outbox.offer(snap, self.writer, self.cfg.when_full == "reject")
        if why is not None:
            self.counters["spills_refused"] += 1
            self.warn(f"conversation {snap.conv.conv_id} not written to disk: {why}")
        return why is None

    def _write(self, snap: Snapshot) -> bool:
        assert self.writer is not None
        try:
            done = self.writer.write(snap)
        except NameTaken:
            return False
        for lvl in self.levels:  # the cascade and the GC after every write
            lvl.enforce_budget()
            lvl.enforce_age()
        return done

    def take_outbox(self) -> list[Snapshot]:
        return self.outbox.take()

    def write_disk_now(self, snap: Snapshot) -> None:
        """Write a snapshot to disk at once (what the Store's spill writer calls). A write the
        disk level refuses is the capture lost after all: it counts as a discard and a refused
        spill, and raises :class:`SpillRefused` (the Store reports it to ``flush``/``close``);
        an I/O error propagates as it is. A park whose id became a saved session's name (in
        another process) since it was acknowledged is refused the same way: the catalog checks
        it in the transaction that registers the write, so it never replaces the session's
        manifest (spec F-CHAIN-4)."""
        assert self.writer is not None
        cid = snap.conv.conv_id
        try:
            if self._write(snap):
                return
            why = self.writer.last_refusal or "the disk level refused it"
            if self.catalog is not None and self.catalog.is_session(cid):
                why = (f"its id {cid!r} is now a saved session's name (sessions and "
                       "conversations share one namespace); the session is kept")  # fmt: skip
        finally:
            self.outbox.done(snap)
        self.counters["discards"] += 1
        self.counters["spills_refused"] += 1
        raise SpillRefused(f"conversation {cid!r} was not written to disk: {why}")

    # -- lookup and restore -------------------------------------------------------------------
    def lookup(self, prompt: npt.NDArray[np.integer] | list[int],
               media: Mapping[int, bytes] | None = None) -> tuple[str, Match] | None:  # fmt: skip
        """The deepest resume point for ``prompt`` (with ``media``: position -> digest of each
        picture in it; a stored prefix matches only where its pictures match too, spec
        F-KEY-4): ``("ram" | "disk", match)``. The disk side is what the catalog holds now."""
        self.view.sync()
        page = self.fp.page_tokens if self.cfg.page_resume else None
        best: tuple[str, Match] | None = None
        ram = self.ram.cache.index.lookup(self.root, prompt, media, page_tokens=page)
        for source, m in (("ram", ram), ("disk", self.view.lookup(prompt, media, page))):
            if m is not None and (best is None or m.length > best[1].length):
                best = (source, m)
        return best

    def restore(self, prompt: npt.NDArray[np.integer] | list[int],
                out: npt.NDArray[np.uint8] | Destination,
                media: Mapping[int, bytes] | None = None) -> Restored:  # fmt: skip
        """Restore the deepest stored prefix of ``prompt`` (and its ``media``, as in
        :meth:`lookup`) into ``out``: a flat buffer in the stored page layout (at least
        ``len(prompt) * token_bytes``) or a :class:`~stratastore.restore.Destination`; returns
        how many tokens it holds now."""
        got = self.restore_many([(prompt, out)], [media])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def restore_many(
        self, requests: Sequence[tuple[npt.NDArray[np.integer] | list[int],
                                       npt.NDArray[np.uint8] | Destination]],
        media: Sequence[Mapping[int, bytes] | None] = (),
    ) -> list[Restored | Exception]:  # fmt: skip
        """:meth:`restore` for several prompts at once, each into its own destination: the
        lookups and RAM hits run in order, then the disk hits share one batched read agenda
        (:mod:`stratastore.restore.agenda`). Returns, per request, its :class:`Restored` or the
        error that request alone raised. A destination too small, or one that cannot be written
        in place, raises :class:`~stratastore.restore.DestinationRefused` before anything runs.
        ``media[i]``, when given, is request ``i``'s pictures (see :meth:`lookup`)."""
        dests = []
        for i, (prompt, out) in enumerate(requests):
            what = "out" if len(requests) == 1 else f"out #{i}"
            dest = as_destination(self.fp, out, what)  # refused here, before any lookup or take
            if dest.capacity() < len(prompt):
                raise DestinationRefused(
                    f"restore: the destination holds {dest.capacity():,} tokens ({what}); a prompt "
                    f"of {len(prompt):,} tokens needs room for all of them "
                    f"({len(prompt) * self.tb:,} bytes, {self.tb} a token); pass one that large"
                )
            dests.append(dest)
        results: list[Restored | Exception] = [Restored("none", 0)] * len(requests)
        pending: list[tuple[int, DiskConv, Job]] = []
        for i, ((prompt, _), dest) in enumerate(zip(requests, dests, strict=True)):
            hit = self.lookup(prompt, media[i] if i < len(media) else None)
            if hit is None:
                self.counters["restore_misses"] += 1
                continue
            source, m = hit
            if source == "ram":
                state = self.ram.restore(m, dest)
                self.counters["hits_ram"] += 1
                self.counters["tokens_restored"] += m.length
                results[i] = Restored("ram", m.length, m.conv_id, state)
                continue
            p = self.admission.admit(m.length * self.tb, stays_in_ram=False, disk=True)
            dc = self.view.get(m.conv_id)
            if p.where == "discard" or dc is None:
                self.counters["disk_hits_refused"] += 1
                continue
            pending.append((i, dc, self.reader.job(dc, m.length, dest)))
        outcomes = restore_batch([job for _, _, job in pending])
        for (i, dc, job), o in zip(pending, outcomes, strict=True):
            results[i] = o if isinstance(o, Exception) else self.reader.restored(dc, job, o)
        return results

    # -- sessions (explicit save/load: never removed by GC) -----------------------------------
    def save_session(self, snap: Snapshot) -> None:
        self.sessions.save(snap)
        for lvl in self.levels:
            lvl.enforce_budget()

    def load_session(self, name: str, out: npt.NDArray[np.uint8]) -> Conversation:
        return self.sessions.load(name, out)

    def delete_session(self, name: str) -> bool:
        return self.sessions.delete(name, self.catalog, self.gc)

    # -- state --------------------------------------------------------------------------------
    @property
    def damaged(self) -> list[bytes]:
        return self.reader.damaged

    @property
    def _disk(self) -> dict[str, DiskConv]:
        self.view.sync()
        return self.view.convs

    def level(self, name: str) -> DiskLevel | None:
        """The disk level called ``name``, if it is on."""
        return next((lvl for lvl in self.levels if lvl.name == name), None)

    @property
    def warm(self) -> DiskLevel | None:
        return self.level("warm")

    @property
    def cold(self) -> DiskLevel | None:
        return self.level("cold")

    def stats(self) -> dict[str, Any]:
        levels: dict[str, Any] = {"ram": self.ram.stats()}
        for lvl in self.levels:
            levels[lvl.name] = {"dir": lvl.store.path, "entries": len(lvl.store),
                                "bytes": lvl.store.used(), "budget": lvl.budget,
                                **lvl.counters.as_dict()}  # fmt: skip
        self.view.sync()
        gc = {"gc_removed": self.gc.removed, "gc_cut": self.gc.cut} if self.gc else {}
        return {"park_target": self.target, "park_target_source": self.target_source,
                **self.counters, "evict_spills": self.ram.evict_spills, **gc,
                "held_tokens": self.ram.held_tokens() + self.view.held_tokens(),
                "admission": self.last_admission,
                "damaged_segments": [k.hex() for k in self.damaged],
                "unreadable_manifests": [n for n, _ in self.skipped_manifests],
                "free_ram": self.admission.probe(), "levels": levels}  # fmt: skip
