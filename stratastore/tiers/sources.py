"""The restore sources (:class:`~.lookup.Source`): the RAM level, the parks in flight, the disk
levels and the shared remote level, each finding its deepest resume point for a prompt and
planning the restore of it.

* :class:`RamSource` copies out of the arena while it plans (a restore of the whole of an
  unpinned entry takes it out: the slot owns it now).
* :class:`PendingSource` serves a park whose disk write is still in flight from its capture in
  memory, copied without the lock (read your own writes without waiting for them).
* :class:`DiskSource` reads through the two-pass job (spec F-SC-3: every page validated in the
  memory it is delivered from, the ladder on damage), admitted as a disk-bound read first.
* :class:`RemoteSource` is a disk-like source whose conversation comes from the remote level's
  walk (spec F-KEY-2: each segment's key derived from the prompt's own tokens); it is asked
  without the lock, and is the last in the order.

A hybrid model's capture in memory (one parked with running states) resumes only at a
checkpoint with a state (:func:`at_a_state`); a disk read finds its state as it resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from stratastore.chain import Match
from stratastore.levels.backend import SegmentBackend
from stratastore.metrics.counts import Counts
from stratastore.metrics.logs import Voice
from stratastore.restore import Destination, Outcome
from stratastore.tiers.admission import Admission, log_admission
from stratastore.tiers.disk_read import DiskReader
from stratastore.tiers.lookup import Copy, Delivered, Hit, Prompt, Read, SourceName
from stratastore.tiers.outbox import Outbox
from stratastore.tiers.ram import RamLevel
from stratastore.tiers.records import Restored
from stratastore.tiers.remote import RemoteLevel
from stratastore.tiers.view import DiskConv, DiskView

__all__ = [
    "DiskSource",
    "PendingSource",
    "RamSource",
    "RemoteSource",
    "at_a_state",
    "read_admitted",
    "removed_by_gc",
]


def at_a_state(m: Match, states: Mapping[int, bytes]) -> Match | None:
    """A hit on a capture in memory, for a hybrid model (one that saved running states): moved
    down to the deepest checkpoint with a state, as the disk path does (``None``: none below
    it). An attention-only capture (no states) resumes where it matched."""
    if not states or m.length in states:
        return m
    below = max((n for n in states if n <= m.length), default=0)
    return dataclasses.replace(m, length=below, via="checkpoint") if below else None


def read_admitted(
    admission: Admission, warn: Voice, hit: str, subject: str, nbytes: int, held: object
) -> bool:
    """Whether a disk-bound read of ``nbytes`` goes ahead: admitted under either RAM floor
    (the transient floor serves a read that only passes through RAM; said when it does), and
    what it reads still ``held`` (not ``None``). A read no floor admits is said (``<hit> ...:
    <subject> re-read``); the caller counts the refusal."""
    p = admission.admit(nbytes, stays_in_ram=False, disk=True)
    if p.where == "discard":
        log_admission(warn, p, hit, f"{subject} re-read")
        return False
    if held is None:
        return False
    log_admission(warn, p, hit, subject)
    return True


def removed_by_gc(
    view: DiskView, holder: Callable[[bytes], SegmentBackend | None], dc: DiskConv
) -> Callable[[bytes], bool]:
    """Whether segment ``key`` of ``dc`` was removed by GC (in this process or another) since
    its restore was planned: no level (``holder``) holds it, and the conversation's chain in
    ``view`` no longer names it (removed, or cut before it). Under the flow's lock."""

    def removed(key: bytes) -> bool:
        if holder(key) is not None:
            return False
        view.sync()
        now = view.get(dc.conv.conv_id)
        return now is None or all(k != key for _, _, k in now.segments)

    return removed


