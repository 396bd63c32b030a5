"""The chunks of the LMCache plugin in one stratastore segment directory: durable puts under a
byte budget with oldest-first eviction, pins, validated reads, counters (no lmcache or torch
import; :mod:`stratastore.adapters.lmcache` is the LMCache side).

A chunk is addressed by its **chunk id** (:func:`~stratastore.adapters.lmcache_chunks.chunk_id`
of its LMCache key) and stored as the running-state segment ``state_key(chunk id)`` of a
:class:`~stratastore.levels.local.SegmentStore` (spec F-KEY-5): the store's durable put protocol
(F-DUR: data file written and fsynced, renamed in, directory fsynced, sidecar written durably,
indexed), its LMDB index rebuilt from the sidecars at open (F-IDX), BLAKE3 per page (F-SC-3).

- **Budget**: before a put, the oldest chunks (``SegmentStore.oldest``: the index's age table,
  by seal time) are deleted until the store's bytes (data files and sidecars, what
  ``SegmentStore.used`` counts) plus the puts in flight plus this one fit ``budget_bytes``;
  pinned chunks and the layout record are never evicted. A put that cannot fit is refused.
- **Reads** deliver a chunk only after every page was hashed in the memory it is delivered
  from (read straight into the memory object, hashed there). A chunk whose own files fail
  validation (a checksum, a damaged or foreign header or sidecar, a truncated file) is a miss,
  counted in ``damaged``, logged, and deleted, so lookups stop finding it and the next put of
  that chunk writes it again; it is deleted only if its files are still the ones that failed
  (checked under the directory's commit lock: a copy stored again meanwhile stays). Any other
  failure (an I/O error such as EMFILE, the index or the store closed) is a miss counted in
  ``read_errors`` and logged; nothing is deleted. A chunk read while this process does not know
  the directory's layout (the record is re-read first: another process may have written it)
  is a plain miss, never damage.
- **Pins, evictions and removals** of one chunk exclude each other: a chunk chosen for deletion
  is marked under the lock before it is deleted, and a pin of a marked chunk fails.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Literal

import numpy as np

from stratastore.adapters.lmcache_chunks import LAYOUT_ID, ChunkLayout, PluginCounters
from stratastore.errors import StrataError
from stratastore.format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    Level,
    ModelFingerprint,
    data_name,
    sidecar_name,
)
from stratastore.format.keys import state_key
from stratastore.format.sidecar import SIDECAR_HEAD, TRAILER_BYTES
from stratastore.io import files
from stratastore.io.errors import ShortRead, StrataIOError
from stratastore.io.modes import DEFAULT_FILE_MODE
from stratastore.levels.local import SegmentNotFound, SegmentStore
from stratastore.levels.reader import SegmentReader, require_valid
from stratastore.levels.sealing import STATE_PAGE_BYTES

__all__ = ["ChunkStore", "OpenChunk", "PutOutcome", "stored_bytes"]

log = logging.getLogger("stratastore.adapters.lmcache")

PutOutcome = Literal["stored", "present", "refused"]
_MAX_LAYOUT_BYTES = 1 << 16
#: what a chunk's own files failing validation raises (damage: the chunk is deleted); anything
#: else a read raises (StrataIOError such as EMFILE, a closed index) is a miss, never a delete
_DAMAGE = (FormatError, ChecksumMismatch, IncompatibleFingerprint, ShortRead)
#: (device, inode, size, mtime, ctime) of a chunk's sidecar and data file; None: no file
_Identity = tuple[bytes | None, ...]


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
    identity: _Identity = ()  #: the chunk's files as they were before it was opened

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
        self._doomed: dict[bytes, int] = {}  #: chunks being deleted: a pin of one fails
        #: the puts in flight that made room: (chunk key, stored bytes) by put
        self._reserved: dict[object, tuple[bytes, int]] = {}
        self._refused_layout = False
        self._layout_warned = False
        self.closed = False

    @classmethod
    def open(cls, path: str, fingerprint: ModelFingerprint, budget_bytes: int, *,
             file_mode: int = DEFAULT_FILE_MODE) -> ChunkStore:  # fmt: skip
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
                        "stay, and the next put records the layout again") from e  # fmt: skip
        except BaseException:
            store.close()
            raise
        return chunks

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
                        log.error("stratastore: the LMCache chunk layout record %s in %s cannot "
                                  "be read (%s: %s): every get is a miss (no chunk is removed); "
                                  "run `strata fsck --repair --yes %s`",
                                  data_name(state_key(LAYOUT_ID)), self.store.path,
                                  type(e).__name__, e, self.store.path)  # fmt: skip
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
        token = self._make_room(state_key(chunk_id), size)
        if token is None:
            with self._lock:
                self.counters.puts_refused += 1
            return "refused"
        try:
            res = self.store.put_state(chunk_id, payload, token_pos=0)
        finally:
            with self._lock:
                del self._reserved[token]
        with self._lock:
            if res.created:
                self.counters.puts += 1
                self.counters.put_bytes += len(payload)
            else:
                self.counters.puts_deduped += 1
        return "stored" if res.created else "present"

    def _committed_and_in_flight(self) -> tuple[int, int]:
        """The store's bytes and the bytes of the puts in flight not yet counted in them: a put
        whose chunk is indexed already (committed, its reservation not yet dropped) counts
        once. The index is read between two looks at which reserved chunks are indexed, and
        again when a commit came in between, so no put counts twice or not at all."""
        while True:
            with self._lock:
                reserved = list(self._reserved.values())
            before = [self.store.contains(k) for k, _ in reserved]
            used = self.store.used()
            after = [self.store.contains(k) for k, _ in reserved]
            if before == after:
                return used, sum(n for (_, n), indexed in zip(reserved, after, strict=True)
                                 if not indexed)  # fmt: skip

    def _make_room(self, key: bytes, size: int) -> object | None:
        """Evict the oldest unpinned chunks until ``size`` more bytes fit with the puts in
        flight, and reserve them; the reservation's token, or None (nothing reserved) when they
        cannot fit."""
        with self._room:
            if size > self.budget_bytes:
                log.warning("stratastore: a chunk of %d bytes is larger than the whole budget "
                            "of %s (%d bytes); raise budget_mib", size, self.store.path,
                            self.budget_bytes)  # fmt: skip
                return None
            while True:
                used, in_flight = self._committed_and_in_flight()
                if used + in_flight + size <= self.budget_bytes:
                    break
                if not self._evict_oldest():
                    log.warning("stratastore: %s is full (%d of %d bytes, %d in flight) and "
                                "holds only pinned chunks: a chunk was not stored",
                                self.store.path, used, self.budget_bytes,
                                in_flight)  # fmt: skip
                    return None
            token = object()
            with self._lock:
                self._reserved[token] = (key, size)
            return token

    def _doom(self, key: bytes, *, unless_pinned: bool) -> bool:
        """Mark ``key`` as being deleted (a pin of it fails from now on); False (unmarked) when
        ``unless_pinned`` and it is pinned."""
        with self._lock:
            if unless_pinned and self._pins.get(key, 0) > 0:
                return False
            self._doomed[key] = self._doomed.get(key, 0) + 1
            return True

    def _undoom(self, key: bytes) -> None:
        with self._lock:
            n = self._doomed.pop(key, 0)
            if n > 1:
                self._doomed[key] = n - 1

    def _evict_oldest(self) -> bool:
        """Delete the oldest chunk no one pinned; False when there is none. The choice and the
        delete exclude a pin of the victim (:meth:`_doom`)."""
        layout_key = state_key(LAYOUT_ID)
        for key, _ in self.store.oldest():
            if key == layout_key or not self._doom(key, unless_pinned=True):
                continue
            try:
                deleted = self.store.delete(key)
            finally:
                self._undoom(key)
            if deleted:
                with self._lock:
                    self.counters.evictions += 1
            return True  # deleted, or another process did: look again
        return False

    # -- reading ------------------------------------------------------------------------------
    def contains(self, chunk_id: bytes) -> bool:
        return self.store.contains(state_key(chunk_id))

    def _identity(self, key: bytes) -> _Identity:
        """The chunk's sidecar and data file as they are now (:func:`stratastore.io.files.stamp`:
        inode, size, mtime; None for a file that is not there)."""
        out: list[bytes | None] = []
        for name in (sidecar_name(key), data_name(key)):
            try:
                out.append(files.stamp(os.path.join(self.store.path, name)))
            except StrataIOError:
                out.append(None)
        return tuple(out)

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
        identity = self._identity(key)
        try:
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
            self._damaged(key, FormatError(
                f"{reader.path}: {reader.sidecar.payload_bytes} bytes are no whole number of "
                f"tokens of this directory's chunk layout"), identity,
                reader.sidecar.sealed_at_ns)  # fmt: skip
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
                    raise FormatError(f"{seg.path}: {chunk.payload_bytes} bytes, the memory "
                                      f"object {len(dst)}")  # fmt: skip
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
            log.info("stratastore: LMCache chunk %s was not read: the plugin closed",
                     key.hex()[:16])  # fmt: skip
            return
        log.warning("stratastore: LMCache chunk %s could not be read (%s: %s): a miss; the "
                    "chunk is kept", key.hex()[:16], type(e).__name__, e)  # fmt: skip

    def _damaged(self, key: bytes, e: BaseException, identity: _Identity,
                 sealed_at_ns: int | None) -> None:  # fmt: skip
        """Count and log a chunk whose files failed validation and delete it, only if its
        files are still the ones read (``identity``, and the sealing time of the sidecar read):
        checked and deleted under the directory's commit lock, so a copy stored again meanwhile
        (by this process or another) is never deleted."""
        with self._lock:
            self.counters.damaged += 1
        log.warning("stratastore: LMCache chunk %s is damaged (%s: %s): a miss; it is removed "
                    "so that the next store writes it again", key.hex()[:16],
                    type(e).__name__, e)  # fmt: skip
        if self.closed:
            return
        self._doom(key, unless_pinned=False)
        try:

            def still_the_copy_read() -> bool:
                if self._identity(key) != identity:
                    return False
                if sealed_at_ns is None:
                    return True
                rec = self.store.index.get(key)
                return rec is not None and rec.sealed_at_ns == sealed_at_ns

            self.store.delete_if(key, still_the_copy_read)
        except StrataError as d:
            log.error("stratastore: the damaged chunk %s could not be removed: %s; run "
                      "strata fsck %s", key.hex()[:16], d, self.store.path)  # fmt: skip
        finally:
            self._undoom(key)

    # -- pins and removal ---------------------------------------------------------------------
    def pin(self, chunk_id: bytes) -> bool:
        """Pin a stored chunk: True when it is stored and now pinned (no eviction or
        ``remove(force=False)`` deletes it until unpinned); False when it is not stored or is
        being deleted."""
        key = state_key(chunk_id)
        with self._lock:
            if key in self._doomed:
                return False
            self._pins[key] = self._pins.get(key, 0) + 1
        if self.store.contains(key):
            return True
        self._unpin_key(key)
        return False

    def _unpin_key(self, key: bytes) -> int:
        with self._lock:
            n = self._pins.get(key, 0)
            if n > 1:
                self._pins[key] = n - 1
            else:
                self._pins.pop(key, None)
        return n

    def unpin(self, chunk_id: bytes) -> bool:
        key = state_key(chunk_id)
        return self._unpin_key(key) > 0 or (not self.closed and self.store.contains(key))

    def pinned(self, chunk_id: bytes) -> bool:
        with self._lock:
            return self._pins.get(state_key(chunk_id), 0) > 0

    def remove(self, chunk_id: bytes, *, force: bool = True) -> bool:
        """Delete a chunk (with ``force``, pins and all); False when it was not stored or, without
        ``force``, is pinned (the check and the delete exclude a pin in between)."""
        key = state_key(chunk_id)
        if not self._doom(key, unless_pinned=not force):
            return False
        try:
            removed = self.store.delete(key)
        finally:
            with self._lock:
                self._pins.pop(key, None)
            self._undoom(key)
        if removed:
            self.count("removes")
        return removed

    def entries(self) -> int:
        """How many chunks are stored (the layout record aside)."""
        return len(self.store) - self.store.contains(state_key(LAYOUT_ID))

    def stats(self) -> dict[str, int]:
        with self._lock:
            doc = self.counters.as_dict()
            doc["in_flight_bytes"] = sum(n for _, n in self._reserved.values())
            doc["pinned"] = len(self._pins)
        doc["entries"] = self.entries()
        doc["used_bytes"] = self.store.used()
        doc["budget_bytes"] = self.budget_bytes
        return doc
