"""Restore: the deepest stored prefix of each prompt, copied into its destination.

A restore is planned and accounted under the flow's lock, and does its copies, reads and
hashing without it, so restores on several threads run in parallel and none waits on a disk
write. One pass over a batch of requests:

1. *ask* (only with a remote level): under the lock, the local sources
   (:class:`~.lookup.Lookup`); the remote level is walked, without the lock, only for the
   requests the local sources do not hold whole;
2. *plan*: under the lock, each destination is checked (refused before anything runs when it
   cannot be written in place or cannot hold the prompt), the deepest hit among the sources
   chosen, and its source plans the restore (:class:`~.lookup.Step`): a RAM hit is copied
   now, a park in flight is a copy, a disk or remote hit a two-pass job (spec F-SC-3);
3. *copy and read*: without the lock, the captures are copied and the jobs share one batched
   read agenda (:mod:`stratastore.restore.agenda`), every page validated;
4. *account*: under the lock, each source settles what it delivered.

A restore takes the flow's lock twice (ask and plan in one hold, account) unless the remote
level is walked: then a third time, to plan after the walk. What a restore from the remote
level keeps locally (``remote_keep_local``) is submitted to the write queue as a park's writes
are.

The fallback is an order of sources: a restore from the remote level that delivers less than
the local sources hold (a part evicted, the server gone mid-read) is done again from the local
sources alone, and, where that delivers less still (damaged there too), from all of them once
more with no fallback (:meth:`Restorer._fall_back`). What a destination holds past the prefix
returned is zeroed (the destinations that can zero). What disk writes move or remove meanwhile
is met as another process's move or removal would be.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stratastore.errors import StrataError
from stratastore.format import ModelFingerprint
from stratastore.metrics.counts import Counts
from stratastore.restore import (
    Destination,
    DestinationRefused,
    FlatKV,
    Outcome,
    SharedAgenda,
    as_destination,
    deliver_capture,
    restore_batch,
)
from stratastore.tiers.context import FlowContext
from stratastore.tiers.lookup import Copy, Delivered, Hit, Lookup, Prompt, Read, deepest
from stratastore.tiers.records import Restored, Snapshot
from stratastore.tiers.remote import RemoteHit
from stratastore.tiers.sources import RemoteSource
from stratastore.tiers.write_queue import WriteQueue

__all__ = ["Restorer", "destinations"]

#: a request: its prompt and where it lands (a flat buffer in the stored layout, or a destination)
Request = tuple[Prompt, Any]
Media = Sequence[Mapping[int, bytes] | None]
Caps = Sequence[int | None]
#: remote segments a restore found damaged: (keys, its outcome, what asked, already said)
_Damage = tuple[list[bytes], Outcome, str, bool]


def _delivered(r: Restored | Exception) -> int:
    """The tokens a restore's result delivered (an error: none)."""
    return r.tokens if isinstance(r, Restored) else 0


def _at(seq: Sequence[Any], i: int) -> Any:
    """``seq[i]``, or ``None`` past its end (``media`` and ``max_tokens`` may be short)."""
    return seq[i] if i < len(seq) else None


def destinations(
    fp: ModelFingerprint, requests: Sequence[Request], caps: Caps
) -> list[Destination]:
    """Each request's destination, refused before any lookup or take when it cannot be
    written in place or cannot hold the whole prompt (``caps[i]`` of it, when capped)."""
    tb = fp.token_bytes
    dests = []
    for i, (prompt, out) in enumerate(requests):
        what = "out" if len(requests) == 1 else f"out #{i}"
        dest = as_destination(fp, out, what)
        cap = _at(caps, i)
        need = len(prompt) if cap is None else min(len(prompt), cap)
        if dest.capacity() < need:
            room = (
                "all of them" if need == len(prompt) else f"{need:,} of them (max_tokens={cap:,})"
            )
            raise DestinationRefused(
                f"restore: the destination holds {dest.capacity():,} tokens ({what}); a prompt "
                f"of {len(prompt):,} tokens needs room for {room} "
                f"({need * tb:,} bytes, {tb} a token); pass one that large"
            )
        dests.append(dest)
    return dests


@dataclass
class _Pass:
    """One pass over a batch: per request its result, the reads it planned, the remote reads
    that fell short of the local sources (``again``: to fall back) and what asked for each."""

    results: list[Restored | Exception]
    reads: list[tuple[int, Read]] = field(default_factory=list)
    remote: dict[int, str] = field(default_factory=dict)  #: a remote read -> what asked
    again: dict[int, tuple[Outcome | Exception, Restored | Exception]] = field(default_factory=dict)


