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

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.catalog import Catalog, NameTaken
from stratastore.catalog.gc import Collector
from stratastore.chain import Conversation, Match, RetainedChains
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.format import ModelFingerprint
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.redis.settings import RemoteSettings
from stratastore.restore import (
    Destination,
    DestinationRefused,
    FlatKV,
    Job,
    Outcome,
    as_destination,
    deliver_capture,
    restore_batch,
)
from stratastore.tiers.admission import Admission, Placement, park_target
from stratastore.tiers.checks import check_snapshot
from stratastore.tiers.disk import DiskLevel
from stratastore.tiers.disk_read import DiskReader
from stratastore.tiers.levels import attach_catalog, open_levels
from stratastore.tiers.outbox import Outbox
from stratastore.tiers.ram import RamLevel, fit_default_ram
from stratastore.tiers.records import (
    MAX_STATE_BYTES,
    UNLOCKED,
    InvalidConversation,
    ParkReport,
    Restored,
    Snapshot,
    SpillRefused,
)
from stratastore.tiers.remote import RemoteHit, RemoteLevel
from stratastore.tiers.sessions import Sessions
from stratastore.tiers.view import DiskConv, DiskView
from stratastore.tiers.writer import DiskWriter

__all__ = ["MAX_STATE_BYTES", "InvalidConversation", "ParkReport", "Restored", "Snapshot",
           "SpillRefused", "Tiers"]  # fmt: skip

_COUNTERS = ("parks_ram", "parks_disk", "discards", "mirrors", "hits_ram", "hits_pending",
             "hits_disk", "restores_cut_by_gc", "disk_hits_refused", "tokens_restored",
             "restore_misses", "ladder_restores", "spills_refused", "hits_remote")  # fmt: skip


#: remote segments a restore found damaged: (keys, its outcome, what asked, already said)
_Damage = tuple[list[bytes], Outcome, str, bool]


def _deeper(local: tuple[str, Match] | None, remote: RemoteHit | None
            ) -> tuple[str, Match] | None:  # fmt: skip
    """The local levels' best resume point, or the remote level's where it is deeper."""
    if remote is not None and (local is None or remote.match.length > local[1].length):
        return ("remote", remote.match)
    return local


def _delivered(r: Restored | Exception) -> int:
    """The tokens a restore's result delivered (an error: none)."""
    return r.tokens if isinstance(r, Restored) else 0


def _cap(max_tokens: Sequence[int | None], i: int) -> int | None:
    return max_tokens[i] if i < len(max_tokens) else None


def _extends(longer: Conversation, conv: Conversation) -> bool:
    """Whether ``longer`` holds all of ``conv``: its tokens and pictures as a prefix."""
    n = len(conv.tokens)
    pictures = {p: d for p, d in longer.media.items() if p < n}
    return np.array_equal(longer.tokens[:n], conv.tokens) and pictures == dict(conv.media)


def _at_a_state(m: Match, states: Mapping[int, bytes]) -> Match | None:
    """A hit on a capture in memory, for a hybrid model (one that saved running states): moved
    down to the deepest checkpoint with a state, as the disk path does (``None``: none below
    it). An attention-only capture (no states) resumes where it matched."""
    if not states or m.length in states:
        return m
    below = max((n for n in states if n <= m.length), default=0)
    return dataclasses.replace(m, length=below, via="checkpoint") if below else None


