"""The apply pass of a two-pass restore (:mod:`.two_pass`): validated chunks into the
destination, and the prefix the outcome reports settled.

A :class:`Delivery` takes one job's read pass in token order. Every applied page was validated
(spec F-SC-3; DESIGN "Delivered means validated": the bytes hashed are the bytes delivered). A
destination that can ``zero`` (every one of :mod:`.destinations`) gets each chunk as it
validates, and what turns out to lie past the prefix (a ladder stop, or damage with
``ladder=False``) is zeroed before :meth:`Delivery.finish` returns; one that cannot gets a
chunk only once it lies below ``resume_at`` of the validated frontier, and holds the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from stratastore.errors import StrataError
from stratastore.levels.staging import STAGING
from stratastore.restore.records import Chunk, Damage, Outcome, RestoreFailed

if TYPE_CHECKING:
    from stratastore.restore.two_pass import Job

__all__ = ["Delivery", "release"]


def release(job: Job, chunk: Chunk, keep: int = 0) -> None:
    """Give ``chunk``'s staging back, and zero what a direct read placed from token ``keep`` on
    (the tokens the restore does not deliver)."""
    if chunk.staging is not None:
        (chunk.pool or STAGING).give(chunk.staging)
    chunk.staging = chunk.data = None
    lo = max(chunk.lo, keep)
    end = chunk.lo + chunk.placed
    direct = job.direct()
    if direct is not None and lo < end:
        direct.zero(lo, end - lo)
    chunk.placed = 0


class Delivery:
    """The apply side of one job: takes its chunks in order and applies each as soon as it is
    validated, when the destination can ``zero`` what turns out to lie past the prefix (every
    destination of :mod:`.destinations`); a destination that cannot gets a chunk only once no later
    damage can take it back (below ``resume_at`` of the validated frontier, ladder on), and
    holds the others. :meth:`finish` settles the prefix the outcome reports. ``eager=False``
    holds everything until :meth:`finish` (the whole prefix validated first)."""

    def __init__(self, job: Job, *, eager: bool = True) -> None:
        self.job = job
        self.out = Outcome(0, job.wanted)
        zero = getattr(job.dest, "zero", None)
        self.zero: Callable[[int, int], None] | None = zero if callable(zero) else None
        self.eager = eager
        self.held: list[Chunk] = []
        self.applied = 0  #: tokens [0, applied) are in the destination, validated

    def take(self, item: Chunk | Damage) -> None:
        """One item of the job's read pass, in order. A chunk is applied, or held until it is
        safe to; the copy's error (the destination's own) is raised."""
        out = self.out
        if isinstance(item, Damage):
            out.first_bad, out.reason = item.at, item.reason
            out.damaged.append(item.key)
            if item.corrupt:
                out.corrupt.append(item.key)
            return
        out.read_s += item.read_s
        self.held.append(item)
        if not self.eager:
            return
        if self.zero is not None:
            safe = item.hi  # what ends up past the prefix is zeroed by finish
        elif self.job.ladder:
            safe = min(self.job.resume_at(item.hi), item.hi)
        else:
            return
        self._apply(min(safe, out.wanted), whole=True)

    def finish(self) -> Outcome:
        """Settle the prefix: everything wanted, or, after damage, the tokens below
        ``resume_at(first_bad)`` (the ladder; ``ladder=False`` raises :class:`RestoreFailed`
        and delivers nothing), cut to a whole page of its segment. What was written past it
        (by an apply, or a direct read) is zeroed before this returns."""
        out = self.out
        try:
            limit = out.wanted
            if out.first_bad is not None:
                if not self.job.ladder:
                    raise RestoreFailed(
                        f"restore stopped at token {out.first_bad:,}: {out.reason}; nothing was "
                        "delivered (turn the ladder on to restore the valid prefix)"
                    )
                limit = min(self.job.resume_at(out.first_bad), out.first_bad)
            out.tokens = self._cut(limit)
            if self.zero is None and self.applied > out.tokens:
                raise StrataError(
                    f"restore: resume_at({out.first_bad}) = {limit} lies below token "
                    f"{self.applied:,}, already applied to a destination that cannot zero what "
                    "it holds: resume_at must be non-decreasing (or give the destination a "
                    "zero(token_start, n_tokens) method)"
                )
            self._apply(out.tokens, whole=False)
        except BaseException:
            self.abort()
            raise
        self._release(out.tokens)
        return out

    def abort(self) -> None:
        """Deliver nothing (a failure: the restore raises): release what is held and zero
        what was written."""
        self.out.tokens = 0
        self._release(0)

    def _cut(self, limit: int) -> int:
        """``limit`` down to a whole page of the segment it falls in (a partial page is not
        laid out as a prefix), unless it is that segment's end."""
        pt = self.job.fp.page_tokens
        for p in self.job.pieces:
            if p.start <= limit < p.end:
                return limit - (limit - p.start) % pt
        return limit

    def _release(self, keep: int) -> None:
        """Give back the held chunks' staging and zero everything written from token ``keep``
        on (by an apply, or placed by a direct read; a destination without ``zero`` keeps
        it: only a failure or a ``resume_at`` that decreased get there). Every chunk is
        released even when a zero fails; the first failure is raised after."""
        held, self.held = self.held, []
        applied, self.applied = self.applied, min(self.applied, keep)
        error: BaseException | None = None
        for c in held:
            try:
                release(self.job, c, keep)
            except BaseException as e:
                error = error or e
        if applied > keep and self.zero is not None:
            try:
                self.zero(keep, applied - keep)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _apply(self, upto: int, *, whole: bool) -> None:
        """Write the held chunks' tokens below ``upto`` into the destination, in order; with
        ``whole``, only the chunks that lie below it entirely."""
        while self.held:
            c = self.held[0]
            n = min(c.hi, upto) - c.lo
            if n <= 0 or (whole and n < c.hi - c.lo):
                return
            self.applied = max(self.applied, c.lo + n)  # before the copy: a failed one is
            if c.data is not None:  # zeroed too
                t0 = time.perf_counter()
                try:
                    self.job.write(c, n)
                finally:
                    self.out.apply_s += time.perf_counter() - t0
            if n < c.hi - c.lo:
                return  # the prefix ends inside this chunk: finish releases the rest
            self.held.pop(0)
            release(self.job, c, c.hi)
