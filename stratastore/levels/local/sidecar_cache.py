"""The checked sidecars of a directory level's segments, kept in memory by key, so that a read of
a segment this process wrote or read before opens its data file without reading its sidecar
again (a tier's loads: one read a chunk, where the sidecar's own was a second small read in
the way of every cold one).

Contract:

- An entry is a sidecar checked as a read checks one (spec F-READ-1: its fields, model and key;
  F-KEYED: the level's key) or written by this process, with the index record it was committed
  under (spec F-IDX-2). It is used only while the index lists that same record for the key: a
  segment deleted, written again (by this process or another on the same directory) or adopted
  has another record (its ``sealed_at_ns``, the writer's clock in nanoseconds, and its sizes),
  so a stale entry is never used. (Two writes of one key with equal sizes in the same
  nanosecond of a clock set back between them would share a record; the removal of a damaged
  copy, spec F-DUR-7, rests on the same record.)
- Validation does not change: the pages are still hashed in the memory they are delivered to,
  against these digests (F-SC-3), and the data file's header is still checked against the
  sidecar (F-SEG-2). A sidecar damaged on disk since it was read is found by fsck, never by a
  read that does not read it; a data file damaged since fails its digests as before.
- Bounded: at most :data:`MAX_ENTRIES` entries and :data:`MAX_BYTES` of sidecars (their size on
  disk), the least recently used dropped first. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from stratastore.format import IndexRecord, Sidecar

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "SidecarCache"]

#: sidecars kept at most (a 2 MiB chunk a sidecar: 32 GiB of chunks; a chunk's sidecar, 320
#: bytes on disk, takes about 900 bytes of memory kept)
MAX_ENTRIES = 16_384
MAX_BYTES = 16 << 20  #: their size on disk, at most


class SidecarCache:
    """Checked sidecars by key, each with the index record it belongs to (module docstring)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._entries: OrderedDict[bytes, tuple[IndexRecord, Sidecar]] = OrderedDict()
        self._bytes = 0
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def get(self, key: bytes, record: IndexRecord) -> Sidecar | None:
        """The sidecar kept for ``key`` when it was kept under ``record``, else None."""
        with self._lock:
            got = self._entries.get(key)
            if got is None or got[0] != record:
                return None
            self._entries.move_to_end(key)
            return got[1]

    def put(self, key: bytes, record: IndexRecord, sidecar: Sidecar) -> None:
        """Keep ``sidecar`` (checked, or written by this process) as the one of ``record``."""
        if record.sidecar_bytes > self._max_bytes:
            return
        with self._lock:
            self._pop(key)
            self._entries[key] = (record, sidecar)
            self._bytes += record.sidecar_bytes
            while len(self._entries) > self._max_entries or self._bytes > self._max_bytes:
                self._pop(next(iter(self._entries)))

    def drop(self, key: bytes) -> None:
        """Forget ``key`` (its segment deleted)."""
        with self._lock:
            self._pop(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _pop(self, key: bytes) -> None:
        got = self._entries.pop(key, None)
        if got is not None:
            self._bytes -= got[0].sidecar_bytes