class Tiers:
    def __init__(self, cfg: StoreConfig, fp: ModelFingerprint, *,
                 probe: Callable[[], int] | None = None, legacy_admission: bool = False,
                 warn: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.warn = warn or (lambda msg: print(f"stratastore: {msg}", file=sys.stderr))
        cfg = fit_default_ram(cfg, self.warn)  # the defaults open on an 8 GiB machine
        self.cfg, self.fp, self.root, self.tb = cfg, fp, fp.digest(), fp.token_bytes
        self.admission = Admission(cfg, probe, legacy=legacy_admission)
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        # where parks go is decided first, from the config (a disk level is on when its
        # settings say so: open_levels opens exactly those), so the RAM level reserves its arena
        # only for a RAM target, and a bad ram_mib fails before any level is opened
        self.target, self.target_source = park_target(
            cfg, self.admission, bool(cfg.disk_levels()), self.tb, self.warn
        )
        self.ram = RamLevel(cfg, fp, self._spill, reserve=self.target == "ram",
                            admission=self.admission)  # fmt: skip
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
        try:
            self._open_catalog()
            self.remote = self._open_remote()
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self.close()
            raise
        self.view = DiskView(self.catalog, self.root)
        self.reader = DiskReader(cfg, fp, self.levels, self.holder, self.counters, self.warn)
        self.sessions = Sessions(fp, self.admission, self.writer, self.reader, self.view,
                                 lambda n: n in self.ram or n in self.outbox,
                                 self.warn)  # fmt: skip
        #: with ``defer_spills`` the disk writes of parks wait in ``outbox`` for the caller (the
        #: Store's spill writer) instead of happening inside ``park``
        self.defer_spills = False
        self.outbox = Outbox(self.root)
        #: what each conversation's parks kept, so retention runs across parks (seed 004)
        self._chains = RetainedChains(cfg.checkpoints, cfg.retention)
        self.last_admission = "none yet"

    def _open_catalog(self) -> None:
        if self.levels:
            assert self.manifest_dir is not None
            self.catalog, self.gc, self.writer, self.skipped_manifests = attach_catalog(
                self.levels, self.root, self.tb, self.manifest_dir, self.cfg.file_mode, self.warn
            )

    def _open_remote(self) -> RemoteLevel | None:
        """The shared remote level (issue 17), when ``remote_url`` is set: it needs a local
        disk level (the catalog lives there, and a park is acknowledged by the local write)."""
        if not self.cfg.remote_url:
            return None
        if not self.levels:
            raise ConfigError("setting remote_url needs a local disk level (cold_dir and "
                              "cold_mib, or levels): a park is written there first, then "
                              "copied to the remote level")  # fmt: skip
        return RemoteLevel(RemoteSettings.from_config(self.cfg), self.fp, self.warn)

    def close(self) -> None:
        for lvl in self.levels:
            lvl.store.close()
        if self.remote is not None:
            self.remote.close()
        self.ram.close()

    def holder(self, key: bytes) -> SegmentBackend | None:
        """The level that holds segment ``key`` now: a local level first, else the remote
        level (issue 17; a remote failure reads as not held)."""
        for lvl in self.levels:
            if key in lvl.store:
                return lvl.store
        if self.remote is not None and self.remote.holds(key):
            return self.remote.store
        return None

    # -- parking ------------------------------------------------------------------------------
    def park(self, snap: Snapshot, *, pin: bool = False) -> ParkReport:
        """Place a snapshot: RAM under the parking floor, else disk under the transient floor,
        else discard (counted). The caller must not change ``snap`` afterwards.

        Retention runs across the parks of a conversation (seed 004, :meth:`_retain`).

        With ``park_truncate`` (seed 001), a park parks the prefix that fits: the RAM level's
        cache walks the chain deepest-first for the first prefix within its budget (as before)
        and, when the whole snapshot fails the parking floor and no disk level admits it (none
        configured, or the transient floor fails too), for the first prefix that passes the
        parking floor as well, even below ``min_tokens``; the report says ``ram`` and its tokens.
        ``pin``: the RAM entry is pinned (never truncated, nor evicted for another park, until it
        is restored whole or parked again); it does nothing to a park that goes to disk."""
        check_snapshot(snap, self.fp)
        cid = snap.conv.conv_id
        if self.catalog is not None and self.catalog.is_session(cid):
            raise InvalidConversation(
                f"park: conversation {cid!r}: the id is a saved session's name; sessions and "
                "conversations share one namespace (spec F-CHAIN-4): park under another id, or "
                "delete_session() it"
            )
        self._retain(snap)
        disk = self.writer is not None
        in_ram = self.target == "ram" and self.ram.on
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=in_ram, disk=disk)
        self.last_admission = f"{p.where}/{p.floor}"
        if p.where == "ram" and self._park_ram(snap, pin):
            if self.cfg.spill_on == "park" and disk and self._spill(snap):
                self.counters["mirrors"] += 1
            return ParkReport("ram", p.floor, len(snap.conv.tokens))
        if p.where != "discard" and disk and self._spill(snap):
            self.counters["parks_disk"] += 1
            if cid in self.ram:  # an older park of this id held in RAM is superseded now: it
                self.ram.drop(cid)  # must not serve as the id's latest (close writes RAM down)
            self._log_admission(p, "park to disk", f"conversation {cid}")
            return ParkReport("disk", p.floor if p.where == "disk" else "parking",
                              len(snap.conv.tokens))  # fmt: skip
        if p.where == "discard" and in_ram and self.cfg.park_truncate:
            with self.ram.cache.gate(p.available, self.admission.parking_floor):
                if self._park_ram(snap, pin):  # the prefix that passes the floor (seed 001)
                    self.last_admission = "ram/parking"
                    return ParkReport("ram", "parking", len(snap.conv.tokens))
        self.counters["discards"] += 1
        self._log_admission(p, "park", f"conversation {cid} discarded")
        return ParkReport("discard", "none", 0)

    def _log_admission(self, p: Placement, what: str, outcome: str) -> None:
        """Seed 000's log line of an admission that refused, or that admitted under the
        transient floor (``skip parking (physical RAM admission ...)``, ``disk hit skipped``,
        ``... under the transient RAM floor (need ... plus 512 MiB, not 2560 MiB)``)."""
        line = p.log_line(what)
        if line is not None:
            self.warn(f"{line}: {outcome}")

    def _retain(self, snap: Snapshot) -> None:
        """Retention across parks (seed 004): the checkpoints kept are those the previous park
        of the conversation kept, still prefixes of these tokens, with the new ones added one at
        a time under ``checkpoints``/``retention`` (:mod:`stratastore.chain.retained`);
        ``snap.conv.checkpoints`` is set to them and the states of the others are dropped. The
        store keeps no running state across parks: for a snapshot with ``states`` (a hybrid
        model), a remembered checkpoint this park passes no state for still counts as kept but
        is not parked as a resume point (a RAM hit there would have no state to give)."""
        conv = snap.conv
        passed = {c.length for c in conv.checkpoints}
        # the boundaries the capture was packed with (its pages start at each, F-SEG-4): what
        # retention keeps must be among them, and what it drops stays one (a cut), or the bytes
        # would be read in another layout than they were written in
        layout = {b for seg in conv.boundaries() for b in seg}
        for gone in self._chains.apply(conv, lambda: self._stored_chain(conv.conv_id), layout):
            snap.states.pop(gone.length, None)
        conv.cuts = sorted(layout - {len(conv.tokens)}) or [0]
        if snap.states:
            resumable = [c for c in conv.checkpoints
                         if c.length in passed or c.length in snap.states]  # fmt: skip
            conv.checkpoints = resumable or conv.checkpoints

    def _park_ram(self, snap: Snapshot, pin: bool) -> bool:
        """Park in the RAM level (the cache may keep only a prefix, seed 001); counted."""
        if not self.ram.park(snap):
            return False
        self.counters["parks_ram"] += 1
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

    def _spill(self, snap: Snapshot) -> bool:
        """Write ``snap`` to disk, or with ``defer_spills`` hand it to the spill writer (the
        outbox checks first what the levels can take: a park the disk is certain to refuse is
        reported a discard now, issue 11 item 9)."""
        assert self.writer is not None
        if not self.defer_spills:
            return self._write(snap)
        snap = snap.detached()  # the RAM level may shrink its own copy of conv before the write
        why = self.outbox.offer(snap, self.writer, self.cfg.when_full == "reject")
        if why is not None and snap.kept and self.remote is not None:  # the store's own copy
            self.remote.counters["remote_kept_local_errors"] += 1
            self.warn(f"{snap.conv.conv_id} (read from the remote level) not kept locally: {why}")
        elif why is not None:
            self.counters["spills_refused"] += 1
            self.warn(f"conversation {snap.conv.conv_id} not written to disk: {why}")
        return why is None

    def _write(self, snap: Snapshot, lock: AbstractContextManager[Any] = UNLOCKED) -> bool:
        assert self.writer is not None

        def landed(nbytes: int) -> None:
            with lock:
                self.outbox.landed(snap, nbytes)

        try:
            done = self.writer.write(snap, on_put=landed)
        except NameTaken:
            return False
        for lvl in self.levels:  # the cascade and the GC after every write
            lvl.enforce_budget()
            lvl.enforce_age()
        if done and self.remote is not None and snap.kept:  # a remote restore, now local
            self.remote.counters["remote_kept_local"] += 1
        elif done and self.remote is not None:  # acknowledged locally: now the shared copy
            self.remote.push(snap)
        return done

    def spill_ram_on_close(self) -> int:
        """Before close (``spill_on_close``, issue 14): hand every conversation that only the
        RAM level holds (not on disk with these tokens or more, nor waiting to be written) to the
        disk writer, each admitted as a disk-bound capture under the transient floor (seed
        000); one that is not admitted is left, with a warning. Returns how many were handed."""
        if not (self.cfg.spill_on_close and self.writer is not None and self.ram.on):
            return 0
        self.view.sync()
        handed = 0
        for cid, entry in list(self.ram.entries.items()):
            dc = self.view.get(cid)
            held = [dc.conv] if dc is not None else []
            if cid in self.outbox:  # the newest park of the id waiting for its write
                held.append(self.outbox.capture(cid).conv)
            if any(_extends(c, entry.conv) for c in held):
                continue
            n = len(entry.conv.tokens)
            nbytes = n * self.tb
            p = self.admission.admit(nbytes, stays_in_ram=False, disk=True)
            if p.where == "discard":
                self.warn(f"close: conversation {cid} stays unwritten (RAM only): {p.describe()}")
                continue
            if self._spill(self.ram.capture(cid)):
                handed += 1
        return handed

    def take_outbox(self) -> list[Snapshot]:
        return self.outbox.take()

    def write_disk_now(self, snap: Snapshot, lock: AbstractContextManager[Any] = UNLOCKED
                       ) -> None:  # fmt: skip
        """Write a snapshot to disk at once (what the Store's spill writer calls). A write the
        disk level refuses is the capture lost after all: it counts as a discard and a refused
        spill, and raises :class:`SpillRefused` (the Store reports it to ``flush``/``close``);
        an I/O error propagates as it is. A park whose id became a saved session's name (in
        another process) since it was acknowledged is refused the same way: the catalog checks
        it in the transaction that registers the write, so it never replaces the session's
        manifest (spec F-CHAIN-4).

        ``lock`` (the Store's) is held only for this process's bookkeeping (the outbox, the
        counters), never over the write, its fsyncs or the levels' cascade: those are safe
        beside this process's lookups and restores as beside another process's (issue 12), so
        no restore waits for a disk write (issue 14)."""
        assert self.writer is not None
        cid = snap.conv.conv_id
        try:
            if self._write(snap, lock):
                return
            why = self.writer.last_refusal or "the disk level refused it"
            if self.catalog is not None and self.catalog.is_session(cid):
                why = (f"its id {cid!r} is now a saved session's name (sessions and "
                       "conversations share one namespace); the session is kept")  # fmt: skip
        finally:
            with lock:
                self.outbox.done(snap)
        if not snap.kept:  # a kept copy (remote_keep_local) was no park: the Store counts it
            with lock:
                self.counters["discards"] += 1
                self.counters["spills_refused"] += 1
        raise SpillRefused(f"conversation {cid!r} was not written to disk: {why}")

    # -- lookup and restore -------------------------------------------------------------------
    def find_remote(self, prompt: npt.NDArray[np.integer] | list[int],
                    media: Mapping[int, bytes] | None = None) -> RemoteHit | None:  # fmt: skip
        """The deepest prefix of ``prompt`` the shared remote level holds (issue 17), or None
        (no remote level, a miss, a failure). Network calls: run it without the Store's lock,
        and hand the hit to :meth:`lookup`."""
        if self.remote is None:
            return None
        return self.remote.lookup(np.asarray(prompt), media)

    def lookup_here(self, prompt: npt.NDArray[np.integer] | list[int],
                    media: Mapping[int, bytes] | None = None, max_tokens: int | None = None
                    ) -> tuple[tuple[str, Match] | None, bool]:  # fmt: skip
        """The local levels' deepest resume point for ``prompt`` (as :meth:`lookup`, capped at
        ``max_tokens``), and whether the remote level is worth asking: there is one, and the
        local levels hold less of the prompt than the caller can use (all of it, or
        ``max_tokens`` of it). A local hit never waits on the remote level, however it is
        (healthy, slow, paused or gone). Under the Store's lock."""
        need = len(prompt) if max_tokens is None else min(len(prompt), max_tokens)
        here = self._lookup_local(prompt if max_tokens is None else prompt[:max_tokens], media)
        return here, self.remote is not None and (here is None or here[1].length < need)

    def lookup(self, prompt: npt.NDArray[np.integer] | list[int],
               media: Mapping[int, bytes] | None = None,
               remote: RemoteHit | None = None) -> tuple[str, Match] | None:  # fmt: skip
        """The deepest resume point for ``prompt`` (with ``media``: position -> digest of each
        picture in it; a stored prefix matches only where its pictures match too, spec
        F-KEY-4): ``("ram" | "pending" | "disk" | "remote", match)``. The disk side is what the
        catalog holds now; ``pending`` is a park whose disk write is still in flight (its
        capture is in memory: issue 14, read your own writes without waiting for them);
        ``remote`` is the shared remote level's hit (issue 17, :meth:`find_remote`, found
        without the lock), taken only when it holds more of the prompt than the local levels."""
        return _deeper(self._lookup_local(prompt, media), remote)

    def _lookup_local(self, prompt: npt.NDArray[np.integer] | list[int],
                      media: Mapping[int, bytes] | None) -> tuple[str, Match] | None:  # fmt: skip
        """:meth:`lookup` over this node's own levels only (RAM, in flight, disk)."""
        self.view.sync()
        page = self.fp.page_tokens if self.cfg.page_resume else None
        best: tuple[str, Match] | None = None
        ram = self.ram.cache.index.lookup(self.root, prompt, media, page_tokens=page)
        pending = self.outbox.lookup(prompt, media, page)
        for source, m in (("ram", ram), ("pending", pending),
                          ("disk", self.view.lookup(prompt, media, page))):  # fmt: skip
            if m is not None and (best is None or m.length > best[1].length):
                best = (source, m)
        return best

    def restore(self, prompt: npt.NDArray[np.integer] | list[int],
                out: npt.NDArray[np.uint8] | Destination,
                media: Mapping[int, bytes] | None = None, max_tokens: int | None = None,
                lock: AbstractContextManager[Any] = UNLOCKED) -> Restored:  # fmt: skip
        """Restore the deepest stored prefix of ``prompt`` (and its ``media``, as in
        :meth:`lookup`) into ``out``: a flat buffer in the stored page layout (at least
        ``len(prompt) * token_bytes``) or a :class:`~stratastore.restore.Destination`; returns
        how many tokens it holds now (at most ``max_tokens``, when given)."""
        got = self.restore_many([(prompt, out)], [media], [max_tokens], lock)[0]
        if isinstance(got, Exception):
            raise got
        return got

    def restore_many(
        self, requests: Sequence[tuple[npt.NDArray[np.integer] | list[int],
                                       npt.NDArray[np.uint8] | Destination]],
        media: Sequence[Mapping[int, bytes] | None] = (),
        max_tokens: Sequence[int | None] = (),
        lock: AbstractContextManager[Any] = UNLOCKED,
        *,
        use_remote: bool = True,
        fallback: bool = True,
    ) -> list[Restored | Exception]:  # fmt: skip
        """:meth:`restore` for several prompts at once, each into its own destination: the
        lookups and RAM hits run in order, then the disk hits share one batched read agenda
        (:mod:`stratastore.restore.agenda`). Returns, per request, its :class:`Restored` or the
        error that request alone raised. A destination too small, or one that cannot be written
        in place, raises :class:`~stratastore.restore.DestinationRefused` before anything runs.
        ``media[i]``, when given, is request ``i``'s pictures (see :meth:`lookup`);
        ``max_tokens[i]``, when given and not ``None``, caps how many tokens request ``i``
        restores (the deepest resume point at or below it).

        ``lock`` (the Store's) is held to plan (lookups, RAM hits, the jobs) and to account,
        never over the copy of an in-flight capture, the disk reads or the hashing, so restores
        on several threads run in parallel (issue 14). What the disk writer moves or removes
        meanwhile is met as another process's move or removal would be (issue 12). The remote
        level is walked, without ``lock``, only for the requests the local levels do not hold
        whole (:meth:`lookup_here`; ``use_remote=False``: not at all); a restore from it that
        delivers less than the local levels hold (a part evicted, the server gone mid-read) is
        done again from the local levels (``fallback=False``: not), and the deeper of the two
        is returned (:meth:`_redo_locally`)."""
        with lock:
            ask = [use_remote and self.lookup_here(prompt, media[i] if i < len(media) else None,
                                                   _cap(max_tokens, i))[1]
                   for i, (prompt, _) in enumerate(requests)]  # fmt: skip
        walked = [self.find_remote(prompt if (c := _cap(max_tokens, i)) is None else prompt[:c],
                                   media[i] if i < len(media) else None) if ask[i] else None
                  for i, (prompt, _) in enumerate(requests)]  # fmt: skip
        local: dict[int, int] = {}  #: a remote job -> the tokens the local levels hold
        asked: dict[int, str] = {}  #: a remote job -> what asked for it (its messages say)
        with lock:
            dests = self._destinations(requests, max_tokens)
            results: list[Restored | Exception] = [Restored("none", 0)] * len(requests)
            captures: list[tuple[int, Snapshot, Match]] = []
            pending: list[tuple[int, DiskConv, Job]] = []
            remote: dict[int, RemoteHit] = {}  #: the pending jobs that read the remote level
            for i, ((prompt, _), dest) in enumerate(zip(requests, dests, strict=True)):
                cap = max_tokens[i] if i < len(max_tokens) else None
                here = self._lookup_local(prompt if cap is None else prompt[:cap],
                                          media[i] if i < len(media) else None)  # fmt: skip
                hit = _deeper(here, walked[i])
                if hit is None:
                    self.counters["restore_misses"] += 1
                    continue
                source, m = hit
                if source not in ("disk", "remote"):  # a hybrid model resumes at a state
                    states = (self.ram.states(m.conv_id) if source == "ram"
                              else self.outbox.capture(m.conv_id).states)  # fmt: skip
                    at = _at_a_state(m, states)
                    if at is None:
                        self.counters["restore_misses"] += 1
                        continue
                    m = at
                if source == "ram":
                    state = self.ram.restore(m, dest)
                    self.counters["hits_ram"] += 1
                    self.counters["tokens_restored"] += m.length
                    results[i] = Restored("ram", m.length, m.conv_id, state)
                elif source == "pending":  # the snapshot stays valid once its write finished
                    captures.append((i, self.outbox.capture(m.conv_id), m))
                else:
                    p = self.admission.admit(m.length * self.tb, stays_in_ram=False, disk=True)
                    rhit = walked[i] if source == "remote" else None
                    dc = rhit.dc if rhit is not None else self.view.get(m.conv_id)
                    if p.where == "discard" or dc is None:
                        self.counters["disk_hits_refused"] += 1
                        if p.where == "discard":
                            self._log_admission(p, "disk hit", f"conversation {m.conv_id}, "
                                                f"{m.length:,} tokens re-read")  # fmt: skip
                        continue
                    self._log_admission(p, "disk hit", f"conversation {m.conv_id}, "
                                        f"{m.length:,} tokens")  # fmt: skip
                    if source == "remote" and rhit is not None:
                        remote[len(pending)] = rhit
                        local[len(pending)] = here[1].length if here and fallback else 0
                        asked[len(pending)] = (f"conversation {here[1].conv_id}" if here else
                                               f"a prompt of {len(prompt):,} tokens")  # fmt: skip
                    pending.append((i, dc, self.reader.job(dc, m.length, dest)))
        for i, snap, m in captures:
            deliver_capture(dests[i], snap.kv, snap.conv.boundaries(), m.length, self.fp)
            results[i] = Restored("pending", m.length, m.conv_id, snap.states.get(m.length))
        outcomes = restore_batch([job for _, _, job in pending])
        found = [o if isinstance(o, Exception) else self.reader.resume_state(dc, job, o)
                 for (_, dc, job), o in zip(pending, outcomes, strict=True)]  # fmt: skip
        with lock:
            for *_, m in captures:
                self.counters["hits_pending"] += 1
                self.counters["tokens_restored"] += m.length
            again: dict[int, tuple[DiskConv, Outcome | Exception, Restored | Exception]] = {}
            damage: list[_Damage] = []  #: settled after the lock (network calls)
            for n, ((i, dc, job), o, r) in enumerate(zip(pending, outcomes, found, strict=True)):
                if n in remote and local[n] > _delivered(r):  # redone below, from the local
                    again[n] = (dc, o, r)
                    if isinstance(o, Outcome) and (bad := RemoteLevel.suspects(dc, o)):
                        damage.append((bad, o, asked[n], True))  # (said by fell_short)
                elif isinstance(r, Exception) or isinstance(o, Exception):
                    results[i] = r
                elif n in remote:
                    results[i] = self._account_remote(dc, o, r, asked[n], damage)
                else:
                    results[i] = self.reader.account_restored(dc, job, o, r, self._removed_from(dc))
        for bad, o, caller, said in damage:  # network calls: without the lock
            assert self.remote is not None
            self.remote.settle_damage(bad, o, caller, said)
        for n, (dc, o, r) in again.items():
            results[pending[n][0]] = self._redo_locally(
                requests, media, max_tokens, pending[n][0], pending[n][2].dest, dc, o, r, lock
            )
        for n, rhit in remote.items():  # remote_keep_local: the validated prefix, written here
            got = results[pending[n][0]]
            if n not in again and isinstance(got, Restored) and got.tokens:
                self._keep_local(rhit, got.tokens, pending[n][2].dest, lock)
        return results

    def _redo_locally(
        self, requests: Sequence[tuple[Any, Any]], media: Sequence[Mapping[int, bytes] | None],
        max_tokens: Sequence[int | None], i: int, dest: Destination, dc: DiskConv,
        o: Outcome | Exception, r: Restored | Exception, lock: AbstractContextManager[Any],
    ) -> Restored | Exception:  # fmt: skip
        """Request ``i``'s restore from the remote level delivered less than the local levels
        hold (``r``): done again from them; where that delivers less still (damaged there
        too), from the remote level again, with no fallback. Whatever an earlier pass left
        past the prefix returned is zeroed (the destinations that can zero)."""
        assert self.remote is not None
        one = ([requests[i]], [media[i] if i < len(media) else None], [_cap(max_tokens, i)])
        redo = self.restore_many(*one, lock, use_remote=False)[0]
        if _delivered(redo) >= _delivered(r):
            self.remote.fell_short(dc, o, r, _delivered(redo))
            return redo
        final = self.restore_many(*one, lock, fallback=False)[0]
        past = max(_delivered(r), _delivered(redo))
        zero = getattr(dest, "zero", None)
        if _delivered(final) < past and zero is not None:
            zero(_delivered(final), past - _delivered(final))
        return final

    def _account_remote(
        self, dc: DiskConv, o: Outcome, r: Restored, caller: str, damage: list[_Damage]
    ) -> Restored:
        """Count a finished restore from the remote level (under the Store's lock); the
        segments it found damaged go on ``damage``, settled after the lock."""
        assert self.remote is not None
        self.counters["hits_remote"] += 1
        self.counters["tokens_restored"] += r.tokens
        if bad := self.remote.restored(dc, o, caller):
            damage.append((bad, o, caller, False))
        return Restored("remote", r.tokens, r.conv_id, r.state)

    def _keep_local(self, hit: RemoteHit, tokens: int, dest: Destination,
                    lock: AbstractContextManager[Any]) -> None:  # fmt: skip
        """``remote_keep_local``: write the first ``tokens`` of a remote restore to the local
        levels (through the spill writer when the Store has one), taken from the destination
        when it is host memory in the stored layout (validated there), else read again."""
        assert self.remote is not None
        if not self.remote.settings.keep_local or self.writer is None:
            return
        snap: Snapshot | None = None
        if isinstance(dest, FlatKV) and not hit.dc.state_keys:
            snap = self.remote.fetch(hit, tokens, dest.buf[: tokens * self.tb].copy())
        else:
            snap = self.remote.fetch(hit, tokens)
        if snap is None:
            return
        with lock:
            try:
                self._spill(snap)  # counted as it lands, or as it is refused
            except StrataError as e:
                self.remote.counters["remote_kept_local_errors"] += 1
                self.warn(f"{hit.dc.conv.conv_id} (read from the remote level) not kept "
                          f"locally: {e}")  # fmt: skip

    def _removed_from(self, dc: DiskConv) -> Callable[[bytes], bool]:
        """Whether segment ``key`` of ``dc`` was removed by GC (in this process or another)
        since the restore was planned: no level holds it, and the conversation's chain no
        longer names it (removed, or cut before it). Under the Store's lock."""

        def removed(key: bytes) -> bool:
            if self.holder(key) is not None:
                return False
            self.view.sync()
            now = self.view.get(dc.conv.conv_id)
            return now is None or all(k != key for _, _, k in now.segments)

        return removed

    def _destinations(self, requests: Sequence[tuple[Any, Any]],
                      max_tokens: Sequence[int | None]) -> list[Destination]:  # fmt: skip
        """Each request's destination, refused before any lookup or take when it cannot be
        written in place or cannot hold the whole prompt (``max_tokens`` of it, when capped)."""
        dests = []
        for i, (prompt, out) in enumerate(requests):
            what = "out" if len(requests) == 1 else f"out #{i}"
            dest = as_destination(self.fp, out, what)
            cap = max_tokens[i] if i < len(max_tokens) else None
            need = len(prompt) if cap is None else min(len(prompt), cap)
            if dest.capacity() < need:
                room = ("all of them" if need == len(prompt)
                        else f"{need:,} of them (max_tokens={cap:,})")  # fmt: skip
                raise DestinationRefused(
                    f"restore: the destination holds {dest.capacity():,} tokens ({what}); a prompt "
                    f"of {len(prompt):,} tokens needs room for {room} "
                    f"({need * self.tb:,} bytes, {self.tb} a token); pass one that large"
                )
            dests.append(dest)
        return dests

    # -- sessions (explicit save/load: never removed by GC) -----------------------------------
    def save_session(self, snap: Snapshot, lock: AbstractContextManager[Any] = UNLOCKED
                     ) -> None:  # fmt: skip
        """Save a session: checked and admitted under ``lock``, written (durably) and the
        levels' budgets enforced without it (:class:`~.sessions.Sessions`)."""
        self.sessions.save(snap, lock)
        for lvl in self.levels:
            lvl.enforce_budget()

    def load_session(self, name: str, out: npt.NDArray[np.uint8],
                     lock: AbstractContextManager[Any] = UNLOCKED) -> Conversation:  # fmt: skip
        return self.sessions.load(name, out, lock)

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

    def _held_tokens(self) -> int:
        """Tokens a restore could bring back now, each conversation counted once (a RAM entry
        mirrored on disk is one conversation; seed 000's ``held_tokens``): its RAM entry, its
        park in flight or its disk chain, whichever is deeper, the disk chain only up to the
        first segment a restore found damaged or missing (what the ladder would stop at)."""
        held = {cid: len(e.conv.tokens) for cid, e in self.ram.entries.items()}
        for cid, snap in self.outbox.newest():  # a park whose write is in flight restores too
            held[cid] = max(held.get(cid, 0), len(snap.conv.tokens))
        bad = set(self.damaged)
        for cid, dc in self.view.convs.items():
            n = len(dc.conv.tokens)
            if bad:
                n = next((s for s, _, k in dc.segments if k in bad), n)
            held[cid] = max(held.get(cid, 0), n)
        return sum(held.values())

    def stats(self) -> dict[str, Any]:
        levels: dict[str, Any] = {"ram": self.ram.stats()}
        for lvl in self.levels:
            levels[lvl.name] = {"dir": lvl.store.path, "entries": len(lvl.store),
                                "bytes": lvl.store.used(), "budget": lvl.budget,
                                **lvl.counters.as_dict()}  # fmt: skip
        if self.remote is not None:
            levels["remote"] = {**self.remote.stats(), **self.remote.counters}
        self.view.sync()
        gc = {"gc_removed": self.gc.removed, "gc_cut": self.gc.cut} if self.gc else {}
        return {"park_target": self.target, "park_target_source": self.target_source,
                **self.counters, "evict_spills": self.ram.evict_spills, **gc,
                "held_tokens": self._held_tokens(),
                "admission": self.last_admission,
                "damaged_segments": [k.hex() for k in self.damaged],
                "unreadable_manifests": [n for n, _ in self.skipped_manifests],
                "free_ram": self.admission.probe(), "levels": levels}  # fmt: skip
