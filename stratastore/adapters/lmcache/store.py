"""The LMCache plugin's chunks: a :class:`~stratastore.chunks.ChunkStore` on the plugin's levels
(one directory, or several levels first to last: directories, ``memory://``, a Redis level
several engines share), plus the chunk layout record and the counters only the plugin keeps (no
lmcache or torch import; :mod:`stratastore.adapters.lmcache` is the LMCache side).

A chunk is addressed by its **chunk id** (:func:`~stratastore.adapters.lmcache.chunks.chunk_id`
of its LMCache key), the chunk store's 32-byte chunk key, and stored as the running-state
segment ``state_key(chunk id)`` (spec F-KEY-5) of its level, each level opened through the
level registry: a directory's durable put protocol (F-DUR), its LMDB index rebuilt from the
sidecars at open (F-IDX), BLAKE3 per page (F-SC-3). Budgets, the cascade, oldest-first
eviction, pins, validated reads and what counts as damage are the chunk store's
(:mod:`stratastore.chunks.store`); this module adds:

- **the layout record**: what the bytes of every chunk mean (:class:`ChunkLayout`), recorded
  once, durably, at the first put, before any chunk of it, as a record the chunk store keeps at
  :data:`LAYOUT_ID` (:meth:`ChunkStore.put_kept <stratastore.chunks.ChunkStore.put_kept>`) on
  every level, the last first, so that engines sharing a level keep the layout it took first:
  no eviction takes it, and every level's copy is read and compared
  (:meth:`ChunkStore.get_kept <stratastore.chunks.ChunkStore.get_kept>`; copies that differ
  are a :class:`~stratastore.chunks.KeptRecordConflict`). One chunk store holds the chunks of
  one layout; a chunk of another is refused (logged once).
- **reads through the layout**: a chunk read while this process does not know the layout (the
  record is re-read first: another process may have written it) is a plain miss, never
  damage; a chunk whose size is no whole number of tokens of the layout is damage. A record
  that cannot be read makes every get a miss (logged once; no chunk is removed) until
  ``strata fsck --repair`` sets it aside and a put records the layout again.
- the plugin's own counters (``put_errors``, ``alloc_failures``) beside the store's, as
  :class:`~stratastore.adapters.lmcache.chunks.PluginCounters` lists them.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import fields

import stratastore.chunks as chunk_layer
from stratastore.adapters.lmcache.chunks import LAYOUT_ID, ChunkLayout, PluginCounters
from stratastore.adapters.lmcache.config import CHUNK_NAME
from stratastore.chunks import (
    ChunkConfig,
    ChunkCounters,
    ChunkLevel,
    KeptRecordConflict,
    OpenChunk,
    PutOutcome,
    stored_bytes,
    stored_key,
)
from stratastore.errors import StrataError
from stratastore.format import FormatError, ModelFingerprint, data_name
from stratastore.io.modes import DEFAULT_FILE_MODE
from stratastore.levels.registry import scheme_of

__all__ = ["ChunkStore", "LMCacheChunks", "OpenChunk", "PutOutcome", "stored_bytes"]

log = logging.getLogger("stratastore.adapters.lmcache")

_MAX_LAYOUT_BYTES = 1 << 16
_STORE_COUNTERS = frozenset(f.name for f in fields(ChunkCounters))


class LMCacheChunks:
    """The plugin's chunks on the levels of a chunk store; thread-safe. Use :meth:`open` (one
    directory) or :meth:`open_levels`."""

    def __init__(self, pages: chunk_layer.ChunkStore) -> None:
        #: the chunk store the chunks live in (its levels, first to last)
        self.pages = pages
        self.layout: ChunkLayout | None = None
        self._own = PluginCounters()  #: put_errors, alloc_failures (the rest: the store's)
        self._lock = threading.Lock()  #: the plugin's counters (never held over I/O)
        self._layout_lock = threading.Lock()
        self._refused_layout = False
        self._layout_warned = False

    @classmethod
    def open(
        cls,
        path: str,
        fingerprint: ModelFingerprint,
        budget_bytes: int,
        *,
        file_mode: int = DEFAULT_FILE_MODE,
    ) -> LMCacheChunks:
        """:meth:`open_levels` on one directory level ``path`` of ``budget_bytes`` (the
        plugin's ``dir`` + ``budget_mib``)."""
        level = ChunkLevel(path, budget_bytes, settings={"file_mode": file_mode})
        return cls.open_levels(ChunkConfig((level,), name=CHUNK_NAME), fingerprint)

    @classmethod
    def open_levels(cls, config: ChunkConfig, fingerprint: ModelFingerprint) -> LMCacheChunks:
        """Open (create) the levels of ``config`` and read the layout record if one of them
        holds it. Raises what opening the chunk store raises
        (:class:`~stratastore.format.IncompatibleFingerprint`: another model's level),
        :class:`~stratastore.chunks.KeptRecordConflict` when levels hold the layouts of two
        engine configurations, and
        :class:`~stratastore.format.FormatError` naming the layout record and the fix when that
        record cannot be read (``strata fsck --repair`` quarantines a damaged one; the next put
        records the layout again, and the chunks stay)."""
        pages = chunk_layer.ChunkStore.open(config, fingerprint, keep=(LAYOUT_ID,))
        try:
            chunks = cls(pages)
            try:
                chunks.layout = chunks._read_layout()
            except KeptRecordConflict:
                raise  # engines of two configurations share a level: its message names the fix
            except StrataError as e:
                raise FormatError(
                    f"the LMCache chunk layout record {data_name(stored_key(LAYOUT_ID))} in "
                    f"{chunks.where} cannot be read ({type(e).__name__}: {e}); "
                    f"{chunks.repair_hint}: it quarantines a damaged record, the chunks stay, "
                    "and the next put records the layout again"
                ) from e
        except BaseException:
            pages.close()
            raise
        return chunks

    @property
    def where(self) -> str:
        """The levels as messages name them, first to last (a URL by its scheme alone)."""
        return ", ".join(lv.shown for lv in self.pages.config.levels)

    @property
    def repair_hint(self) -> str:
        """What repairs a damaged layout record: ``strata fsck --repair`` of the directory
        levels (it quarantines the record); a shared level's copy no tool repairs, so the fix
        there is a fresh namespace (another ``name`` in the level's settings)."""
        dirs = [
            b.path
            for lv, b in zip(self.pages.config.levels, self.pages.backends, strict=True)
            if scheme_of(str(lv.spec)) in ("", "file")
        ]
        hint = f"run `strata fsck --repair --yes {' '.join(dirs)}`" if dirs else ""
        if len(dirs) < len(self.pages.backends):
            shared = (
                "a copy on a Redis level strata fsck cannot set aside: give that level another "
                "`name` in its settings, a fresh namespace"
            )
            hint = f"{hint} ({shared})" if hint else shared
        return hint

    @property
    def budget_bytes(self) -> int:
        """The first level's budget: what a put makes room in."""
        return self.pages.room.budget_bytes

    @property
    def closed(self) -> bool:
        return self.pages.closed

    def close(self) -> None:
        self.pages.close()

    @property
    def counters(self) -> PluginCounters:
        """The plugin's counters as they are now (a snapshot: the store's and its own)."""
        return PluginCounters(**self._counts())

    def _counts(self) -> dict[str, int]:
        store = self.pages.counters.as_dict()  # ints, each read whole: no I/O, after close too
        with self._lock:
            own = self._own.as_dict()
        return {name: store[name] if name in _STORE_COUNTERS else own[name] for name in own}

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``counter`` (a field of :class:`PluginCounters`)."""
        if counter in _STORE_COUNTERS:
            self.pages.count(counter, n)
            return
        with self._lock:
            setattr(self._own, counter, getattr(self._own, counter) + n)

    # -- the layout ---------------------------------------------------------------------------
    def _read_layout(self) -> ChunkLayout | None:
        """The layout the record holds, from whichever level holds it; None when none does."""
        raw = self.pages.get_kept(LAYOUT_ID, max_bytes=_MAX_LAYOUT_BYTES)
        if raw is None:
            return None
        name = f"the chunk layout record {stored_key(LAYOUT_ID).hex()} in {self.where}"
        return ChunkLayout.decode(raw, name)

    def known_layout(self) -> ChunkLayout | None:
        """The layout, re-read from its record when this process does not know it yet (another
        process may have recorded it since this one opened the levels); None when there is no
        readable record (a miss for every chunk, never damage)."""
        if self.layout is not None:
            return self.layout
        with self._layout_lock:
            if self.layout is None:
                try:
                    self.layout = self._read_layout()
                except StrataError as e:
                    if not self._layout_warned:
                        self._layout_warned = True
                        log.error(
                            "stratastore: the LMCache chunk layout record %s in %s cannot "
                            "be read (%s: %s): every get is a miss (no chunk is removed); %s",
                            data_name(stored_key(LAYOUT_ID)),
                            self.where,
                            type(e).__name__,
                            e,
                            self.repair_hint,
                        )
            return self.layout

    def accepts(self, layout: ChunkLayout) -> bool:
        """Whether chunks of ``layout`` may be stored here: the recorded layout, or the first
        (then recorded durably, before any chunk of it, on every level, the last first; when
        no level took it the chunk is refused, counted in ``puts_refused``). Another layout,
        this process's or one a shared level took first, is refused, and logged once: one
        chunk store holds the chunks of one engine configuration. A record that cannot be read
        raises (the put fails)."""
        with self._layout_lock:
            if self.layout is None:
                if self.pages.put_kept(LAYOUT_ID, layout.encode()) == "refused":
                    self.count("puts_refused")
                    return False
                self.layout = self._read_layout()  # another process may have recorded first
            if self.layout == layout:
                return True
            first = not self._refused_layout
            self._refused_layout = True
        self.count("puts_refused")
        if first:
            log.error(
                "stratastore: %s holds LMCache chunks of layout %s; chunks of layout %s "
                "are not stored: give each engine configuration its own levels",
                self.where,
                None if self.layout is None else self.layout.encode().decode(),
                layout.encode().decode(),
            )
        return False

    # -- chunks -------------------------------------------------------------------------------
    def put(self, chunk_id: bytes, payload: memoryview) -> PutOutcome:
        """Store a chunk's bytes, durably (:meth:`ChunkStore.put
        <stratastore.chunks.ChunkStore.put>`)."""
        return self.pages.put(chunk_id, payload)

    def contains(self, chunk_id: bytes) -> bool:
        return self.pages.exists(chunk_id)

    def open_chunk(self, chunk_id: bytes) -> OpenChunk | None:
        """The chunk held open for :meth:`copy_into`, or None: not stored or layout unknown (a
        miss), unreadable (a miss counted in ``read_errors``), or damaged, its size no whole
        number of tokens included (counted, logged, removed if its files are still the ones
        that failed)."""
        if self.closed:
            return None
        layout = self.known_layout()
        if layout is None:  # this process cannot tell: a miss, never damage
            self.count("misses")
            return None
        chunk = self.pages.open_chunk(chunk_id)
        if chunk is not None and layout.tokens_for(chunk.payload_bytes) is None:
            self.pages.reject(
                chunk,
                f"{chunk.payload_bytes} bytes are no whole number of tokens of the chunk layout "
                f"of {self.where}",
            )
            return None
        return chunk

    def tokens_of(self, chunk: OpenChunk) -> int:
        """The token count of a chunk :meth:`open_chunk` returned."""
        assert self.layout is not None  # open_chunk() found its token count through it
        tokens = self.layout.tokens_for(chunk.payload_bytes)
        assert tokens is not None
        return tokens

    def copy_into(self, chunk: OpenChunk, dst: memoryview) -> bool:
        """Fill ``dst`` (the chunk's payload size, memory no one else sees yet) with the
        chunk, validated where it lands; closes the chunk. False when the copy failed
        (:meth:`ChunkStore.read_into <stratastore.chunks.ChunkStore.read_into>`)."""
        return self.pages.read_into(chunk, dst)

    def pin(self, chunk_id: bytes) -> bool:
        """Pin a stored chunk (:meth:`ChunkStore.pin <stratastore.chunks.ChunkStore.pin>`)."""
        return not self.closed and self.pages.pin(chunk_id)

    def unpin(self, chunk_id: bytes) -> bool:
        return self.pages.unpin(chunk_id)

    def pinned(self, chunk_id: bytes) -> bool:
        return self.pages.pinned(chunk_id)

    def remove(self, chunk_id: bytes, *, force: bool = True) -> bool:
        """Delete a chunk (with ``force``, pins and all); False when it was not stored or, without
        ``force``, is pinned."""
        return self.pages.remove(chunk_id, force=force)

    def entries(self) -> int:
        """How many chunks are stored (the layout record aside)."""
        return self.pages.entries()

    def stats(self) -> dict[str, int]:
        """:class:`PluginCounters` (the store's and the plugin's own) and what the levels hold
        (all levels: ``entries``, ``used_bytes``, ``budget_bytes``; ``degradations``: chunks
        moved down a level)."""
        doc = self.pages.stats()
        out = self._counts()
        held = ("in_flight_bytes", "pinned", "entries", "used_bytes", "budget_bytes")
        for name in (*held, "degradations"):
            out[name] = doc[name]
        return out


#: the name the plugin's chunks had before the chunk layer (kept for their users)
ChunkStore = LMCacheChunks
