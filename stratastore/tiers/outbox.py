"""The spill outbox: acknowledged parks waiting for the Store's spill writer to write them down.

A park handed to the outbox is checked first against what the disk levels can take beside the
writes already waiting (:meth:`DiskWriter.refusal`), so that one the disk is certain to refuse
is reported a discard at once rather than ``disk`` (issue 11 item 9); the bytes it will take are
reserved until it is written or refused. What the check cannot foresee is reported by the
writer (``SpillError`` from ``flush``/``close``)."""

from __future__ import annotations

from .records import Snapshot
from .writer import DiskWriter

__all__ = ["Outbox"]


class Outbox:
    def __init__(self) -> None:
        self._waiting: list[Snapshot] = []
        self._bytes = 0  #: bytes reserved for the snapshots not written yet
        self._ids: dict[str, int] = {}  #: their conversation ids (how many of each)

    def __contains__(self, conv_id: object) -> bool:
        """Whether a park of ``conv_id`` waits for its disk write (taken or not)."""
        return conv_id in self._ids

    def offer(self, snap: Snapshot, writer: DiskWriter, reject: bool) -> str | None:
        """Queue ``snap`` with its bytes reserved; why not, when the levels will refuse it."""
        need = writer.refusal(snap, self._bytes, reject)
        if isinstance(need, str):
            return need
        snap.pending = need
        self._bytes += need
        self._ids[snap.conv.conv_id] = self._ids.get(snap.conv.conv_id, 0) + 1
        self._waiting.append(snap)
        return None

    def take(self) -> list[Snapshot]:
        """The snapshots queued since the last take (for the spill writer)."""
        out, self._waiting = self._waiting, []
        return out

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
