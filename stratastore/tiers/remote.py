"""The shared remote level in the flow: what a park sends to it, how a prompt is found in it,
what a restore from it keeps locally.

The remote level (a :class:`~stratastore.levels.backend.SharedBackend`, opened from its
settings by the level that owns them) is shared by every node; it is not in the local cascade
(no local level degrades into it, and no node's catalog GC deletes from it: another node's
chains name its segments). What it holds is a copy:

* **push**: after a conversation is written to the local disk levels (acknowledged, durable
  there), its K/V segments and running states the remote level lacks are put there, hashed
  from the bytes sent (never digests of another copy). A segment another node stored is not
  stored twice (content keys). A failure is counted and said, never raised: the park stands
  on the local levels.
* **find**: a prompt the local levels do not hold whole is walked through the remote level's
  chain index from the fingerprint's root: at each step the children of the prefix, each
  checked by deriving its key from the prompt's own tokens (spec F-KEY-2), so a match is never
  a guess. Whole segments only (and, for a hybrid model, ends with a saved state).
* **restore** reads through the ordinary two-pass job (every page validated in the memory it is
  delivered from; the ladder on a bad page, a missing part or a dropped connection). With
  ``remote_keep_local`` the validated prefix is then written to the local levels as a
  conversation of its own (``remote:<key>``), so the next restore is local.
* **faults**: a call that fails opens a breaker: for a while (1 s, doubling to 30 s) the level
  is skipped (``remote_skipped``), so a dead server costs one timeout, not one per call.
* **budget** (``remote_eviction=store``): after each push, the oldest segments go until the
  level is within ``remote_mib``; with ``redis``, the server's ``maxmemory`` policy evicts.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stratastore.chain import Checkpoint, Conversation, Match
from stratastore.errors import ConfigError, StrataError
from stratastore.format import Kind, ModelFingerprint, segment_key
from stratastore.format.keys import segment_media, state_key
from stratastore.io.errors import StrataIOError
from stratastore.levels.backend import SharedBackend, SharedSettings
from stratastore.levels.reader import copy_validated, get_checked_bytes, open_checked
from stratastore.metrics.counters import counter_keys
from stratastore.metrics.counts import Counts
from stratastore.restore.two_pass import Outcome
from stratastore.tiers.records import MAX_STATE_BYTES, Restored, Snapshot
from stratastore.tiers.view import DiskConv

__all__ = ["REMOTE_COUNTERS", "RemoteHit", "RemoteLevel"]

MAX_NODES = 65536  #: stored segments a walk meets at most
_BACKOFF = (1.0, 30.0)  #: the breaker's first and longest pause, seconds

#: the level's counters (``Store.stats()["levels"]["remote"]``, the monitor, Prometheus): the
#: counter table's rows the remote level keeps
REMOTE_COUNTERS = counter_keys("remote level")


@dataclass
class RemoteHit:
    """A prompt's prefix found in the remote level: the chain as a disk conversation (its
    segments, a checkpoint at each segment's end, its saved states) and the match."""

    dc: DiskConv
    match: Match


