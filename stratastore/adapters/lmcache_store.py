"""The chunks of the LMCache plugin in one stratastore segment directory: durable puts under a
byte budget with oldest-first eviction, pins, validated reads, counters (no lmcache or torch
import; :mod:`stratastore.adapters.lmcache` is the LMCache side).

A chunk is addressed by its **chunk id** (:func:`~stratastore.adapters.lmcache_chunks.chunk_id`
of its LMCache key) and stored as the running-state segment ``state_key(chunk id)`` of a
:class:`~stratastore.levels.local.SegmentStore` (spec F-KEY-5): the store's durable put protocol
(F-DUR: data file written and fsynced, renamed in, directory fsynced, sidecar written durably,
indexed), its LMDB index rebuilt from the sidecars at open (F-IDX), BLAKE3 per page (F-SC-3).

- **Budget**: the directory is a disk level used on its own
  (:class:`~stratastore.adapters.lmcache_room.ChunkRoom` over
  :class:`~stratastore.tiers.disk.DiskLevel`): before a put, the oldest chunks (the index's age
  table, by seal time) are deleted until the store's bytes (data files and sidecars, what
  ``SegmentStore.used`` counts) plus the puts in flight plus this one fit ``budget_bytes``;
  pinned chunks and the layout record are never evicted. A put that cannot fit is refused.
- **Reads** deliver a chunk only after every page was hashed in the memory it is delivered
  from (read straight into the memory object, hashed there). A chunk whose own files fail
  validation (a checksum, a damaged or foreign header or sidecar, a truncated file) is a miss,
  counted in ``damaged``, logged, and deleted, so lookups stop finding it and the next put of
  that chunk writes it again; it is deleted only if its files are still the ones that failed
  (its index record unchanged since it was opened, checked under the directory's commit lock:
  a copy stored again meanwhile has another record, and stays). Any other failure (an I/O
  error such as EMFILE, the index or the store closed) is a miss counted in ``read_errors``
  and logged; nothing is deleted. A chunk read while this process does not know the
  directory's layout (the record is re-read first: another process may have written it) is a
  plain miss, never damage.
- **Pins, evictions and removals** of one chunk exclude each other: a chunk chosen for deletion
  is marked under the lock before it is deleted, and a pin of a marked chunk fails.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from stratastore.adapters.lmcache_chunks import LAYOUT_ID, ChunkLayout, PluginCounters
from stratastore.adapters.lmcache_room import ChunkRoom
from stratastore.errors import StrataError
from stratastore.format import (
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
    Level,
    ModelFingerprint,
    data_name,
)
from stratastore.format.keys import state_key
from stratastore.io.errors import ShortRead
from stratastore.io.modes import DEFAULT_FILE_MODE
from stratastore.levels.local import SegmentNotFound, SegmentStore
from stratastore.levels.local.sizes import raw_segment_bytes
from stratastore.levels.reader import SegmentReader, require_valid
from stratastore.levels.sealing import STATE_PAGE_BYTES

__all__ = ["ChunkStore", "OpenChunk", "PutOutcome", "stored_bytes"]

log = logging.getLogger("stratastore.adapters.lmcache")

PutOutcome = Literal["stored", "present", "refused"]
_MAX_LAYOUT_BYTES = 1 << 16
#: what a chunk's own files failing validation raises (damage: the chunk is deleted); anything
#: else a read raises (StrataIOError such as EMFILE, a closed index) is a miss, never a delete
_DAMAGE = (FormatError, ChecksumMismatch, IncompatibleFingerprint, ShortRead)


def stored_bytes(payload_bytes: int) -> int:
    """What a chunk of ``payload_bytes`` adds to ``SegmentStore.used()``: its data file and its
    sidecar, one RAW running-state segment in pages of ``STATE_PAGE_BYTES``."""
    return raw_segment_bytes(payload_bytes, STATE_PAGE_BYTES)


@dataclass
class OpenChunk:
    """A stored chunk held open for one validated read (:meth:`ChunkStore.open_chunk`)."""

    chunk_id: bytes
    tokens: int
    reader: SegmentReader
    #: the chunk's index record before it was opened (None: not indexed then)
    identity: IndexRecord | None = None

    @property
    def payload_bytes(self) -> int:
        return self.reader.sidecar.payload_bytes


class ChunkStore:
    """The plugin's chunks in the segment directory ``path``; thread-safe. Use :meth:`open`."""

    def __init__(self, store: SegmentStore, budget_bytes: int) -> None:
        self.store = store
        self.counters = PluginCounters()
        #: the budget, the puts in flight and the pins: the disk level's eviction, oldest first
        self.room = ChunkRoom(store, budget_bytes, keep=state_key(LAYOUT_ID), count=self.count)
        self.layout: ChunkLayout | None = None
        self._lock = threading.Lock()  #: the counters (never held over I/O)
        self._layout_lock = threading.Lock()
        self._refused_layout = False
        self._layout_warned = False
        self.closed = False

    @classmethod
    def open(
        cls,
        path: str,
        fingerprint: ModelFingerprint,
        budget_bytes: int,
        *,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> ChunkStore:
        """Open (create) the directory and read its layout record if it has one. Raises what
        ``SegmentStore.open`` raises (:class:`IncompatibleFingerprint`: another model's
        directory) and :class:`~stratastore.format.FormatError` naming the layout record and the
        fix when that record cannot be read (``strata fsck --repair`` quarantines a damaged one;
        the next put records the layout again, and the chunks stay)."""
        store = SegmentStore.open(path, fingerprint, level=Level.COLD, file_mode=file_mode)
        try:
            chunks = cls(store, budget_bytes)
            if store.contains(state_key(LAYOUT_ID)):
                try:
                    chunks.layout = chunks._read_layout()
                except StrataError as e:
                    raise FormatError(
                        f"the LMCache chunk layout record {data_name(state_key(LAYOUT_ID))} in "
                        f"{path} cannot be read ({type(e).__name__}: {e}); run `strata fsck "
                        f"--repair --yes {path}`: it quarantines a damaged record, the chunks "
                        "stay, and the next put records the layout again"
                    ) from e
        except BaseException:
            store.close()
            raise
        return chunks

    @property
    def budget_bytes(self) -> int:
        return self.room.budget_bytes

    def close(self) -> None:
        self.closed = True
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

    def known_layout(self) -> ChunkLayout | None:
        """The directory's layout, re-read from its record when this process does not know it
        yet (another process may have recorded it since this one opened the directory); None
        when there is no readable record (a miss for every chunk, never damage)."""
        if self.layout is not None:
            return self.layout
        with self._layout_lock:
            if self.layout is None and self.store.contains(state_key(LAYOUT_ID)):
                try:
                    self.layout = self._read_layout()
                except StrataError as e:
                    if not self._layout_warned:
                        self._layout_warned = True
                        log.error(
                            "stratastore: the LMCache chunk layout record %s in %s cannot "
                            "be read (%s: %s): every get is a miss (no chunk is removed); "
                            "run `strata fsck --repair --yes %s`",
                            data_name(state_key(LAYOUT_ID)),
                            self.store.path,
                            type(e).__name__,
                            e,
                            self.store.path,
                        )
            return self.layout

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
            log.error(
                "stratastore: %s holds LMCache chunks of layout %s; chunks of layout %s "
                "are not stored: give each engine configuration its own directory",
                self.store.path,
                self.layout.encode().decode(),
                layout.encode().decode(),
            )
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
        token = self.room.reserve(state_key(chunk_id), stored_bytes(len(payload)))
        if token is None:
            with self._lock:
                self.counters.puts_refused += 1
            return "refused"
        try:
            res = self.store.put_state(chunk_id, payload, token_pos=0)
        finally:
            self.room.release(token)
        with self._lock:
            if res.created:
                self.counters.puts += 1
                self.counters.put_bytes += len(payload)
            else:
                self.counters.puts_deduped += 1
        return "stored" if res.created else "present"

    # -- reading ------------------------------------------------------------------------------
    def contains(self, chunk_id: bytes) -> bool:
        return self.store.contains(state_key(chunk_id))

    def _identity(self, key: bytes) -> IndexRecord | None:
        """The chunk's index record as it is now (None: not indexed). A copy stored again
        has another one (its sidecar's sealing time), so an unchanged record names the copy
        that was read."""
        try:
            return self.store.record(key)
        except SegmentNotFound:
            return None

    def open_chunk(self, chunk_id: bytes) -> OpenChunk | None:
        """The chunk held open for :meth:`copy_into`, or None: not stored or layout unknown (a
        miss), unreadable (a miss counted in ``read_errors``), or damaged (counted, logged,
        deleted if its files are still the ones that failed)."""
        key = state_key(chunk_id)
        if self.closed:
            return None
        layout = self.known_layout()
        if layout is None:  # this process cannot tell: a miss, never damage
            self.count("misses")
            return None
        identity: IndexRecord | None = None
        try:
            identity = self._identity(key)
            reader = self.store.open_reader(key)
        except SegmentNotFound:
            self.count("misses")
            return None
        except _DAMAGE as e:
            self._damaged(key, e, identity, None)
            return None
        except StrataError as e:
            self._read_error(key, e)
            return None
        tokens = layout.tokens_for(reader.sidecar.payload_bytes)
        if tokens is None:
            reader.close()
            self._damaged(
                key,
                FormatError(
                    f"{reader.path}: {reader.sidecar.payload_bytes} bytes are no whole number of "
                    f"tokens of this directory's chunk layout"
                ),
                identity,
                reader.sidecar.sealed_at_ns,
            )
            return None
        return OpenChunk(chunk_id, tokens, reader, identity)

    def copy_into(self, chunk: OpenChunk, dst: memoryview) -> bool:
        """Fill ``dst`` (the chunk's payload size, memory no one else sees yet) with the
        chunk's pages, read straight into it and then hashed there, each page against its
        sidecar digest (the bytes hashed are the bytes delivered); closes the chunk. False when
        a page fails (damaged: counted, logged, deleted if its files are unchanged) or the file
        cannot be read (``read_errors``, nothing deleted): the caller then drops ``dst``
        undelivered."""
        key = state_key(chunk.chunk_id)
        sealed = chunk.reader.sidecar.sealed_at_ns
        try:
            with chunk.reader as seg:
                if len(dst) != chunk.payload_bytes:
                    raise FormatError(
                        f"{seg.path}: {chunk.payload_bytes} bytes, the memory object {len(dst)}"
                    )
                if seg.sidecar.codec is Codec.RAW:
                    seg.read_into(dst)
                    require_valid(seg.sidecar, np.frombuffer(dst, dtype=np.uint8))
                else:  # the plugin writes RAW; a compressed chunk decodes through staging
                    seg.copy_validated(dst, True)
        except _DAMAGE as e:
            self._damaged(key, e, chunk.identity, sealed)
            return False
        except StrataError as e:
            self._read_error(key, e)
            return False
        with self._lock:
            self.counters.hits += 1
            self.counters.hit_bytes += len(dst)
        return True

    def _read_error(self, key: bytes, e: StrataError) -> None:
        """A read that failed for another reason than the chunk's own files: a miss, counted and
        logged (quietly once the store is closed); the chunk stays."""
        self.count("read_errors")
        if self.closed:
            log.info(
                "stratastore: LMCache chunk %s was not read: the plugin closed", key.hex()[:16]
            )
            return
        log.warning(
            "stratastore: LMCache chunk %s could not be read (%s: %s): a miss; the chunk is kept",
            key.hex()[:16],
            type(e).__name__,
            e,
        )

    def _damaged(
        self, key: bytes, e: BaseException, identity: IndexRecord | None, sealed_at_ns: int | None
    ) -> None:
        """Count and log a chunk whose files failed validation and delete it, only if its
        files are still the ones read (its index record still ``identity``, the one before it
        was opened, and sealed when the sidecar read says): checked and deleted under the
        directory's commit lock, so a copy stored again meanwhile (by this process or another)
        is never deleted."""
        with self._lock:
            self.counters.damaged += 1
        log.warning(
            "stratastore: LMCache chunk %s is damaged (%s: %s): a miss; it is removed "
            "so that the next store writes it again",
            key.hex()[:16],
            type(e).__name__,
            e,
        )
        if self.closed:
            return

        def still_the_copy_read() -> bool:
            rec = self._identity(key)
            if rec != identity:
                return False
            return sealed_at_ns is None or (rec is not None and rec.sealed_at_ns == sealed_at_ns)

        with self.room.deleting(key, unless_pinned=False):
            try:
                self.store.delete_if(key, still_the_copy_read)
            except StrataError as d:
                log.error(
                    "stratastore: the damaged chunk %s could not be removed: %s; run "
                    "strata fsck %s",
                    key.hex()[:16],
                    d,
                    self.store.path,
                )

    # -- pins and removal ---------------------------------------------------------------------
    def pin(self, chunk_id: bytes) -> bool:
        """Pin a stored chunk: True when it is stored and now pinned (no eviction or
        ``remove(force=False)`` deletes it until unpinned); False when it is not stored or is
        being deleted."""
        return self.room.pin(state_key(chunk_id))

    def unpin(self, chunk_id: bytes) -> bool:
        key = state_key(chunk_id)
        return self.room.unpin(key) > 0 or (not self.closed and self.store.contains(key))

    def pinned(self, chunk_id: bytes) -> bool:
        return self.room.pinned(state_key(chunk_id))

    def remove(self, chunk_id: bytes, *, force: bool = True) -> bool:
        """Delete a chunk (with ``force``, pins and all); False when it was not stored or, without
        ``force``, is pinned (the check and the delete exclude a pin in between)."""
        key = state_key(chunk_id)
        with self.room.deleting(key, unless_pinned=not force) as marked:
            if not marked:
                return False
            try:
                removed = self.store.delete(key)
            finally:
                self.room.drop_pins(key)
        if removed:
            self.count("removes")
        return removed

    def entries(self) -> int:
        """How many chunks are stored (the layout record aside)."""
        return len(self.store) - self.store.contains(state_key(LAYOUT_ID))

    def stats(self) -> dict[str, int]:
        with self._lock:
            doc = self.counters.as_dict()
        doc["in_flight_bytes"] = self.room.in_flight_bytes()
        doc["pinned"] = self.room.pinned_count()
        doc["entries"] = self.entries()
        doc["used_bytes"] = self.store.used()
        doc["budget_bytes"] = self.budget_bytes
        return doc
