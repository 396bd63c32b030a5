"""Park: where a conversation leaving its slot goes, and how it reaches disk.

A park goes to RAM under the parking floor, else to disk under the transient floor, else it is
discarded and counted (the admission rule, :mod:`.admission`). Retention runs across the parks
of a conversation (:class:`~stratastore.chain.RetainedChains`). A disk-bound park is written at
once, or, once the store's write queue started (:mod:`.write_queue`), offered to its outbox:
checked there against what the levels can take, so a park the disk is certain to refuse is
reported a discard at once, waiting there for the write queue's next hand-over and written in
the background by :meth:`Parking.write_disk_now`. The writes go through
:class:`~.writer.DiskWriter` (spec F-CHAIN-3: segments, then the manifest as the commit record,
then the catalog's commit), and each is followed by the cascade and the GC. A write
acknowledged locally is then copied to the shared remote level.

The flow's lock is taken here only for this process's bookkeeping (the outbox, the counters),
never over a write, its fsyncs or the cascade: those are safe beside this process's lookups
and restores as beside another process's, so no restore waits for a disk write.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import numpy as np

from stratastore.catalog import Catalog, NameTaken
from stratastore.chain import Conversation, RetainedChains
from stratastore.levels.cascade import DiskLevel
from stratastore.levels.streamed import CHUNK, DEPTH
from stratastore.metrics.counts import Counts
from stratastore.restore import recut_pages
from stratastore.tiers.admission import log_admission
from stratastore.tiers.checks import check_snapshot
from stratastore.tiers.context import FlowContext
from stratastore.tiers.prompt_cache import PromptCache
from stratastore.tiers.ram import RamLevel
from stratastore.tiers.records import (
    InvalidConversation,
    ParkReport,
    Placement,
    Snapshot,
    SpillRefused,
)
from stratastore.tiers.remote import RemoteLevel
from stratastore.tiers.view import DiskView
from stratastore.tiers.write_queue import WriteQueue
from stratastore.tiers.writer import DiskWriter

#: what a park streamed from the engine's layout holds in RAM on its way: its staging
STREAM_STAGING = DEPTH * CHUNK

__all__ = ["Parking"]

#: the counter rows the park flow keeps (:class:`~stratastore.metrics.counts.Counts`)
_COUNTS = ("parks_ram", "parks_disk", "discards", "mirrors", "spills_refused")


def _extends(longer: Conversation, conv: Conversation) -> bool:
    """Whether ``longer`` holds all of ``conv``: its tokens and pictures as a prefix."""
    n = len(conv.tokens)
    pictures = {p: d for p, d in longer.media.items() if p < n}
    return np.array_equal(longer.tokens[:n], conv.tokens) and pictures == dict(conv.media)


class Parking:
    """The park flow of one store (see the module). ``target``: where parks go (``ram`` or
    ``disk``, :func:`~.admission.park_target`)."""

    def __init__(
        self,
        ctx: FlowContext,
        target: str,
        ram: RamLevel,
        levels: Sequence[DiskLevel],
        writer: DiskWriter | None,
        catalog: Catalog | None,
        view: DiskView,
        remote: RemoteLevel | None,
        writes: WriteQueue,
        prompt_cache: PromptCache | None,
    ) -> None:
        self.cfg, self.fp, self.lock, self.admission = ctx.cfg, ctx.fp, ctx.lock, ctx.admission
        self.target, self.ram, self.levels, self.writer = target, ram, levels, writer
        self.catalog, self.view, self.remote, self.warn = catalog, view, remote, ctx.warn
        #: the park flow's counts (the restore flow keeps its own)
        self.counts = Counts("flow", _COUNTS)
        #: where acknowledged writes wait (its outbox) and are written (its thread, once it
        #: started: before, a park's disk write happens within the park)
        self.writes = writes
        self.outbox = writes.outbox
        #: the conversations whose park is being streamed to disk by its caller (placed,
        #: not landed yet), and the wake-up of the parks of the same id waiting for it
        self._streaming: dict[str, Snapshot] = {}
        self._landed = threading.Condition(ctx.lock)
        #: what each conversation's parks kept, so retention runs across parks
        self._chains = RetainedChains(self.cfg.checkpoints, self.cfg.retention)
        self.last_admission = "none yet"
        #: the system-prompt cache, and the entries parks found for it, waiting to be written
        #: without the lock (:meth:`~.tiered.Tiers.fill_prompt_cache`)
        self.prompt_cache = prompt_cache
        self.fills: list[Snapshot] = []

    def park(self, snap: Snapshot, *, pin: bool = False) -> Placement:
        """Place a snapshot: RAM under the parking floor, else disk under the transient floor,
        else discard (counted). The caller must not change ``snap`` afterwards.

        With ``park_truncate``, a park parks the prefix that fits: the RAM level's cache walks
        the chain deepest-first for the first prefix within its budget and, when the whole
        snapshot fails the parking floor and no disk level admits it (none configured, or the
        transient floor fails too), for the first prefix that passes the parking floor as
        well, even below ``min_tokens``; the report says ``ram`` and its tokens. ``pin``: the
        RAM entry is pinned (never truncated, nor evicted for another park, until it is
        restored whole or parked again); it does nothing to a park that goes to disk.

        The one time a park takes the flow's lock on the caller's thread, unless it is written
        from the engine's memory (then each segment landing and the end of its write take it
        too). What it acknowledged for the writer waits in the outbox for the next hand-over
        (:meth:`.write_queue.WriteQueue.submit`)."""
        with self.lock:
            check_snapshot(snap, self.fp)
            cid = snap.conv.conv_id
            while cid in self._streaming:  # an earlier park of the id is being written: after
                self._landed.wait()  # it lands (the lock released meanwhile), never before
            if self.catalog is not None and self.catalog.is_session(cid):
                raise InvalidConversation(
                    f"park: conversation {cid!r}: the id is a saved session's name; sessions "
                    "and conversations share one namespace (spec F-CHAIN-4): park under "
                    "another id, or delete_session() it"
                )
            if snap.capture is not None and snap.conv.conv_id in self.outbox:
                self._pack(snap)  # an earlier park of the id waits for the writer: after it
            self._retain(snap)
            if self.prompt_cache is not None and (e := self.prompt_cache.entry(snap)):
                self.fills.append(e)  # its pinned prefix, as retention laid it out
            # what it acknowledged for the writer (its own, RAM evictions) waits in the outbox
            report = self._place(snap, pin)
        if snap.capture is not None and report.where == "disk":  # written by the caller
            return Placement(report, stream=functools.partial(self.write_streamed, snap, report))
        return Placement(report)

    def streams(self) -> bool:
        """Whether a park given in the engine's layout (:class:`~stratastore.restore.
        EngineCapture`) is written to disk within the call, streamed from the engine's memory
        (:meth:`write`): when parks go to disk and no copy of the capture is wanted besides
        (no shared remote level, no system-prompt cache). Otherwise it is gathered into the
        store's own memory first, and parks as any other."""
        return (
            self.writer is not None
            and self.target == "disk"
            and self.remote is None
            and self.prompt_cache is None
        )

    def _pack(self, snap: Snapshot) -> None:
        """Gather a capture still in the engine's layout into the store's own memory."""
        if snap.capture is not None:
            snap.kv = snap.capture.pack(snap.conv.boundaries())
            snap.capture = None

    def _place(self, snap: Snapshot, pin: bool) -> ParkReport:
        cid = snap.conv.conv_id
        disk = self.writer is not None
        in_ram = self.target == "ram" and self.ram.on
        if snap.capture is not None and not self.streams():
            self._pack(snap)  # (Store.park gathers it before the lock already)
        need = snap.nbytes  # a park streamed from the engine's layout holds only its staging
        p = self.admission.admit(
            need if snap.capture is None else min(need, STREAM_STAGING),
            stays_in_ram=in_ram,
            disk=disk,
        )
        self.last_admission = f"{p.where}/{p.floor}"
        if snap.capture is not None and p.where != "discard":
            assert self.writer is not None
            why = self.outbox.reserve(snap, self.writer, self.cfg.when_full == "reject")
            if why is None:
                self._streaming[cid] = snap  # until write_streamed ends (or it is abandoned)
                if cid in self.ram:  # superseded by this park, once it lands
                    self.ram.drop(cid)
                log_admission(self.warn, p, "park to disk", f"conversation {cid}")
                floor = p.floor if p.where == "disk" else "parking"
                return ParkReport("disk", floor, len(snap.conv.tokens))  # written by the caller
            self.counts["spills_refused"] += 1  # the disk is certain to refuse it
            self.counts["discards"] += 1
            self.warn(f"conversation {cid} discarded, not written to disk: {why}")
            return ParkReport("discard", "none", 0)
        if p.where == "ram" and self._park_ram(snap, pin):
            mirror = snap.detached()
            mirror.slot = None  # the park counted as a RAM park: its mirror is no park
            if self.cfg.spill_on == "park" and disk and self.spill(mirror):
                self.counts["mirrors"] += 1
            return ParkReport("ram", p.floor, len(snap.conv.tokens))
        if p.where != "discard" and disk and self.spill(snap):
            self.counts["parks_disk"] += 1
            if cid in self.ram:  # an older park of this id held in RAM is superseded now: it
                self.ram.drop(cid)  # must not serve as the id's latest (close writes RAM down)
            log_admission(self.warn, p, "park to disk", f"conversation {cid}")
            return ParkReport(
                "disk", p.floor if p.where == "disk" else "parking", len(snap.conv.tokens)
            )
        if p.where == "discard" and in_ram and self.cfg.park_truncate:
            with self.ram.cache.gate(p.available, self.admission.parking_floor):
                if self._park_ram(snap, pin):  # the prefix that passes the floor
                    self.last_admission = "ram/parking"
                    return ParkReport("ram", "parking", len(snap.conv.tokens))
        self.counts["discards"] += 1
        log_admission(self.warn, p, "park", f"conversation {cid} discarded")
        return ParkReport("discard", "none", 0)

    def _retain(self, snap: Snapshot) -> None:
        """Retention across parks: the checkpoints kept are those the previous park of the
        conversation kept, still prefixes of these tokens, with the new ones added one at a
        time under ``checkpoints``/``retention`` (:mod:`stratastore.chain.retained`);
        ``snap.conv.checkpoints`` is set to them and the states of the others are dropped.

        Every checkpoint kept is a segment bound, whatever cuts came with the park (spec
        F-SEG-7: a restore ends on a segment bound): the capture is laid out again, in place,
        at a kept checkpoint it was not cut at (:func:`~stratastore.restore.recut_pages`), so an
        engine that passes its root and newest checkpoint and no cuts keeps the points that
        retention spreads. Nothing the capture was cut at moves: a passed checkpoint retention
        drops stays a cut. The store keeps no running state across parks: for a snapshot with
        ``states`` (a hybrid model), a remembered checkpoint this park passes no state for
        still counts as kept but is not parked as a resume point (a RAM hit there would have
        no state to give)."""
        conv = snap.conv
        passed = {c.length for c in conv.checkpoints}
        layout = {b for seg in conv.boundaries() for b in seg}  # what the capture is cut at
        for gone in self._chains.apply(conv, lambda: self._stored_chain(conv.conv_id)):
            snap.states.pop(gone.length, None)
        bounds = layout | {c.length for c in conv.checkpoints}
        if bounds != layout and snap.capture is None:  # (one in the engine's layout is
            # gathered along the cuts it ends up with)
            if not snap.kv.flags.writeable:  # the engine's read-only bytes: the store's copy
                snap.kv = snap.kv.copy()
            for seg in recut_pages(self.fp, snap.kv, sorted(layout), sorted(bounds)):
                snap.page_hashes.pop(seg, None)  # digests of the old pages
        conv.cuts = sorted(bounds - {len(conv.tokens)}) or [0]
        if snap.states:
            resumable = [
                c for c in conv.checkpoints if c.length in passed or c.length in snap.states
            ]
            conv.checkpoints = resumable or conv.checkpoints

    def _park_ram(self, snap: Snapshot, pin: bool) -> bool:
        """Park in the RAM level (the cache may keep only a prefix); counted."""
        if not self.ram.park(snap):
            return False
        self.counts["parks_ram"] += 1
        if pin:
            self.ram.cache.pin(snap.conv.conv_id)
        return True

    def _stored_chain(self, cid: str) -> Conversation | None:
        """The chain the store holds for ``cid`` (RAM, else the catalog), for a park that has
        no retention memory of it (a new process): retention continues from it."""
        if cid in self.ram:
            conv: Conversation = self.ram.entries[cid].conv
            return conv
        self.view.sync()
        dc = self.view.get(cid)
        return dc.conv if dc is not None and not dc.session else None

    def spill(self, snap: Snapshot) -> bool:
        """Write ``snap`` to disk, or once the write queue started, offer it to its outbox for
        the writer thread (the outbox checks first what the levels can take: a park the disk
        is certain to refuse is reported a discard now). Under the flow's lock; what it
        offered is taken by the call's placement."""
        assert self.writer is not None
        if not self.writes.deferred:
            return self.write(snap)
        snap = snap.detached()  # the RAM level may shrink its own copy of conv before the write
        why = self.outbox.offer(snap, self.writer, self.cfg.when_full == "reject")
        if why is not None and snap.kept and self.remote is not None:  # the store's own copy
            self.remote.count("remote_kept_local_errors")
            self.warn(f"{snap.conv.conv_id} (read from the remote level) not kept locally: {why}")
        elif why is not None:
            self.counts["spills_refused"] += 1
            self.warn(f"conversation {snap.conv.conv_id} not written to disk: {why}")
        return why is None

    def write(self, snap: Snapshot) -> bool:
        """Write ``snap`` down now (the lock only as each segment lands, to release its
        reservation), then the cascade and the GC, then the copy to the remote level."""
        assert self.writer is not None

        def landed(nbytes: int) -> None:
            with self.lock:
                self.outbox.landed(snap, nbytes)

        try:
            done = self.writer.write(snap, on_put=landed)
        except NameTaken:
            return False
        for lvl in self.levels:  # the cascade and the GC after every write
            lvl.enforce_budget()
            lvl.enforce_age()
        if done and self.remote is not None and snap.kept:  # a remote restore, now local
            self.remote.count("remote_kept_local")
        elif done and self.remote is not None:  # acknowledged locally: now the shared copy
            self.remote.push(snap)
        return done

    def _settled(self, snap: Snapshot, *counted: str) -> None:
        """A streamed park's write ended (landed, refused or failed): its reservation given
        back, the parks of its id waiting for it woken, and what it was counted as
        (``counted``), in one hold of the lock."""
        with self.lock:
            self.outbox.release(snap)
            if self._streaming.get(snap.conv.conv_id) is snap:
                del self._streaming[snap.conv.conv_id]
            self._landed.notify_all()
            for key in counted:
                self.counts[key] += 1

    def abandon(self, snap: Snapshot) -> None:
        """The park of ``snap`` stopped (Ctrl-C, an error) after its placement and before its
        streamed write began: that write never runs, so its reservation is given back and the
        parks of its id waiting for it are woken. Nothing else of the park needs giving back:
        the writes it acknowledged wait in the outbox. A no-op for a park with no streamed
        write placed, or whose write already ended (it settles itself)."""
        with self.lock:
            placed = self._streaming.get(snap.conv.conv_id) is snap
        if placed:
            self._settled(snap)

    def write_streamed(self, snap: Snapshot, report: ParkReport) -> ParkReport:
        """Write a park :meth:`park` placed on disk while its capture is still in the engine's
        layout, streamed from there (:meth:`write`), on the caller's thread and without the
        lock; its reservation (:meth:`.outbox.Outbox.reserve`) is given back as it lands. A
        later park of the same id waits in :meth:`park` until this one ended, so the two land
        in the order they were placed. ``report`` once it landed. A level that refuses it
        makes it a discard (counted, said); an I/O error is raised, naming the conversation,
        and counted as a discard: the park is not acknowledged either way."""
        assert self.writer is not None
        cid = snap.conv.conv_id
        try:
            done = self.write(snap)
        except BaseException as e:
            self._settled(snap, "discards")
            e.add_note(f"the park of conversation {cid!r} was not stored (nothing acknowledged)")
            raise
        if done:
            self._settled(snap, "parks_disk")
            return report
        self._settled(snap, "discards", "spills_refused")
        if self.catalog is not None and self.catalog.is_session(cid):
            why = f"its id {cid!r} is a saved session's name (one namespace, spec F-CHAIN-4)"
        else:
            why = self.writer.last_refusal or "the disk level refused it"
        self.warn(f"conversation {cid} discarded: {why}")
        return ParkReport("discard", "none", 0)

    def write_disk_now(self, snap: Snapshot) -> None:
        """Write a snapshot to disk at once (:meth:`write`; what the spill writer calls). A
        write the disk level refuses is the capture lost after all: it counts as a discard and
        a refused spill, and raises :class:`SpillRefused` (reported to ``flush``/``close``);
        an I/O error propagates as it is. A park whose id became a saved
        session's name (in another process) since it was acknowledged is refused the same way:
        the catalog checks it in the transaction that registers the write, so it never
        replaces the session's manifest (spec F-CHAIN-4)."""
        assert self.writer is not None
        cid = snap.conv.conv_id
        try:
            if self.write(snap):
                return
            why = self.writer.last_refusal or "the disk level refused it"
            if self.catalog is not None and self.catalog.is_session(cid):
                why = (
                    f"its id {cid!r} is now a saved session's name (sessions and "
                    "conversations share one namespace); the session is kept"
                )
        finally:
            with self.lock:
                self.outbox.done(snap)
        if not snap.kept:  # a kept copy (remote_keep_local) was no park: not counted as one
            with self.lock:
                self.counts["discards"] += 1
                self.counts["spills_refused"] += 1
        raise SpillRefused(f"conversation {cid!r} was not written to disk: {why}")

    def write_failed(self, snap: Snapshot, e: Exception) -> bool:
        """A queued write of ``snap`` raised ``e``: whether it is settled here. A copy the
        store made of its own accord (``remote_keep_local``) was no park anyone was told of:
        its failure is said and counted (``remote_kept_local_errors``), never reported as a
        lost park; any other is the writer's to report (``False``)."""
        if not (snap.kept and self.remote is not None):
            return False
        with self.lock:
            self.remote.count("remote_kept_local_errors")
        self.warn(f"{snap.conv.conv_id} (read from the remote level) not kept locally: {e}")
        return True

    def spill_ram_on_close(self) -> None:
        """Before close (``spill_on_close``): offer every conversation that only the RAM level
        holds (not on disk with these tokens or more, nor waiting to be written) to the disk
        writer, each admitted as a disk-bound capture under the transient floor; one that is
        not admitted is left, with a warning. The writes wait in the outbox for close's
        hand-over."""
        with self.lock:
            if self.cfg.spill_on_close and self.writer is not None and self.ram.on:
                self._hand_ram_down()

    def _hand_ram_down(self) -> None:
        """:meth:`spill_ram_on_close`'s walk of the RAM level (under the lock). Each
        conversation on its own: one that fails (the error raised once the walk is done) never
        keeps the others from being written."""
        self.view.sync()
        waiting = dict(self.outbox.newest())  # the newest park of each id waiting for its write
        failed: list[Exception] = []
        for cid, entry in list(self.ram.entries.items()):
            try:
                self._hand_down(cid, entry.conv, waiting.get(cid))
            except Exception as e:
                self.warn(f"close: conversation {cid} not written down: {e}")
                failed.append(e)
        if failed:
            raise failed[0]

    def _hand_down(self, cid: str, conv: Conversation, waiting: Snapshot | None) -> None:
        """Offer the RAM entry ``conv`` of ``cid`` to the disk writer, unless the disk or the
        park ``waiting`` for its write holds it already (or the admission refuses it)."""
        dc = self.view.get(cid)
        held = [dc.conv] if dc is not None else []
        if waiting is not None:
            held.append(waiting.conv)
        if any(_extends(c, conv) for c in held):
            return
        nbytes = len(conv.tokens) * self.fp.token_bytes
        p = self.admission.admit(nbytes, stays_in_ram=False, disk=True)
        if p.where == "discard":
            self.warn(f"close: conversation {cid} stays unwritten (RAM only): {p.describe()}")
            return
        self.spill(self.ram.capture(cid))