class RamSource:
    """The RAM level's parked captures (its cache's lookup tree)."""

    name: SourceName = "ram"

    def __init__(self, ram: RamLevel, root: bytes, page: int | None) -> None:
        self.ram, self.root, self.page = ram, root, page
        self.counts = Counts("flow", ("hits_ram", "tokens_restored", "restore_misses"))

    def deepest(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        m = self.ram.cache.index.lookup(self.root, prompt, media, page_tokens=self.page)
        return None if m is None else Hit(self, m)

    def restore(self, hit: Hit, dest: Destination) -> Delivered | None:
        """Copied now, out of the arena (under the lock: the entry may be taken out)."""
        m = at_a_state(hit.match, self.ram.states(hit.match.conv_id))
        if m is None:
            self.counts["restore_misses"] += 1
            return None
        state = self.ram.restore(m, dest)
        self.counts["hits_ram"] += 1
        self.counts["tokens_restored"] += m.length
        return Delivered(Restored("ram", m.length, m.conv_id, state))


class PendingSource:
    """The newest capture of each park waiting for its disk write (the outbox)."""

    name: SourceName = "pending"

    def __init__(self, outbox: Outbox, page: int | None) -> None:
        self.outbox, self.page = outbox, page
        self.counts = Counts("flow", ("restore_misses",))

    def deepest(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        m = self.outbox.lookup(prompt, media, self.page)
        return None if m is None else Hit(self, m)

    def restore(self, hit: Hit, dest: Destination) -> Copy | None:
        """The capture, copied without the lock (it stays valid once its write finished)."""
        capture = self.outbox.capture(hit.match.conv_id)
        m = at_a_state(hit.match, capture.states)
        if m is None:
            self.counts["restore_misses"] += 1
            return None
        return Copy(self, dest, capture, m)


class DiskSource:
    """The disk levels, through this process's view of the shared catalog."""

    name: SourceName = "disk"

    def __init__(
        self,
        view: DiskView,
        reader: DiskReader,
        admission: Admission,
        token_bytes: int,
        page: int | None,
        holder: Callable[[bytes], SegmentBackend | None],
        warn: Voice,
    ) -> None:
        self.view, self.reader, self.admission = view, reader, admission
        self.tb, self.page = token_bytes, page
        self.holder, self.warn = holder, warn
        self.counts = Counts("flow", ("disk_hits_refused",))

    def deepest(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        self.view.sync()
        m = self.view.lookup(prompt, media, self.page)
        return None if m is None else Hit(self, m)

    def conversation(self, hit: Hit) -> DiskConv | None:
        """The conversation ``hit`` reads, as the catalog holds it now."""
        return self.view.get(hit.match.conv_id)

    def restore(self, hit: Hit, dest: Destination) -> Read | None:
        """A disk-bound read, admitted under either RAM floor (the transient floor serves a read
        that only passes through RAM); refused (counted) when neither holds, or when the
        conversation is gone."""
        m = hit.match
        dc = self.conversation(hit)
        if not read_admitted(
            self.admission, self.warn, self.hit_name, self.subject(m), m.length * self.tb, dc
        ):
            self.refused()
            return None
        assert dc is not None
        return Read(self, hit, dc, self.reader.job(dc, m.length, dest))

    #: how the admission's log line names a hit of this source
    hit_name = "disk hit"

    def subject(self, m: Match) -> str:
        """What the admission's log line says a hit reads."""
        return f"conversation {m.conv_id}, {m.length:,} tokens"

    def refused(self) -> None:
        """Count a hit that no RAM floor admitted (or whose conversation is gone)."""
        self.counts["disk_hits_refused"] += 1

    def resume(self, read: Read, outcome: Outcome) -> Restored:
        """Where a finished read resumes, and its running state (I/O: without the lock)."""
        return self.reader.resume_state(read.dc, read.job, outcome)

    def settle(
        self, read: Read, outcome: Outcome, found: Restored, asked: str
    ) -> tuple[Restored, list[bytes]]:
        """Level hits, the ladder (damaged keys kept for fsck) or a cut by GC, and the hit."""
        r = self.reader.account_restored(
            read.dc, read.job, outcome, found, self._removed_from(read.dc)
        )
        return r, []

    def _removed_from(self, dc: DiskConv) -> Callable[[bytes], bool]:
        return removed_by_gc(self.view, self.holder, dc)


class RemoteSource(DiskSource):
    """The shared remote level: found by its walk, read as a disk level is (spec F-REM)."""

    name: SourceName = "remote"

    def __init__(self, level: RemoteLevel, disk: DiskSource) -> None:
        super().__init__(
            disk.view,
            disk.reader,
            disk.admission,
            disk.tb,
            disk.page,
            disk.holder,
            disk.warn,
        )
        self.level = level
        self.counts = Counts("flow", ("disk_hits_refused", "hits_remote", "tokens_restored"))

    def deepest(self, prompt: Prompt, media: Mapping[int, bytes] | None) -> Hit | None:
        """The remote level's walk (network calls: without the lock); a failure is a miss."""
        found = self.level.lookup(np.asarray(prompt), media)
        return None if found is None else Hit(self, found.match, found.dc)

    def conversation(self, hit: Hit) -> DiskConv | None:
        return hit.dc

    def settle(
        self, read: Read, outcome: Outcome, found: Restored, asked: str
    ) -> tuple[Restored, list[bytes]]:
        """Counted as a remote hit; a ladder stop there is not local damage (the segments whose
        bytes looked wrong are returned, settled after the lock)."""
        self.counts["hits_remote"] += 1
        self.counts["tokens_restored"] += found.tokens
        bad = self.level.restored(read.dc, outcome, asked)
        return Restored("remote", found.tokens, found.conv_id, found.state), bad
