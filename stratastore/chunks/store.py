"""The chunk store: pages keyed by content, on the levels every engine API shares.

Engines that key their cache by a page's content hash (LMCache's chunks, SGLang HiCache's
``get/set/exists`` by page hash) keep their pages here; engines that know conversations use
:class:`~stratastore.Store`. Both sit on the same levels: a chunk store is its levels, first to
last, each opened through the registry (:func:`~stratastore.levels.registry.open_level`: a
directory, ``memory://NAME``, the Redis level), with the levels' budgets and the cascade
(:mod:`~stratastore.chunks.room`).

Contracts:

- **Keys** (:mod:`~stratastore.chunks.keys`): a page is named by a 32-byte chunk key and stored
  as the running-state segment ``state_key(key)`` (spec F-KEY-5), in pages of 1 MiB each
  BLAKE3-hashed in its sidecar (F-SC-3).
- **Puts** go to the first level, durably as that level is (a directory: data file written and
  fsynced, renamed in, directory fsynced, sidecar written durably, indexed: F-DUR), after making
  room (the oldest pages degrade to the next level; only the last level deletes, never a pinned
  page or a kept key). A put returns ``"stored"`` once committed, ``"present"`` when the page
  was held already (nothing written, nothing evicted; never a copy whose data file is gone: a
  stat says so, and that copy is damage, below), ``"refused"`` when it cannot fit; a write that
  fails raises (a :class:`~stratastore.errors.StrataError`) and leaves nothing.
- **Reads** look in each level, first to last, and deliver a page only after every page of it
  was hashed in the caller's memory (:mod:`~stratastore.chunks.reads`). A copy that fails
  validation (a checksum, a damaged or foreign header or sidecar, a truncated file) is a miss,
  counted in ``damaged``, logged, and removed from its level so the next put writes it again:
  only if it is still the copy read (its index record unchanged since it was opened; under the
  level's commit lock where the level has one). A copy whose data file is gone (its sidecar
  and index record left: fsck's ``DATA_MISSING``) is damage too, met by a read or a put; a
  directory sets its sidecar aside into ``strata-quarantine/`` as repair does (spec F-DUR-7),
  never unlinks it. Any other failure (an I/O error, a level that cannot be reached, the store
  closing) is a miss counted in ``read_errors``; nothing is removed.
- **Pins** hold a page against eviction and ``remove(force=False)`` until unpinned (in this
  process); a pin of a page not held, or being deleted, fails.
- **Kept records** (:mod:`~stratastore.chunks.kept`): a record an adapter keeps beside its
  pages under a ``keep`` key (the LMCache plugin's chunk layout) is put and read through the
  store (:meth:`ChunkStore.put_kept`, :meth:`ChunkStore.get_kept`) on whichever level holds
  it; no eviction takes it and no failed read removes it.
- **Thread-safe**: any method from any thread; no lock is held over I/O but the one that makes
  room (one put's eviction at a time).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

from stratastore.chunks.config import ChunkConfig, ChunkLevel
from stratastore.chunks.counters import ChunkCounters
from stratastore.chunks.failures import ReadFailures
from stratastore.chunks.kept import get_record, put_record
from stratastore.chunks.keys import ChunkKeyError, stored_key
from stratastore.chunks.puts import PutOutcome, check_batch, put_pages
from stratastore.chunks.reads import DAMAGE, OpenChunk, buffer_view, fill_validated
from stratastore.chunks.room import ChunkRoom
from stratastore.errors import ConfigError, StrataError
from stratastore.format import FormatError, IndexRecord, Kind, Level, ModelFingerprint
from stratastore.levels.backend import SegmentBackend, SharedBackend
from stratastore.levels.cascade import DiskLevel, open_cascade
from stratastore.levels.directory import shared_directory
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.reader import open_checked
from stratastore.levels.registry import open_level, scheme_of
from stratastore.levels.sealing import Buffer
from stratastore.metrics.counters import CHUNKS, COUNTERS
from stratastore.metrics.prometheus import prometheus_text

__all__ = ["ChunkStore", "ChunkStoreClosed", "PutOutcome"]

log = logging.getLogger("stratastore.chunks")


class ChunkStoreClosed(StrataError):
    """A put, pin or removal on a chunk store after :meth:`ChunkStore.close`."""


#: how many of a level's oldest segments the open looks at for a conversation store's K/V
_LOOK_AT = 8


def _refuse_a_conversation_level(backend: SegmentBackend, spec: ChunkLevel) -> None:
    """A :class:`~stratastore.errors.ConfigError` when one of the level's oldest segments holds
    K/V pages (spec F-SC-4: kind KV), which a chunk store never writes: the level is a
    conversation store's, whose segments its evictions and moves would take from under that
    store's catalog. O(log n) a segment looked at (the level's age order)."""
    for n, (_, rec) in enumerate(backend.oldest()):
        if rec.kind is Kind.KV:
            raise ConfigError(
                f"chunk level {spec.shown} holds a conversation store's K/V segments (a Store's "
                "level): a chunk store evicts and moves its levels' oldest segments, so give it "
                "a level of its own"
            )
        if n + 1 >= _LOOK_AT:
            return


def _refuse_one_directory_twice(cfg: ChunkConfig) -> None:
    """A :class:`~stratastore.errors.ConfigError` naming both specs when two directory levels
    are one directory (a trailing slash, ``.``/``..``, a symbolic link, a bind mount: the check
    a ``Store``'s levels get, :func:`~stratastore.levels.directory.shared_directory`): the
    levels would share its commit lock, and the first page moved down from one into the other
    would wait on itself forever."""
    dirs = [lv for lv in cfg.levels if scheme_of(str(lv.spec)) in ("", "file")]
    same = shared_directory([str(lv.spec) for lv in dirs])
    if same is not None:
        first, second, real = dirs[same[0]], dirs[same[1]], same[2]
        raise ConfigError(
            f"chunk levels {first.shown!r} and {second.shown!r} are the same directory "
            f"({real}); give the level {second.shown!r} a directory of its own (or leave it "
            "out of the ChunkConfig)"
        )


def refuse_closed(store: ChunkStore, what: str) -> None:
    """:class:`ChunkStoreClosed` for ``what`` (a put, pin, removal, GC) on a closed store."""
    if store.closed:
        raise ChunkStoreClosed(
            f"{what} on a closed chunk store ({store.levels[0].store.path}); open it again"
        )


class ChunkStore(AbstractContextManager["ChunkStore"]):
    """Pages keyed by content on a chain of levels (the module docstring is the contract).
    Use :meth:`open`; close it (or use it as a context manager)."""

    def __init__(
        self,
        levels: Sequence[DiskLevel],
        config: ChunkConfig,
        keep: frozenset[bytes],
        fingerprint: ModelFingerprint,
    ):
        self.config = config
        self.fingerprint = fingerprint  #: the model every page read is checked against
        self.levels = tuple(levels)  #: first (puts) to last (deletes)
        self.counters = ChunkCounters()
        self._lock = threading.Lock()  #: the counters (never held over I/O)
        #: the stored keys of the records kept beside the pages (``keep`` at open)
        self.kept = keep
        #: the budgets, the cascade, the puts in flight and the pins
        self.room = ChunkRoom(self.levels, keep=keep, count=self.count)
        self.closed = False
        #: what a failed read does (damage removed, other failures kept)
        self.failures = ReadFailures(config.name, self.room, self.count, lambda: self.closed)

    @classmethod
    def open(
        cls,
        config: ChunkConfig | Sequence[ChunkLevel],
        fingerprint: ModelFingerprint,
        *,
        keep: Iterable[bytes] = (),
    ) -> ChunkStore:
        """Open the levels of ``config`` (a :class:`ChunkConfig`, or its levels), first to last,
        for the model ``fingerprint``, each through the registry: the last seals its segments as
        the cold level, the others as warm (spec F-SC-5). A shared level (Redis) is reached once,
        now. ``keep``: the chunk keys of records an adapter keeps beside its pages
        (:meth:`put_kept`, :meth:`get_kept`), which no eviction takes.
        Raises what ``open_level`` raises (:class:`~stratastore.errors.ConfigError` for a spec
        no backend serves, :class:`~stratastore.format.IncompatibleFingerprint` for another
        model's level, :class:`~stratastore.io.StrataIOError` for a level that cannot be
        reached) and a ``ConfigError`` for a level that holds a conversation store's K/V (a
        chunk store needs levels of its own) and for two levels on one directory (however
        each names it: a trailing slash, ``..``, a symbolic link, a bind mount), before any
        level is opened; every level opened is closed again on failure."""
        cfg = config if isinstance(config, ChunkConfig) else ChunkConfig(tuple(config))
        _refuse_one_directory_twice(cfg)
        n = len(cfg.levels)

        def open_one(i: int, next_level: DiskLevel | None) -> DiskLevel:
            spec = cfg.levels[i]
            byte = Level.WARM if i == 0 and n > 1 else Level.COLD
            backend = open_level(spec.spec, fingerprint, byte, spec.settings)
            try:
                if isinstance(backend, SharedBackend) and backend.shared:
                    backend.connect()
                _refuse_a_conversation_level(backend, spec)
                return DiskLevel(
                    f"{cfg.name} level {spec.shown}",
                    backend,
                    spec.budget_bytes,
                    max_age_s=spec.max_age_s,
                    when_full=cfg.when_full,
                    next_level=next_level,
                )
            except BaseException:
                backend.close()
                raise

        opened = open_cascade(n, open_one)
        return cls(opened, cfg, frozenset(stored_key(k) for k in keep), fingerprint)

    @property
    def backends(self) -> tuple[SegmentBackend, ...]:
        """Each level's backend, first to last."""
        return tuple(lvl.store for lvl in self.levels)

    def close(self) -> None:
        """Close every level; idempotent. Puts, pins and removals after it raise
        :class:`ChunkStoreClosed`; reads are misses."""
        if self.closed:
            return
        self.closed = True
        for lvl in self.levels:
            lvl.store.close()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def count(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``counter`` (a field of :class:`ChunkCounters`)."""
        with self._lock:
            setattr(self.counters, counter, getattr(self.counters, counter) + n)

    # -- putting ------------------------------------------------------------------------------
    def put(self, key: bytes, data: Buffer) -> PutOutcome:
        """Store the page ``data`` under the chunk key ``key``, durably as the first level is,
        making room first (the module docstring). ``data`` that is not bytes-like, not
        C-contiguous or empty is a :class:`~stratastore.levels.errors.StoreError`, before
        anything is done; a write that fails raises."""
        (r,) = self.put_many([key], [data])
        if isinstance(r, StrataError):
            raise r
        return r

    def batch_put(self, keys: Sequence[bytes], pages: Sequence[Buffer]) -> list[PutOutcome]:
        """:meth:`put_many`, raising the first write that failed once every page was put (the
        others are stored)."""
        out = self.put_many(keys, pages)
        for r in out:
            if isinstance(r, StrataError):
                raise r
        return [r for r in out if not isinstance(r, StrataError)]

    def put_many(
        self, keys: Sequence[bytes], pages: Sequence[Buffer]
    ) -> list[PutOutcome | StrataError]:
        """:meth:`put` of each page, committed together where the first level can (a
        directory: each page's files written and fsynced, then one group commit, spec
        F-DUR-2): for each page its outcome, or the :class:`~stratastore.errors.StrataError`
        its write raised (nothing of that page left; the others are put). Room is made for
        each page in turn; when the batch's own pages in flight leave no room, those are
        committed first, so a batch stores what puts one at a time would. A key twice is
        put once (the later ones ``"present"``). A key that is not a chunk key, a page that is
        not a bytes-like, C-contiguous, non-empty buffer, or as many pages as keys it is not
        (:class:`~stratastore.chunks.puts.BatchMismatch`), raises before any page is put."""
        return put_pages(self, keys, pages)

    # -- records kept beside the pages (:mod:`~stratastore.chunks.kept`) ----------------------
    def put_kept(self, key: bytes, data: Buffer) -> PutOutcome:
        """Store the record ``data`` under ``key``, one of the ``keep`` keys given at open, on
        every level, the last first, each durably as that level is (room made on the first as
        for a page): ``"stored"`` when some level took it; ``"present"`` when every level held
        it already, or when a level holds another record under ``key`` (nothing is written
        above that level, nothing replaced: :meth:`get_kept` then raises
        :class:`~stratastore.chunks.kept.KeptRecordConflict` where the levels differ);
        ``"refused"`` when the first level, the only one, has no room. Not counted as a page.
        No eviction takes it, ``remove`` refuses it, a read that fails removes nothing, and the
        cascade may move a copy down a level. A key not kept is a
        :class:`~stratastore.chunks.ChunkKeyError`; a write that fails raises."""
        return put_record(self, key, data)

    def get_kept(self, key: bytes, *, max_bytes: int) -> bytes | None:
        """The record kept at ``key`` (a ``keep`` key), every level's copy read validated
        (F-SC-3, F-READ-1); None when no level holds it or the store is closed. Copies that
        differ raise :class:`~stratastore.chunks.kept.KeptRecordConflict` (a ``ConfigError``
        naming the levels: stores of two configurations share one). When no copy can be read,
        what the first failed read raised (a :class:`~stratastore.errors.StrataError`: a
        damaged copy's ``ChecksumMismatch`` or ``FormatError``, a level's I/O error); nothing
        is counted or removed (``strata fsck --repair`` sets a damaged copy aside)."""
        return get_record(self, key, max_bytes)

    # -- looking up ---------------------------------------------------------------------------
    def exists(self, key: bytes) -> bool:
        """Whether a page is held on some level (its index or listing: no page is read)."""
        skey = stored_key(key)
        return not self.closed and self.room.holds(skey)

    __contains__ = exists
    contains = exists  #: LMCache's name for it

    def batch_exists(self, keys: Sequence[bytes]) -> int:
        """How many of ``keys``, from the first, are held (a prefix count, as HiCache's
        ``batch_exists``): a shared level (Redis) is asked about all of them in one call."""
        skeys = [stored_key(k) for k in keys]
        held = [False] * len(skeys)
        for lvl in () if self.closed else self.levels:
            todo = [i for i, h in enumerate(held) if not h]
            if not todo:
                break
            store = lvl.store
            if isinstance(store, SharedBackend):
                got = store.contains_many([skeys[i] for i in todo])
            else:
                got = [skeys[i] in store for i in todo]
            for i, g in zip(todo, got, strict=True):
                held[i] = g
        return next((i for i, h in enumerate(held) if not h), len(held))

    # -- reading ------------------------------------------------------------------------------
    def open_chunk(self, key: bytes) -> OpenChunk | None:
        """The page held open for :meth:`read_into` (first level that holds it), or None: not
        held or the store closed (a miss), unreadable (a miss counted in ``read_errors``), or
        damaged (counted, logged, removed if it is still the copy opened). Whatever the level
        answers is checked above the seam first
        (:func:`~stratastore.levels.reader.open_checked`): a sidecar of another key or model
        is damage."""
        skey = stored_key(key)
        if self.closed:
            return None
        for i, lvl in enumerate(self.levels):
            identity: IndexRecord | None = None
            try:
                identity = lvl.store.record(skey)
                reader = open_checked(
                    lvl.store, skey, self.fingerprint, kind=Kind.STATE, tokens=(0, 0)
                )
            except SegmentNotFound:
                continue  # not here (or moved down meanwhile: the next level has it)
            except DAMAGE as e:
                self.failures.damaged(lvl.store, skey, e, identity, None)
                return None
            except StrataError as e:
                self.failures.read_error(skey, e)
                return None
            return OpenChunk(key, i, reader, identity)
        self.count("misses")
        return None

    def read_into(self, chunk: OpenChunk, dst: Buffer) -> bool:
        """Fill ``dst`` (writable, exactly ``chunk.payload_bytes``, memory no one else reads
        yet) with the page, read straight into it and hashed there (F-SC-3); closes the chunk.
        False when the copy fails validation (damaged: counted, logged, removed if unchanged)
        or cannot be read (``read_errors``, kept): the caller then drops ``dst`` undelivered."""
        skey = stored_key(chunk.key)
        sealed = chunk.reader.sidecar.sealed_at_ns
        try:
            view = buffer_view(dst, writable=True)
        except StoreError:
            chunk.close()
            raise
        try:
            fill_validated(chunk, view)
        except DAMAGE as e:
            self.failures.damaged(self.levels[chunk.level].store, skey, e, chunk.identity, sealed)
            return False
        except StrataError as e:
            self.failures.read_error(skey, e)
            return False
        with self._lock:
            self.counters.hits += 1
            self.counters.hit_bytes += chunk.payload_bytes
        return True

    def get_into(self, key: bytes, out: Buffer) -> int | None:
        """Read the page into the start of ``out`` (writable, at least the page's size),
        validated: its size, or None for a miss (not held, damaged, unreadable; ``out`` may
        then hold bytes that failed and must not be used). A buffer too small is a miss; one
        that is not bytes-like or is read-only a :class:`~stratastore.levels.errors.StoreError`,
        before anything is read."""
        view = buffer_view(out, writable=True)
        chunk = self.open_chunk(key)
        if chunk is None:
            return None
        n = chunk.payload_bytes
        if view.nbytes < n:
            chunk.close()
            self.failures.read_error(
                stored_key(key),
                FormatError(f"the buffer holds {view.nbytes} bytes, the page {n}"),
            )
            return None
        return n if self.read_into(chunk, view[:n]) else None

    def get(self, key: bytes, *, max_bytes: int = 1 << 30) -> bytes | None:
        """The page as new bytes, validated; None for a miss (as :meth:`get_into`) or a page
        over ``max_bytes`` (nothing allocated for it)."""
        chunk = self.open_chunk(key)
        if chunk is None:
            return None
        if chunk.payload_bytes > max_bytes:
            chunk.close()
            return None
        out = bytearray(chunk.payload_bytes)
        return bytes(out) if self.read_into(chunk, out) else None

    def batch_get_into(self, keys: Sequence[bytes], outs: Sequence[Buffer]) -> list[int | None]:
        """:meth:`get_into` of each key into its buffer (a key that is not a chunk key, or as
        many buffers as keys it is not, :class:`~stratastore.chunks.puts.BatchMismatch`, raises
        before any page is read)."""
        check_batch(keys, outs, "buffers")
        for k in keys:
            stored_key(k)
        return [self.get_into(k, o) for k, o in zip(keys, outs, strict=True)]

    def reject(self, chunk: OpenChunk, why: str) -> None:
        """The caller found the open page unusable (its size fits no layout the engine knows):
        closed, counted in ``damaged``, logged with ``why``, and removed if it is still the copy
        opened."""
        chunk.close()
        self.failures.damaged(
            self.levels[chunk.level].store,
            stored_key(chunk.key),
            FormatError(why),
            chunk.identity,
            chunk.reader.sidecar.sealed_at_ns,
        )

    # -- pins, removal, GC --------------------------------------------------------------------
    def pin(self, key: bytes) -> bool:
        """Pin a held page: True when it is held and now pinned (no eviction or
        ``remove(force=False)`` deletes it until unpinned; it may still move down a level);
        False when it is not held or is being deleted."""
        skey = stored_key(key)
        refuse_closed(self, "pin")
        return self.room.pin(skey)

    def unpin(self, key: bytes) -> bool:
        """Drop one pin: True when the page was pinned or is held."""
        skey = stored_key(key)
        return self.room.unpin(skey) > 0 or (not self.closed and self.room.holds(skey))

    def pinned(self, key: bytes) -> bool:
        return self.room.pinned(stored_key(key))

    def remove(self, key: bytes, *, force: bool = True) -> bool:
        """Delete a page from every level (with ``force``, pins and all); False when it was not
        held or, without ``force``, is pinned (the check and the delete exclude a pin in
        between). A kept record's key (``keep``) is a :class:`~.keys.ChunkKeyError`: the store
        never deletes one."""
        skey = stored_key(key)
        if skey in self.kept:
            raise ChunkKeyError(
                f"chunk key {key.hex()[:16]} is a record the {self.config.name} store keeps "
                "(keep= at open): it is never removed; remove pages only"
            )
        refuse_closed(self, "remove")
        removed = False
        with self.room.deleting(skey, unless_pinned=not force) as marked:
            if not marked:
                return False
            try:
                for lvl in self.levels:
                    removed = lvl.store.delete(skey) or removed
            finally:
                self.room.drop_pins(skey)
        if removed:
            self.count("removes")
        return removed

    def gc(self) -> None:
        """Run the levels' GC now: pages past their level's ``max_age_s`` move down (the last
        level deletes them), and every level is brought within its budget (what was shrunk
        or written by another process), pinned pages and kept keys aside."""
        refuse_closed(self, "gc")
        self.room.collect()

    # -- what it holds ------------------------------------------------------------------------
    def entries(self) -> int:
        """How many pages the levels hold (kept keys aside)."""
        kept = sum(k in lvl.store for lvl in self.levels for k in self.kept)
        return sum(len(lvl.store) for lvl in self.levels) - kept

    def stats(self) -> dict[str, int]:
        """The counters (:class:`ChunkCounters`) and what the levels hold: ``entries``,
        ``used_bytes``, ``budget_bytes`` (all levels), ``in_flight_bytes``, ``pinned``,
        ``degradations`` (pages moved down a level)."""
        with self._lock:
            doc = self.counters.as_dict()
        doc["in_flight_bytes"] = self.room.in_flight_bytes()
        doc["pinned"] = self.room.pinned_count()
        doc["entries"] = self.entries()
        doc["used_bytes"] = sum(lvl.store.used() for lvl in self.levels)
        doc["budget_bytes"] = sum(lvl.budget for lvl in self.levels)
        doc["degradations"] = sum(lvl.counters.degradations for lvl in self.levels)
        return doc

    def info_line(self) -> str:
        """One line for a log: the store's name and each figure of :meth:`stats` as
        ``key=value``, in the counter table's order (the chunk store's rows:
        :mod:`stratastore.metrics.counters`)."""
        doc = self.stats()
        figures = " ".join(f"{c.key}={doc[c.key]}" for c in COUNTERS if c.owner == CHUNKS)
        return f"{self.config.name}: {figures}"

    def prometheus(self) -> str:
        """:meth:`stats` in the Prometheus text exposition format: the counter table's
        ``strata_chunk_*`` families (:func:`~stratastore.metrics.prometheus.prometheus_text`)."""
        return prometheus_text(self.stats())

    def describe(self) -> list[dict[str, int | str]]:
        """Each level, first to last: ``level`` (its backend's name for it, which shows no
        credential), ``entries``, ``used_bytes``, ``budget_bytes``."""
        return [
            {
                "level": lvl.store.path,
                "entries": len(lvl.store),
                "used_bytes": lvl.store.used(),
                "budget_bytes": lvl.budget,
            }
            for lvl in self.levels
        ]