class Restorer:
    """The restore flow over the sources of a :class:`~.lookup.Lookup` (see the module).
    ``keep(snap)``: hand a snapshot to the disk writer as a park would (``remote_keep_local``),
    ``None`` without a disk level."""

    def __init__(
        self,
        ctx: FlowContext,
        lookup: Lookup,
        remote: RemoteSource | None,
        keep: Callable[[Snapshot], bool] | None,
        writes: WriteQueue,
    ) -> None:
        self.lock, self.fp, self.lookup, self.remote = ctx.lock, ctx.fp, lookup, remote
        self.keep, self.writes, self.warn = keep, writes, ctx.warn
        #: its own counts: the restores it copies from parks in flight, and the misses
        self.counts = Counts("flow", ("hits_pending", "tokens_restored", "restore_misses"))
        #: the continuous agenda every thread's restores join (``batch_agenda``), else None:
        #: each restore reads on its own pipeline
        self.agenda = SharedAgenda() if ctx.cfg.batch_agenda else None

    def restore_many(
        self, requests: Sequence[Request], media: Media = (), caps: Caps = ()
    ) -> list[Restored | Exception]:
        """Per request, its :class:`Restored` or the error that request alone raised; a
        destination refused raises :class:`~stratastore.restore.DestinationRefused` before
        anything runs. ``media[i]``: request ``i``'s pictures; ``caps[i]``: at most that many
        tokens restored (the deepest resume point at or below it)."""
        p = self._pass(requests, media, caps, self.remote, fallback=True)
        for n, (o, r) in p.again.items():
            i, read = p.reads[n]
            p.results[i] = self._fall_back((requests[i], _at(media, i), _at(caps, i)), read, o, r)
        self._keep_local(p)
        return p.results

    def _run(
        self,
        request: tuple[Request, Mapping[int, bytes] | None, int | None],
        remote: RemoteSource | None,
    ) -> Restored | Exception:
        """One request, one pass over the local sources and ``remote``, with no fallback."""
        req, pictures, cap = request
        p = self._pass([req], [pictures], [cap], remote, fallback=False)
        self._keep_local(p)
        return p.results[0]

    def _fall_back(
        self,
        request: tuple[Request, Mapping[int, bytes] | None, int | None],
        read: Read,
        o: Outcome | Exception,
        r: Restored | Exception,
    ) -> Restored | Exception:
        """A restore from the remote level delivered less (``r``) than the local sources hold:
        done again from the local sources alone; where that delivers less still, from all the
        sources with no fallback. Whatever an earlier pass left past the prefix returned is
        zeroed (the destinations that can zero)."""
        assert self.remote is not None
        local = self._run(request, None)
        if _delivered(local) >= _delivered(r):
            self.remote.level.fell_short(read.dc, o, r, _delivered(local))
            return local
        final = self._run(request, self.remote)
        past = max(_delivered(r), _delivered(local))
        zero = getattr(read.job.dest, "zero", None)
        if _delivered(final) < past and zero is not None:
            zero(_delivered(final), past - _delivered(final))
        return final

    def _pass(
        self,
        requests: Sequence[Request],
        media: Media,
        caps: Caps,
        remote: RemoteSource | None,
        *,
        fallback: bool,
    ) -> _Pass:
        """Ask, plan, copy and read, account (see the module); ``remote``: the remote level's
        source, or ``None`` to ask the local sources alone; ``fallback``: a remote read that
        falls short of the local sources goes to :attr:`_Pass.again`."""
        capped = [
            prompt if (c := _at(caps, i)) is None else prompt[:c]
            for i, (prompt, _) in enumerate(requests)
        ]
        walked: list[Hit | None] = [None] * len(requests)
        with self.lock:
            ask = [  # (only with a remote level: no lock taken for one that is not there)
                remote is not None
                and self.lookup.worth_asking(
                    prompt, self.lookup.here(capped[i], _at(media, i)), _at(caps, i)
                )
                for i, (prompt, _) in enumerate(requests)
            ]
            if not any(ask):  # held here, or no remote level: planned in the same hold
                p, copies, floors = self._plan(
                    requests, media, caps, capped, walked, remote, fallback
                )
        if any(ask):
            assert remote is not None
            walked = [  # network calls: without the lock
                remote.deepest(capped[i], _at(media, i)) if ask[i] else None
                for i in range(len(requests))
            ]
            with self.lock:
                p, copies, floors = self._plan(
                    requests, media, caps, capped, walked, remote, fallback
                )
        for i, c in copies:  # the capture stays valid once its write finished
            deliver_capture(
                c.dest, c.capture.kv, c.capture.conv.boundaries(), c.match.length, self.fp
            )
            p.results[i] = Restored(
                "pending", c.match.length, c.match.conv_id, c.capture.states.get(c.match.length)
            )
        jobs = [read.job for _, read in p.reads]
        outcomes = restore_batch(jobs, shared=self.agenda)
        found = [
            o if isinstance(o, Exception) else read.source.resume(read, o)
            for (_, read), o in zip(p.reads, outcomes, strict=True)
        ]
        damage = self._account(p, copies, outcomes, found, floors)
        for bad, o, caller, said in damage:  # network calls: without the lock
            assert self.remote is not None
            self.remote.level.settle_damage(bad, o, caller, said)
        return p

    def _plan(
        self,
        requests: Sequence[Request],
        media: Media,
        caps: Caps,
        capped: list[Prompt],
        walked: list[Hit | None],
        remote: RemoteSource | None,
        fallback: bool,
    ) -> tuple[_Pass, list[tuple[int, Copy]], dict[int, int]]:
        """Plan a pass under the lock: every destination checked (refused before anything
        runs), each request's deepest hit among the local sources and the remote level's walk
        (``walked``), and its source's plan. Returns the pass, the captures to copy, and for
        each remote read the tokens the local sources hold (its fallback's floor)."""
        dests = destinations(self.fp, requests, caps)
        p = _Pass([Restored("none", 0)] * len(requests))
        copies: list[tuple[int, Copy]] = []
        floors: dict[int, int] = {}  #: a remote read -> the tokens the local sources hold
        for i, ((prompt, _), dest) in enumerate(zip(requests, dests, strict=True)):
            here = self.lookup.here(capped[i], _at(media, i))
            hit = deepest((here, walked[i]))
            if hit is None:
                self.counts["restore_misses"] += 1
                continue
            step = hit.source.restore(hit, dest)
            if isinstance(step, Delivered):
                p.results[i] = step.result
            elif isinstance(step, Copy):
                copies.append((i, step))
            elif isinstance(step, Read):
                if step.source is remote:
                    floors[len(p.reads)] = here.length if here and fallback else 0
                    p.remote[len(p.reads)] = (
                        f"conversation {here.match.conv_id}"
                        if here
                        else f"a prompt of {len(prompt):,} tokens"
                    )
                p.reads.append((i, step))
        return p, copies, floors

    def _account(
        self,
        p: _Pass,
        copies: list[tuple[int, Copy]],
        outcomes: list[Outcome | Exception],
        found: list[Restored | Exception],
        floors: dict[int, int],
    ) -> list[_Damage]:
        """Settle a pass under the lock: the copies counted, each read settled by its source
        or, a remote read short of the local sources, kept for the fallback. Returns the
        remote segments found damaged, settled after the lock."""
        damage: list[_Damage] = []
        with self.lock:
            for _, c in copies:
                self.counts["hits_pending"] += 1
                self.counts["tokens_restored"] += c.match.length
            for n, ((i, read), o, r) in enumerate(zip(p.reads, outcomes, found, strict=True)):
                if n in floors and floors[n] > _delivered(r):  # done again, from the local
                    p.again[n] = (o, r)
                    if isinstance(o, Outcome) and (bad := self._suspects(read, o)):
                        damage.append((bad, o, p.remote[n], True))  # (said by fell_short)
                elif isinstance(r, Exception) or isinstance(o, Exception):
                    p.results[i] = r
                else:
                    p.results[i], bad = read.source.settle(read, o, r, p.remote.get(n, ""))
                    if bad:
                        damage.append((bad, o, p.remote[n], False))
        return damage

    def _suspects(self, read: Read, o: Outcome) -> list[bytes]:
        """The segments of a remote read whose stored bytes ``o`` found wrong."""
        assert self.remote is not None
        return self.remote.level.suspects(read.dc, o)

    def _keep_local(self, p: _Pass) -> None:
        """``remote_keep_local``: each remote read that delivered a prefix (and was not done
        again) is written to the local levels, taken from the destination when it is host
        memory in the stored layout (validated there), else read again."""
        if self.remote is None or not self.remote.level.settings.keep_local or self.keep is None:
            return
        level, tb = self.remote.level, self.fp.token_bytes
        try:
            for n in p.remote:
                i, read = p.reads[n]
                got = p.results[i]
                if n in p.again or not isinstance(got, Restored) or not got.tokens:
                    continue
                hit, dest = RemoteHit(read.dc, read.hit.match), read.job.dest
                if isinstance(dest, FlatKV) and not read.dc.state_keys:
                    snap = level.fetch(hit, got.tokens, dest.buf[: got.tokens * tb].copy())
                else:
                    snap = level.fetch(hit, got.tokens)
                if snap is None:
                    continue
                with self.lock:
                    try:
                        self.keep(snap)  # counted as it lands, or as it is refused
                    except StrataError as e:
                        level.count("remote_kept_local_errors")
                        cid = read.dc.conv.conv_id
                        self.warn(f"{cid} (read from the remote level) not kept locally: {e}")
        finally:  # handed to the write queue as a park's writes are, even when a later copy
            # fails (interrupted, they wait in the outbox for the next flush or close)
            self.writes.submit()
