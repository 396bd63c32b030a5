"""Reading a conversation back from the disk levels: the two-pass restore of its prefix (spec
F-SC-3; every page validated in the memory it is delivered from, the ladder on damage), its
running state, and the accounting of what was read (level hits, ladder restores, damaged keys
for fsck)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stratastore.config import StoreConfig
from stratastore.errors import StrataError
from stratastore.format import Kind, ModelFingerprint
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.cascade import DiskLevel
from stratastore.levels.reader import get_checked_bytes
from stratastore.metrics.counts import Counts
from stratastore.restore import Destination, Job, Outcome, Piece
from stratastore.tiers.admission import MIB
from stratastore.tiers.records import MAX_STATE_BYTES, Restored
from stratastore.tiers.view import DiskConv

__all__ = ["DiskReader"]

_COUNTS = (
    "hits_disk",
    "tokens_restored",
    "restore_misses",
    "ladder_restores",
    "restores_cut_by_gc",
)


class DiskReader:
    def __init__(
        self,
        cfg: StoreConfig,
        fp: ModelFingerprint,
        levels: Sequence[DiskLevel],
        holder: Callable[[bytes], SegmentBackend | None],
        warn: Callable[[str], None],
    ) -> None:
        self.cfg = cfg
        self.fp = fp
        self.levels = levels
        self.holder = holder
        #: its own counts: the hits and the ladder of the reads it accounts, and the misses of
        #: a source that reads through it (the system-prompt cache)
        self.counts = Counts("flow", _COUNTS)
        self.warn = warn
        self.damaged: list[bytes] = []  #: segment keys a restore found damaged (for fsck)

    def _here(self, key: bytes) -> SegmentBackend | None:
        """The level among this reader's own that holds segment ``key`` (no network call)."""
        return next((lvl.store for lvl in self.levels if key in lvl.store), None)

    def job(self, dc: DiskConv, length: int, dest: Destination) -> Job:
        """The two-pass restore of ``[0, length)`` (spec F-SC-3): validate every page first,
        then apply; on damage the ladder applies the deepest resume point below it. Planned
        under the flow's lock: each segment is placed in the reader's own levels; one none of
        them holds (the remote level's, one moved or removed meanwhile) is located by
        ``holder`` when the job reads it, without the lock (a network call for the remote
        level)."""
        pieces = [Piece(s, e, k, self._here(k)) for s, e, k in dc.segments if s < length]
        return Job(
            pieces,
            length,
            dest,
            self.fp,
            self._ladder_point(dc),
            self.cfg.ladder,
            self.cfg.restore_chunk_mib * MIB,
            self.holder,
        )

    def resume_state(self, dc: DiskConv, job: Job, out: Outcome) -> Restored:
        """Where a finished disk restore resumes, and its running state: a hybrid model
        resumes only where a readable state was saved (past it the destination is zeroed).
        Reads the state (I/O); accounts nothing (:meth:`account_restored`)."""
        got, state = out.tokens, None
        if dc.state_keys:
            got, state = self._state_at_or_below(dc, got)
            zero = getattr(job.dest, "zero", None)
            if got < out.tokens and callable(zero):  # past what is delivered: old or zero
                zero(got, out.tokens - got)
        return Restored("disk", got, dc.conv.conv_id, state)

    def account_restored(
        self,
        dc: DiskConv,
        job: Job,
        out: Outcome,
        r: Restored,
        removed: Callable[[bytes], bool] | None = None,
    ) -> Restored:
        """Count a finished disk restore (the caller serialises this: no I/O here);
        ``removed`` as in :meth:`account`."""
        self.account(dc, job, out, removed)
        self.counts["hits_disk"] += 1
        self.counts["tokens_restored"] += r.tokens
        return r

    def account(
        self, dc: DiskConv, job: Job, out: Outcome, removed: Callable[[bytes], bool] | None = None
    ) -> None:
        """Level hits, and the ladder: count it, warn, remember the damaged keys for fsck.
        ``removed(key)``: the segment the restore stopped at was removed by GC meanwhile (no
        level holds it and no chain names it now): a miss past what was delivered, not damage
        (GC runs beside restores, as another process's always could)."""
        for lvl in self.levels:  # a level counts a hit for each restore it served
            if any(p.store is lvl.store and p.start < out.tokens for p in job.pieces):
                lvl.counters.hits += 1
        if out.laddered and removed is not None and out.damaged and all(map(removed, out.damaged)):
            self.counts["restores_cut_by_gc"] += 1
            return
        if out.laddered:
            self.counts["ladder_restores"] += 1
            self.damaged.extend(k for k in out.damaged if k not in self.damaged)
            self.warn(
                f"conversation {dc.conv.conv_id}: restored {out.tokens:,} of "
                f"{out.wanted:,} tokens: {out.reason}"
            )

    def _state_at_or_below(self, dc: DiskConv, limit: int) -> tuple[int, bytes | None]:
        """The deepest checkpoint at or below ``limit`` whose saved state reads back valid."""
        for length in sorted(dc.state_keys, reverse=True):
            if length > limit:
                continue
            store = self.holder(dc.state_keys[length])
            if store is None:
                continue
            try:
                blob = get_checked_bytes(  # the answer checked above the seam: F-READ-1
                    store,
                    dc.state_keys[length],
                    self.fp,
                    max_bytes=MAX_STATE_BYTES,
                    kind=Kind.STATE,
                    tokens=(length, length),
                )
            except StrataError:
                continue
            return length, blob
        return 0, None

    def _ladder_point(self, dc: DiskConv) -> Callable[[int], int]:
        """The deepest point a restore may stop at below damage at token ``bad``: a whole page
        for attention-only layouts (``page_resume``), else the deepest checkpoint."""

        def resume_at(bad: int) -> int:
            ckpt = max((c.length for c in dc.conv.checkpoints if c.length <= bad), default=0)
            if self.cfg.page_resume:
                return max(ckpt, dc.conv.page_floor(bad, self.fp.page_tokens))
            return ckpt

        return resume_at
