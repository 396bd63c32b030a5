"""The spill outbox: acknowledged parks waiting for the Store's spill writer to write them down.

A park handed to the outbox is checked first against what the disk levels can take beside the
writes already waiting (:meth:`DiskWriter.refusal`), so that one the disk is certain to refuse
is reported a discard at once rather than ``disk``; the bytes it will take are
reserved until it is written or refused. What the check cannot foresee is reported by the
writer (``SpillError`` from ``flush``/``close``).

A park waiting here is also readable (read your own writes without a flush): the
outbox indexes the newest waiting capture of each conversation by its prompt prefix, so a
restore of that conversation is served from the capture in memory, and a restore of any other
conversation never waits for these writes.

Everything here is guarded by the flow's lock, except the list of writes waiting for a
hand-over, which has a lock of its own (a leaf: nothing else is taken under it), so that the
write queue's hand-over takes them without the flow's lock."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from stratastore.chain import Match, PrefixIndex
from stratastore.tiers.records import Snapshot
from stratastore.tiers.writer import DiskWriter

__all__ = ["Outbox"]


class Outbox:
    def __init__(self, model: bytes) -> None:
        self._waiting: list[Snapshot] = []  #: offered, not taken by a hand-over yet
        self._waiting_lock = threading.Lock()  #: guards ``_waiting`` alone
        self._bytes = 0  #: bytes reserved for the snapshots not written yet
        self._ids: dict[str, int] = {}  #: their conversation ids (how many of each)
        self._model = model
        self._index = PrefixIndex()  #: the newest waiting capture of each conversation
        self._newest: dict[str, Snapshot] = {}

    @property
    def reserved(self) -> int:
        """The bytes reserved in the disk levels for the writes not landed yet."""
        return self._bytes

    @property
    def waiting(self) -> int:
        """How many writes wait for the writer thread to take them (a peek)."""
        return len(self._waiting)

    def __contains__(self, conv_id: object) -> bool:
        """Whether a park of ``conv_id`` waits for its disk write (taken or not)."""
        return conv_id in self._ids

    def offer(self, snap: Snapshot, writer: DiskWriter, reject: bool) -> str | None:
        """Queue ``snap`` with its bytes reserved; why not, when the levels will refuse it."""
        need = writer.refusal(snap, self._bytes, reject)
        if isinstance(need, str):
            return need
        snap.pending = need
        with self._waiting_lock:  # first: whatever stops this call after, it is written
            self._waiting.append(snap)
        self._bytes += need
        self._ids[snap.conv.conv_id] = self._ids.get(snap.conv.conv_id, 0) + 1
        self._index.add(self._model, snap.conv)  # replaces an older capture of the same id
        self._newest[snap.conv.conv_id] = snap
        return None

    def reserve(self, snap: Snapshot, writer: DiskWriter, reject: bool) -> str | None:
        """Reserve the bytes of a park written outside the outbox (streamed within its call,
        :meth:`.park.Parking.write_streamed`) beside the writes waiting, as :meth:`offer`
        does; why not, when the levels will refuse it. :meth:`landed` and :meth:`release`
        give the bytes back."""
        need = writer.refusal(snap, self._bytes, reject)
        if isinstance(need, str):
            return need
        snap.pending = need
        self._bytes += need
        return None

    def release(self, snap: Snapshot) -> None:
        """What is left of ``snap``'s reservation (:meth:`reserve`): its write ended."""
        self._bytes = max(0, self._bytes - snap.pending)
        snap.pending = 0

    def lookup(
        self,
        prompt: npt.NDArray[np.integer] | list[int],
        media: Mapping[int, bytes] | None,
        page_tokens: int | None,
    ) -> Match | None:
        """The deepest resume point for ``prompt`` among the captures waiting to be written
        (the same rules as every level: checkpoints, or whole pages with ``page_tokens``)."""
        return self._index.lookup(self._model, prompt, media, page_tokens=page_tokens)

    def newest(self) -> list[tuple[str, Snapshot]]:
        """The newest waiting capture of each conversation (what :meth:`lookup` can hit)."""
        return list(self._newest.items())

    def capture(self, conv_id: str) -> Snapshot:
        """The newest waiting capture of ``conv_id`` (a :meth:`lookup` hit names it). The
        caller reads it under the same lock that serialises :meth:`done`; the snapshot object
        stays valid after its write finished (it is only unindexed)."""
        return self._newest[conv_id]

    def take(self, n: int | None = None) -> list[Snapshot]:
        """The ``n`` oldest snapshots offered and not taken yet (all of them with ``None``):
        what the write queue's thread writes next; needs only the list's own lock."""
        with self._waiting_lock:
            if n is None:
                out, self._waiting = self._waiting, []
            else:
                out, self._waiting = self._waiting[:n], self._waiting[n:]
        return out

    def landed(self, snap: Snapshot, nbytes: int) -> None:
        """Part of ``snap``'s write landed in a level (which counts those bytes now): release
        that much of its reservation, so nothing is counted twice while the rest is written."""
        n = min(nbytes, snap.pending)
        snap.pending -= n
        self._bytes = max(0, self._bytes - n)

    def done(self, snap: Snapshot) -> None:
        """``snap``'s write finished (written or refused): release its reservation."""
        self._bytes = max(0, self._bytes - snap.pending)
        snap.pending = 0
        cid = snap.conv.conv_id
        left = self._ids.get(cid, 0) - 1
        if left > 0:
            self._ids[cid] = left
        else:
            self._ids.pop(cid, None)
        if self._newest.get(cid) is snap:  # an older capture finishing keeps the newer indexed
            del self._newest[cid]
            self._index.remove(cid)
