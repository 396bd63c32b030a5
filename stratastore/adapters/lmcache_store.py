"""The chunks of the LMCache plugin in one stratastore segment directory: durable puts under a
byte budget with oldest-first eviction, pins, validated reads, counters (no lmcache or torch
import; :mod:`stratastore.adapters.lmcache` is the LMCache side).

A chunk is addressed by its **chunk id** (:func:`~stratastore.adapters.lmcache_chunks.chunk_id`
of its LMCache key) and stored as the running-state segment ``state_key(chunk id)`` of a
:class:`~stratastore.store.SegmentStore` (spec F-KEY-5): the store's durable put protocol
(F-DUR: data file written and fsynced, renamed in, directory fsynced, sidecar written durably,
indexed), its LMDB index rebuilt from the sidecars at open (F-IDX), BLAKE3 per page (F-SC-3).

- **Budget**: before a put, the oldest chunks (``SegmentStore.oldest``: the index's age table,
  by seal time) are deleted until the store's bytes (data files and sidecars, what
  ``SegmentStore.used`` counts) plus the puts in flight plus this one fit ``budget_bytes``;
  pinned chunks and the layout record are never evicted. A put that cannot fit is refused.
- **Reads** deliver a chunk only after every page was hashed in the memory it is delivered
  from (read straight into the memory object, hashed there); a chunk that fails (damage, a
  foreign or truncated file) is a miss, counted in ``damaged``, logged, and deleted, so lookups
  stop finding it and the next put of that chunk writes it again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import StrataError
from ..format import DATA_OFFSET, Codec, FormatError, Level, ModelFingerprint
from ..format.keys import state_key
from ..format.sidecar import SIDECAR_HEAD, TRAILER_BYTES
from ..io.modes import DEFAULT_FILE_MODE
from ..store import SegmentNotFound, SegmentStore
from ..store.reader import SegmentReader, require_valid
from ..store.sealing import STATE_PAGE_BYTES
from .lmcache_chunks import LAYOUT_ID, ChunkLayout, PluginCounters

__all__ = ["ChunkStore", "OpenChunk", "PutOutcome", "stored_bytes"]

log = logging.getLogger("stratastore.adapters.lmcache")

PutOutcome = Literal["stored", "present", "refused"]
_MAX_LAYOUT_BYTES = 1 << 16


def stored_bytes(payload_bytes: int) -> int:
    """What a chunk of ``payload_bytes`` adds to ``SegmentStore.used()``: its data file (header
    and payload) and its sidecar (head, one 32-byte digest a page, trailer)."""
    pages = -(-payload_bytes // STATE_PAGE_BYTES)
    return DATA_OFFSET + payload_bytes + SIDECAR_HEAD.size + 32 * pages + TRAILER_BYTES


@dataclass
class OpenChunk:
    """A stored chunk held open for one validated read (:meth:`ChunkStore.open_chunk`)."""

    chunk_id: bytes
    tokens: int
    reader: SegmentReader

    @property
    def payload_bytes(self) -> int:
        return self.reader.sidecar.payload_bytes


class ChunkStore:
    """The plugin's chunks in the segment directory ``path``; thread-safe. Use :meth:`open`."""

    def __init__(self, store: SegmentStore, budget_bytes: int) -> None:
        self.store = store
        self.budget_bytes = budget_bytes
        self.counters = PluginCounters()
        self.layout: ChunkLayout | None = None
        self._lock = threading.Lock()  #: pins, reservations, the counters (never held over I/O)
        self._room = threading.Lock()  #: one put at a time makes room
        self._layout_lock = threading.Lock()
        self._pins: dict[bytes, int] = {}
        self._reserved = 0  #: bytes of the puts in flight that made room
        self._refused_layout = False

    @classmethod
    def open(cls, path: str, fingerprint: ModelFingerprint, budget_bytes: int, *,
             file_mode: int = DEFAULT_FILE_MODE) -> ChunkStore:  # fmt: skip
        """Open (create) the directory and read its layout record if it has one. Raises what
        ``SegmentStore.open`` raises (:class:`IncompatibleFingerprint`: another model's
        directory) and :class:`~stratastore.format.FormatError` for a damaged layout record."""
        store = SegmentStore.open(path, fingerprint, level=Level.COLD, file_mode=file_mode)
        try:
            chunks = cls(store, budget_bytes)
            if store.contains(state_key(LAYOUT_ID)):
                chunks.layout = chunks._read_layout()
        except BaseException:
            store.close()
            raise
        return chunks

    def close(self) -> None:
        self.store.close()

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``counter`` (a field of :class:`PluginCounters`)."""
        with self._lock:
            setattr(self.counters, counter, getattr(self.counters, counter) + n)

    # -- the layout ---------------------------------------------------------------------------
    def _read_layout(self) -> ChunkLayout:
        key = state_key(LAYOUT_ID)
        raw = self.store.get_bytes(key, max_bytes=_MAX_LAYOUT_BYTES)
        return ChunkLayout.decode(raw, f"the chunk layout record {key.hex()} in {self.store.path}")

    def accepts(self, layout: ChunkLayout) -> bool:
        """Whether chunks of ``layout`` may be stored here: the directory's layout, or the
        first (then recorded durably, before any chunk of it). Another layout is refused, and
        logged once: one directory holds the chunks of one engine configuration."""
        with self._layout_lock:
            if self.layout is None:
                self.store.put_state(LAYOUT_ID, layout.encode(), token_pos=0)
                self.layout = self._read_layout()  # another process may have recorded first
            if self.layout == layout:
                return True
        with self._lock:
            self.counters.puts_refused += 1
            first = not self._refused_layout
            self._refused_layout = True
        if first:
            log.error("stratastore: %s holds LMCache chunks of layout %s; chunks of layout %s "
                      "are not stored: give each engine configuration its own directory",
                      self.store.path, self.layout.encode().decode(),
                      layout.encode().decode())  # fmt: skip
        return False

    # -- putting ------------------------------------------------------------------------------
    def put(self, chunk_id: bytes, payload: memoryview) -> PutOutcome:
        """Store a chunk's bytes, durably, making room first (module docstring): ``"stored"``
        once committed, ``"present"`` when it was already, ``"refused"`` when it cannot fit.
        A failed write raises (a :class:`~stratastore.errors.StrataError`) and leaves nothing."""
        if self.contains(chunk_id):  # before making room: a present chunk evicts nothing
            with self._lock:
                self.counters.puts_deduped += 1
            return "present"
        size = stored_bytes(len(payload))
        if not self._make_room(size):
            with self._lock:
                self.counters.puts_refused += 1
            return "refused"
        try:
            res = self.store.put_state(chunk_id, payload, token_pos=0)
        finally:
            with self._lock:
                self._reserved -= size
        with self._lock:
            if res.created:
                self.counters.puts += 1
                self.counters.put_bytes += len(payload)
            else:
                self.counters.puts_deduped += 1
        return "stored" if res.created else "present"

    def _make_room(self, size: int) -> bool:
        """Evict the oldest unpinned chunks until ``size`` more bytes fit with the puts in
        flight, and reserve them; False (nothing reserved) when they cannot fit."""
        with self._room:
            if size > self.budget_bytes:
                log.warning("stratastore: a chunk of %d bytes is larger than the whole budget "
                            "of %s (%d bytes); raise budget_mib", size, self.store.path,
                            self.budget_bytes)  # fmt: skip
                return False
            while self.store.used() + self._reserved + size > self.budget_bytes:
                if not self._evict_oldest():
                    log.warning("stratastore: %s is full (%d of %d bytes, %d in flight) and "
                                "holds only pinned chunks: a chunk was not stored",
                                self.store.path, self.store.used(), self.budget_bytes,
                                self._reserved)  # fmt: skip
                    return False
            with self._lock:
                self._reserved += size
            return True

    def _evict_oldest(self) -> bool:
        """Delete the oldest chunk no one pinned; False when there is none."""
        layout_key = state_key(LAYOUT_ID)
        for key, _ in self.store.oldest():
            with self._lock:
                if key == layout_key or self._pins.get(key, 0) > 0:
                    continue
            if self.store.delete(key):
                with self._lock:
                    self.counters.evictions += 1
            return True  # deleted, or another process did: look again
        return False

    # -- reading ------------------------------------------------------------------------------
    def contains(self, chunk_id: bytes) -> bool:
        return self.store.contains(state_key(chunk_id))

    def open_chunk(self, chunk_id: bytes) -> OpenChunk | None:
        """The chunk held open for :meth:`copy_into`, or None: not stored (a miss) or damaged
        (counted, logged, deleted)."""
        key = state_key(chunk_id)
        try:
            reader = self.store.open_reader(key)
        except SegmentNotFound:
            with self._lock:
                self.counters.misses += 1
            return None
        except StrataError as e:
            self._damaged(key, e)
            return None
        tokens = self.layout.tokens_for(reader.sidecar.payload_bytes) if self.layout else None
        if tokens is None:
            reader.close()
            self._damaged(key, FormatError(
                f"{reader.path}: {reader.sidecar.payload_bytes} bytes are no whole number of "
                f"tokens of this directory's chunk layout"))  # fmt: skip
            return None
        return OpenChunk(chunk_id, tokens, reader)

    def copy_into(self, chunk: OpenChunk, dst: memoryview) -> bool:
        """Fill ``dst`` (the chunk's payload size, memory no one else sees yet) with the
        chunk's pages, read straight into it and then hashed there, each page against its
        sidecar digest (the bytes hashed are the bytes delivered); closes the chunk. False
        (damaged: counted, logged, deleted) when a page fails or the file cannot be read: the
        caller then drops ``dst`` undelivered."""
        key = state_key(chunk.chunk_id)
        try:
            with chunk.reader as seg:
                if len(dst) != chunk.payload_bytes:
                    raise FormatError(f"{seg.path}: {chunk.payload_bytes} bytes, the memory "
                                      f"object {len(dst)}")  # fmt: skip
                if seg.sidecar.codec is Codec.RAW:
                    seg.read_into(dst)
                    require_valid(seg.sidecar, np.frombuffer(dst, dtype=np.uint8))
                else:  # the plugin writes RAW; a compressed chunk decodes through staging
                    seg.copy_validated(dst, True)
        except StrataError as e:
            self._damaged(key, e)
            return False
        with self._lock:
            self.counters.hits += 1
            self.counters.hit_bytes += len(dst)
        return True

    def _damaged(self, key: bytes, e: StrataError) -> None:
        with self._lock:
            self.counters.damaged += 1
        log.warning("stratastore: LMCache chunk %s is damaged (%s: %s): a miss; it is removed "
                    "so that the next store writes it again", key.hex()[:16],
                    type(e).__name__, e)  # fmt: skip
        try:
            self.store.delete(key)
        except StrataError as d:
            log.error("stratastore: the damaged chunk %s could not be removed: %s; run "
                      "strata fsck %s", key.hex()[:16], d, self.store.path)  # fmt: skip

    # -- pins and removal ---------------------------------------------------------------------
    def pin(self, chunk_id: bytes) -> bool:
        key = state_key(chunk_id)
        if not self.store.contains(key):
            return False
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
        return True

    def unpin(self, chunk_id: bytes) -> bool:
        key = state_key(chunk_id)
        with self._lock:
            n = self._pins.get(key, 0)
            if n > 1:
                self._pins[key] = n - 1
            else:
                self._pins.pop(key, None)
        return n > 0 or self.store.contains(key)

    def pinned(self, chunk_id: bytes) -> bool:
        with self._lock:
            return self._pins.get(state_key(chunk_id), 0) > 0

    def remove(self, chunk_id: bytes) -> bool:
        """Delete a chunk (pins and all); False when it was not stored."""
        key = state_key(chunk_id)
        removed = self.store.delete(key)
        with self._lock:
            self._pins.pop(key, None)
            if removed:
                self.counters.removes += 1
        return removed

    def entries(self) -> int:
        """How many chunks are stored (the layout record aside)."""
        return len(self.store) - (self.layout is not None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            doc = self.counters.as_dict()
            doc["in_flight_bytes"] = self._reserved
            doc["pinned"] = len(self._pins)
        doc["entries"] = self.entries()
        doc["used_bytes"] = self.store.used()
        doc["budget_bytes"] = self.budget_bytes
        return doc