class RemoteLevel:
    """The shared level as the flow uses it (see the module): ``backend`` (opened from its spec
    by :func:`~stratastore.levels.registry.open_level`; its ``settings`` say how the flow
    treats it) for model ``fp``. Connects at once: a refused password or TLS setting is a
    :class:`~stratastore.errors.ConfigError` now; a server that is down opens the breaker."""

    def __init__(
        self, backend: SharedBackend, fp: ModelFingerprint, warn: Callable[[str], None]
    ) -> None:
        self.settings: SharedSettings = backend.settings
        self.fp = fp
        self.root = fp.digest()
        self.warn = warn
        self.store = backend
        self.counters = Counts("remote level")
        #: the counters are counted from several threads (a restore's, the writer's): theirs
        self._counting = threading.Lock()
        self._down_until = 0.0
        self._pause = _BACKOFF[0]
        self.last_error = ""
        try:  # a wrong password or TLS setting is the user's to fix now; a server down is not
            self.store.connect()
        except StrataIOError as e:
            if e.errno == errno.EACCES:  # authentication or TLS refused
                self.store.close()
                raise ConfigError(f"the remote level {self.settings.shown}: {e}") from None
            self._failed(e, "connect")
        else:  # (a server that will never evict what the settings leave to it, say)
            for line in self.store.open_warnings():
                self.warn(line)

    def count(self, key: str, n: int = 1) -> None:
        """Count on the level's counters (from any thread: under their own lock)."""
        with self._counting:
            self.counters[key] += n

    @property
    def name(self) -> str:
        return "remote"

    def close(self) -> None:
        self.store.close()

    # -- the breaker --------------------------------------------------------------------------
    def _usable(self) -> bool:
        if time.monotonic() < self._down_until:
            self.count("remote_skipped")
            return False
        return True

    def _failed(self, e: StrataError, what: str) -> None:
        self.count("remote_errors")
        self.last_error = str(e)
        first = time.monotonic() >= self._down_until
        self._down_until = time.monotonic() + self._pause
        if first:
            self.warn(
                f"the remote level {self.settings.shown} failed ({what}): {e}; it is "
                f"skipped for {self._pause:.0f} s, the local levels serve meanwhile"
            )
        self._pause = min(self._pause * 2, _BACKOFF[1])

    def _ok(self) -> None:
        self._pause = _BACKOFF[0]

    def holds(self, key: bytes) -> bool:
        """Whether the level holds segment ``key`` now; False while the breaker is open, and
        on a failure (which opens it): a dead server costs one timeout, not one per call."""
        if not self._usable():
            return False
        try:
            return key in self.store
        except StrataIOError as e:
            self._failed(e, "lookup")
            return False

    # -- push ---------------------------------------------------------------------------------
    def push(self, snap: Snapshot) -> int:
        """Put ``snap``'s segments and states the remote level lacks (see the module): its
        pages hashed as they are written (or the device's digests of these bytes, a park from
        device memory). Returns how many were stored; never raises (counted, said)."""
        if not self._usable():
            return 0
        conv, tb, stored = snap.conv, self.fp.token_bytes, 0
        try:
            specs = conv.segment_keys(self.root)
            ends = {s.end: s.key for s in specs}
            for seg in specs:
                if seg.key in self.store:
                    continue
                hashes = snap.page_hashes.get((seg.start, seg.end))
                got = self.store.put_kv(
                    seg.parent,
                    conv.tokens[seg.start : seg.end],
                    snap.kv[seg.start * tb : seg.end * tb],
                    token_start=seg.start,
                    media=seg.media,
                    page_hashes=hashes,
                )
                stored += got.created
            for n, blob in sorted(snap.states.items()):
                if n in ends and blob and state_key(ends[n]) not in self.store:
                    stored += self.store.put_state(ends[n], blob, token_pos=n).created
            self.enforce_budget()
        except StrataIOError as e:
            self.count("remote_puts", stored)  # the segments stored before the failure
            self.count("remote_put_errors")
            self._failed(e, f"storing conversation {conv.conv_id}")
            return stored
        except Exception as e:  # a refusal, damage in the namespace, a bug: said, and the park
            # stands locally (it was acknowledged there; this is only the copy)
            self.count("remote_puts", stored)
            self.count("remote_put_errors")
            what = str(e) if isinstance(e, StrataError) else f"{type(e).__name__}: {e}"
            self.warn(f"conversation {conv.conv_id} not copied to the remote level: {what}")
            return stored
        self._ok()
        self.count("remote_puts", stored)
        return stored

    def enforce_budget(self) -> None:
        """``remote_eviction=store``: delete the oldest segments until the level is within
        ``remote_mib`` (every node does this; a delete of what another node deleted first is a
        no-op). A chain that loses a segment is restored up to it (the ladder)."""
        budget = self.settings.budget_bytes
        if self.settings.eviction != "store" or not budget:
            return
        while self.store.used() > budget:
            gone = False
            for key, _ in self.store.oldest():
                gone = self.store.delete(key)
                self.count("remote_evictions", gone)
                break
            if not gone and self.store.used() > budget:
                return

    # -- find ---------------------------------------------------------------------------------
    def lookup(
        self, prompt: npt.NDArray[np.integer], media: Mapping[int, bytes] | None
    ) -> RemoteHit | None:
        """The deepest whole-segment prefix of ``prompt`` the remote level holds (see the
        module), or None; a remote failure is a miss (counted). Its round trips take one
        deadline (``remote_timeout_ms``) together, whatever the server does."""
        if not self._usable():
            return None
        try:
            with self.store.deadline(self.settings.timeout_s):  # the whole walk: one deadline
                hit = self._walk(prompt, sorted((media or {}).items()))
        except StrataIOError as e:
            self._failed(e, "lookup")
            return None
        except StrataError as e:  # damage in the namespace (fsck --remote): a miss, said
            self.count("remote_misses")
            self.warn(f"the remote level {self.settings.shown}: lookup: {e}")
            return None
        self._ok()
        if hit is None:
            self.count("remote_misses")
            return None
        self.count("remote_hits")
        return hit

    def _walk(
        self, prompt: npt.NDArray[np.integer], media: list[tuple[int, bytes]]
    ) -> RemoteHit | None:
        """Every stored segment on a path of ``prompt`` from the root, level by level (one
        round trip a level): a child counts only where its key is the one derived from the
        prompt's own tokens (and pictures) after its parent. Content keys make this a tree
        (a key names its whole prefix), so each node is met once; the deepest node wins, or,
        where running states are saved (a hybrid model), the deepest node with a state."""
        found: dict[bytes, tuple[int, int, bytes]] = {}  #: key -> (start, end, parent)
        level = [(self.root, 0)]
        while level and len(found) < MAX_NODES:
            nxt = []
            kids = self.store.children_many([k for k, _ in level])
            for (parent, pos), children in zip(level, kids, strict=True):
                ends = {e for key, st, e in children if st == pos and pos < e <= len(prompt)}
                keys = {key for key, _, _ in children}
                for end in sorted(ends, reverse=True):
                    derived = segment_key(parent, prompt[pos:end], segment_media(media, pos, end))
                    if derived in keys and derived not in found and len(found) < MAX_NODES:
                        found[derived] = (pos, end, parent)
                        nxt.append((derived, end))
            level = nxt
        if not found:
            return None
        states = self._states(list(found))
        tip = max((k for k in found if not states or k in states), key=lambda k: found[k][1])
        segments: list[tuple[int, int, bytes]] = []
        at = tip
        while at != self.root:
            start, end, parent = found[at]
            segments.append((start, end, at))
            at = parent
        segments.reverse()
        length = segments[-1][1]
        on_path = {e: states[k] for _, e, k in segments if k in states}
        tokens = np.asarray(prompt[:length])
        conv = Conversation(
            f"remote:{segments[-1][2].hex()[:32]}",
            tokens,
            [Checkpoint(e) for _, e, _ in segments],
            {p: d for p, d in media if p < length},
            [s for s, _, _ in segments],
        )
        dc = DiskConv(conv, segments, False, on_path)
        return RemoteHit(dc, Match(conv.conv_id, length, length, "checkpoint"))

    def _states(self, keys: list[bytes]) -> dict[bytes, bytes]:
        """The segments of ``keys`` whose end has a running state saved in the remote level:
        segment key -> the state's key (one round trip)."""
        skeys = [state_key(k) for k in keys]
        there = self.store.contains_many(skeys)
        return {k: sk for k, sk, n in zip(keys, skeys, there, strict=True) if n}

    # -- after a restore ------------------------------------------------------------------------
    def restored(self, dc: DiskConv, o: Outcome, caller: str) -> list[bytes]:
        """A restore from this level finished (``caller``: what asked, for the messages): a
        ladder stop there (a bad page, a part evicted, a dropped connection) is counted, and is
        not local damage for fsck. Returns the segments whose stored bytes looked wrong, for
        :meth:`settle_damage` after the Store's lock (network calls); a stop for any other
        reason is said now. No network call."""
        if not o.laddered:
            return []
        self.count("remote_ladder_stops")
        bad = self.suspects(dc, o)
        if not bad:
            self.warn(f"{self._restored(o, caller)}: {o.reason}")
        return bad

    @staticmethod
    def suspects(dc: DiskConv, o: Outcome) -> list[bytes]:
        """The segments of ``dc`` (read from this level) whose stored bytes ``o`` found wrong."""
        held = {k for _, _, k in dc.segments}
        return [k for k in o.corrupt if k in held]

    def _restored(self, o: Outcome, caller: str) -> str:
        return (
            f"{caller} (remote level): restored {o.tokens:,} of {o.wanted:,} tokens from "
            f"{self.settings.shown}"
        )

    def settle_damage(self, keys: list[bytes], o: Outcome, caller: str, said: bool) -> None:
        """The segments a restore found damaged (:meth:`restored`), each checked again and,
        damaged, removed (:meth:`drop_damaged`): said once, with what asked, so that no node
        reads it again; one that reads whole now is said as a ladder stop (unless ``said``
        already). Without the Store's lock."""
        for key in keys:
            if self.drop_damaged(key):
                self.warn(
                    f"{self._restored(o, caller)}: its segment {key.hex()[:16]} is damaged "
                    f"there ({o.reason}); it is removed, so no node reads it again (a "
                    "node holding it locally puts it back with its next park)"
                )
            elif not said:
                self.warn(f"{self._restored(o, caller)}: {o.reason}")

    def drop_damaged(self, key: bytes) -> bool:
        """Segment ``key``, which a restore found damaged, read again and checked (every page,
        bounded reads: a failed read judges nothing) and, when its bytes are wrong, deleted
        under the commit protocol (spec F-REM-3: only the write read here). Counted once; True
        when it was damaged and is gone now."""
        from stratastore.format import ChecksumMismatch, FormatError, NotAuthenticated

        try:
            with self.store.open_reader(key) as seg:
                damaged = seg.first_bad_page() >= 0
        except NotAuthenticated:  # keyed by a key this node lacks, or planted: never deleted
            return False  # here (a node a rotation has not reached must not delete; F-KEYED-4)
        except (FormatError, ChecksumMismatch):
            damaged = True
        except StrataError:  # gone already, or the server failed: nothing judged
            return False
        if not damaged:
            return False
        try:
            self.store.delete(key)
        except StrataError as e:
            self.warn(
                f"the remote level {self.settings.shown}: segment {key.hex()[:16]} is "
                f"damaged and could not be removed ({e}); strata fsck --remote --repair "
                "removes it"
            )
            return False
        self.count("remote_damaged")
        return True

    def fell_short(
        self, dc: DiskConv, o: Outcome | Exception, r: Restored | Exception, here: int
    ) -> None:
        """A restore from this level delivered less than the ``here`` tokens the local levels
        hold (the caller does it again from them): said and counted as a ladder stop."""
        self.count("remote_ladder_stops")
        got = r.tokens if isinstance(r, Restored) else 0
        why = (o.reason or "a shallower resume point") if isinstance(o, Outcome) else str(o)
        self.warn(
            f"conversation {dc.conv.conv_id} (remote level): restored {got:,} tokens "
            f"({why}); restoring the {here:,} the local levels hold instead"
        )

    def fetch(
        self, hit: RemoteHit, tokens: int, kv: npt.NDArray[np.uint8] | None = None
    ) -> Snapshot | None:
        """The first ``tokens`` of ``hit`` as a snapshot (what ``remote_keep_local`` writes
        locally): ``kv`` when given (those bytes, validated by the restore that delivered
        them), else read again from the remote level, validated; None when that read fails
        (evicted, damaged, the server gone: counted, said)."""
        dc = hit.dc
        tb = self.fp.token_bytes
        states: dict[int, bytes] = {}
        try:
            if kv is None:  # each answer checked above the seam first (spec F-READ-1)
                kv = np.empty(tokens * tb, np.uint8)
                for s, e, key in dc.segments:
                    if s >= tokens:
                        break
                    with open_checked(self.store, key, self.fp, kind=Kind.KV, tokens=(s, e)) as seg:
                        copy_validated(seg, kv[s * tb : e * tb].data, True)
            if tokens in dc.state_keys:
                states[tokens] = get_checked_bytes(
                    self.store,
                    dc.state_keys[tokens],
                    self.fp,
                    max_bytes=MAX_STATE_BYTES,
                    kind=Kind.STATE,
                    tokens=(tokens, tokens),
                )
        except StrataError as e:
            self.count("remote_kept_local_errors")
            if isinstance(e, StrataIOError):
                self._failed(e, "keeping a restore locally")
            else:
                self.warn(f"{dc.conv.conv_id} (read from the remote level) not kept locally: {e}")
            return None
        c = dc.conv
        segs = [(s, e) for s, e, _ in dc.segments if e <= tokens]
        if not segs:  # (a restore delivers whole segments: nothing to keep)
            return None
        conv = Conversation(
            c.conv_id,
            c.tokens[:tokens],
            [Checkpoint(e) for _, e in segs],  # none at 0: no resume point
            {p: d for p, d in c.media.items() if p < tokens},
            [s for s, _ in segs] or [0],
        )
        return Snapshot(conv, kv, states, kept=True)

    def stats(self) -> dict[str, object]:
        """The level's figures for ``Store.stats()['levels']['remote']`` (no credentials)."""
        out: dict[str, object] = {
            "dir": self.settings.shown,
            "namespace": self.store.ns,
            "eviction": self.settings.eviction,
            "budget": self.settings.budget_bytes,
        }
        out.update((f"backend_{k}", v) for k, v in self.store.counters.items())
        if time.monotonic() >= self._down_until:  # (a stats call is not a skipped call)
            try:
                out.update(entries=len(self.store), bytes=self.store.used())
            except StrataIOError as e:
                self._failed(e, "stats")
            except StrataError as e:  # damage in the namespace (fsck --remote says what)
                out["problem"] = str(e)
        if "entries" not in out:
            out.update(entries=None, bytes=None)
        return out
