"""The content-addressed segment store of one directory (one disk level).

A *segment* is the pages of one object (the K/V of a token range, or a running state) in a data
file ``strata-conv-<key>.seg``, committed by its sidecar ``strata-conv-<key>.side`` (spec F-SC).
The LMDB index in ``strata-index/`` maps key -> record and is derived state (spec F-IDX).

Order of operations (spec F-DUR):

* **put**: hash the pages while writing the data file to a temp name and fsyncing it, then write
  the sidecar to a temp name and fsync it (no lock held); then, under the directory's write
  lock: if the key is already committed, drop both temp files (dedupe); else rename the data
  file in, fsync the directory, rename the sidecar in, fsync the directory, and index it. The
  puts waiting for the lock are committed together by whichever takes it (a group commit,
  :mod:`~stratastore.levels.local.group_commit`: one pass of renames and two directory fsyncs
  and one index transaction for the group, each put in this order). A crash before the sidecar's
  rename leaves at most an orphan data or temp file, which no reader sees. A committed sidecar
  whose data file is gone (fsck's ``DATA_MISSING``: no writer leaves one, so it is damage) is no
  copy to dedupe against: the put sets it aside first (below) and commits its own (spec
  F-DUR-7).
* **delete**: unindex, unlink the sidecar, fsync the directory, unlink the data file, fsync.
  A sidecar whose data file is gone is *set aside* instead, as ``strata fsck --repair`` does for
  ``DATA_MISSING``: unindexed and moved into ``strata-quarantine/``
  (:func:`~stratastore.io.quarantine.quarantine`), never unlinked; a put of its key or a move
  into this directory does the same under the lock before committing.
* **open**: list the directory; index every committed sidecar the index lacks (validating the
  sidecar and the data file's header and size with
  :func:`~stratastore.levels.inspect.inspect_segment`, the check fsck shares, not rehashing
  pages) and drop every record whose
  sidecar is gone. Opening never writes, renames or deletes a segment file. A segment name that
  is a symbolic link or not a regular file (a FIFO, a directory) is never followed or read: it
  is skipped and reported in :attr:`SegmentStore.skipped` (spec F-DIR-8).
* **files**: created with the store's ``file_mode`` (default ``0o600``; directories
  ``0o700``), spec F-DIR-9; every removal goes through the io layer's store-name guard.
* **get**: pages read with ``pread`` into memory this process owns and hashed there, delivered
  from that same memory only if they match; never mapped, so a file truncated or failing under a
  reader is a typed error, never a SIGBUS (spec F-SC-3). Readers take no lock. A segment deleted
  meanwhile (by this or another process) is :class:`SegmentNotFound`; a committed sidecar whose
  data file is gone is damage, :class:`~stratastore.levels.errors.DataMissing`.
* **relocate** (spec F-DUR-8): under both write locks (the source's, then this one's: callers
  keep that order), the data file made here by hard link on one volume or durable copy across
  two, this level's own sidecar written (its level, a new ``sealed_at``) and indexed, and only
  then the segment deleted from the source. Any failure undoes what was done here and leaves the
  segment whole in the source. A source of another kind goes through
  :func:`~stratastore.levels.relocation.relocate_by_copy`.
* **seal** (keys, page hashes, compression, sidecars; no I/O): :mod:`stratastore.levels.sealing`.
* **keyed** (spec F-KEYED): opened with ``keys``, the store seals every put with the first and
  reads (adopts at open, delivers) only sidecars keyed by one of them; any other is damage
  (:class:`~stratastore.format.NotAuthenticated`: not adopted, a miss), counted in
  :attr:`unauthenticated`. A directory several users can write is so safe from planted pages.
* **used / oldest**: counters and an age table kept in the index's own transactions
  (:mod:`stratastore.levels.local.index`), so neither grows with the store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError
from stratastore.format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
    Level,
    LevelKeys,
    ModelFingerprint,
    NotAuthenticated,
    SegmentHeader,
    Sidecar,
    data_name,
    encode_segment_header,
    encode_sidecar,
    parse_name,
    sidecar_name,
)
from stratastore.format.index_record import INDEX_SCHEMA
from stratastore.io import DurableFile, durable_write, files, guard
from stratastore.io.durable import prepared_file
from stratastore.io.errors import NotARegularFile, NotAStoreName, StrataIOError, SymlinkRefused
from stratastore.io.modes import DEFAULT_FILE_MODE, file_mode_problem
from stratastore.io.quarantine import quarantine
from stratastore.io.relocate import link_or_copy
from stratastore.io.system import filesystem_type
from stratastore.levels.backend import PutResult, StoreStats
from stratastore.levels.common import SealedLevel
from stratastore.levels.errors import DataMissing, SegmentNotFound, StoreError
from stratastore.levels.inspect import inspect_segment
from stratastore.levels.local.group_commit import GroupCommit
from stratastore.levels.local.index import FINGERPRINT_KEY, SegmentIndex
from stratastore.levels.local.sidecar_cache import SidecarCache
from stratastore.levels.reader import SegmentReader, require_valid
from stratastore.levels.relocation import Relocated, relocate_by_copy, resealed
from stratastore.levels.sealing import (
    STATE_PAGE_BYTES,
    Buffer,
    Unsealed,
    check_sealed,
    encode,
    rekeyed,
    sidecar_for,
)
from stratastore.levels.streamed import CHUNK

if TYPE_CHECKING:
    from stratastore.levels.backend import SegmentBackend

__all__ = [
    "STATE_PAGE_BYTES",
    "PutResult",
    "SegmentStore",
    "Skipped",
    "StoreStats",
    "WRITE_CHUNK",
]

WRITE_CHUNK = CHUNK  #: bytes a put writes at a time (and a streamed put gathers)
#: bytes of a data file a prefetch asks the kernel for (a restore's first two 16 MiB chunks;
#: the read pass asks for the rest as it goes, :data:`stratastore.restore.reads.AHEAD_CHUNKS`)
PREFETCH_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class Skipped:
    """A ``strata-conv-`` sidecar that open did not adopt, and why (fsck reports it too)."""

    name: str
    reason: str
    error: str  #: the error's class name (FormatError, ChecksumMismatch, ...)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A put ready to commit: its data file and sidecar written to temp names and fsynced."""

    data: DurableFile
    side: DurableFile
    sc: Sidecar
    header: SegmentHeader

    @property
    def record(self) -> IndexRecord:
        return IndexRecord.from_sidecar(self.sc, self.side.written, self.header.file_bytes)

    def drop(self) -> None:
        """Remove both temp files (best effort, as :meth:`DurableFile.abort`)."""
        self.data.abort()
        self.side.abort()


def _one(r: PutResult | StrataError) -> PutResult:
    if isinstance(r, StrataError):
        raise r
    return r


def _answered(out: list[PutResult | StrataError | None]) -> list[PutResult | StrataError]:
    """``out`` with every put answered (a put left unanswered is a bug: said, never dropped,
    so the answers stay aligned with the puts)."""
    if any(r is None for r in out):
        raise StoreError(f"{out.count(None)} of {len(out)} puts were not answered")
    return [r for r in out if r is not None]


class SegmentStore(SealedLevel):
    """Segments of one model in one directory; thread-safe, one writer at a time per directory
    across processes, readers never block. Use :meth:`open`. The module docstring is the order
    of its operations.

    The first implementation of the level protocol
    :class:`~stratastore.levels.backend.SegmentBackend` (checked there, statically).
    """

    persistent = True
    shared = False
    chain_index = False  #: chains are in the manifests and the catalog, not walked here
    hosts_catalog = True  #: the catalog's tables go in this directory's LMDB environment

    def __init__(
        self,
        path: str,
        fingerprint: ModelFingerprint,
        level: Level,
        file_mode: int = DEFAULT_FILE_MODE,
        keys: LevelKeys | None = None,
    ) -> None:
        self.path = path
        self.level_keys = keys
        self.unauthenticated = 0  #: sidecars refused as not keyed by one of ``keys``
        self._count_lock = threading.Lock()
        self.fingerprint = fingerprint
        self.level = level
        self.file_mode = file_mode
        self.root_key = fingerprint.digest()
        self.skipped: list[Skipped] = []
        self._lock = threading.Lock()
        #: the puts waiting for the write lock, committed together (F-DUR-2)
        self._group: GroupCommit[_Prepared, PutResult] = GroupCommit(
            self._write_lock, self._commit_group, f"segment store {path}"
        )
        self._index = SegmentIndex(path, file_mode=file_mode)
        #: sidecars checked or written here, by key and record: a read reads only the data file
        self._sidecars = SidecarCache()
        try:
            self._flock = files.FileLock(
                os.path.join(self._index.path, "write.lock"), mode=file_mode
            )
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self._index.close()
            raise

    def catalog_tables(self) -> SegmentIndex:
        """The environment the shared catalog's tables live in: this directory's index
        (spec F-CAT-1; :class:`~stratastore.levels.backend.CatalogHost`)."""
        return self._index

    @property
    def index(self) -> SegmentIndex:
        """This directory's LMDB index (the environment the shared catalog also uses when
        this is the last level, F-CAT-1)."""
        return self._index

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        fingerprint: ModelFingerprint,
        *,
        level: Level = Level.COLD,
        create: bool = True,
        mountinfo: str = "/proc/self/mountinfo",
        file_mode: int = DEFAULT_FILE_MODE,
        keys: LevelKeys | None = None,
    ) -> SegmentStore:
        """Open (and with ``create``, make) the store in ``path`` and reconcile its index.

        Files this store creates get ``file_mode`` and directories it creates
        ``dir_mode(file_mode)`` (spec F-DIR-9: ``0o600`` / ``0o700`` by default). ``keys``:
        the level is keyed (spec F-KEYED; see the module).

        Raises :class:`StoreError` for a missing directory (without ``create``), one on a
        network filesystem or a bad ``file_mode``, :class:`IncompatibleFingerprint` when the
        directory holds another model's segments, :class:`SymlinkRefused` /
        :class:`NotARegularFile` when ``strata-index/`` (or a file in it) is a symbolic link or
        not what it must be (spec F-DIR-8).
        """
        problem = file_mode_problem(file_mode)
        if problem is not None:
            raise StoreError(f"file_mode {problem}; use 0o600 (private) or 0o640 (group)")
        path = os.path.abspath(os.fspath(path))
        if create:
            files.makedirs(path, mode=file_mode)
        elif not os.path.isdir(path):
            raise StoreError(f"store directory {path} does not exist; create it or pass create")
        fstype = filesystem_type(path, mountinfo)
        if fstype in files.NETWORK_FILESYSTEMS:
            raise StoreError(
                f"store directory {path} is on a {fstype} filesystem; its LMDB index cannot live "
                "on a network filesystem: use a local disk"
            )
        store = cls(path, fingerprint, level, file_mode, keys)
        try:
            with store._write_lock():  # no commit or delete may interleave with the listing
                store._reconcile()
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def fingerprint_in(path: str) -> ModelFingerprint | None:
        """The model of level directory ``path``: that of its first committed sidecar that
        decodes (:func:`~stratastore.levels.inspect.inspect_segment`, the check open and fsck
        share), so a tool (``strata inspect``) can open a level without being told its model.
        None when it holds no sidecar; when not one decodes, the first one's typed error."""
        first: StrataError | None = None
        for name in sorted(files.listdir(path)):
            parsed = parse_name(name)
            if parsed is None or parsed[1] != "side":
                continue
            key = parsed[0]
            got = inspect_segment(
                key,
                os.path.join(path, name),
                os.path.join(path, data_name(key)),
                depth="sidecar",
                unchecked=True,  # a keyed level's model reads without its key
            )
            if got.sidecar is not None:  # its key need not be its name's: open skips that one
                return got.sidecar.fingerprint
            assert got.damage is not None  # a link, a FIFO, a damaged one: open skips it
            first = first or got.damage.error
        if first is not None:
            raise first
        return None

    def _reconcile(self) -> None:
        on_disk: dict[bytes, set[str]] = {}
        for name in files.listdir(self.path):
            parsed = parse_name(name)
            if parsed is not None:
                on_disk.setdefault(parsed[0], set()).add(parsed[1])
        committed = {k for k, kinds in on_disk.items() if "side" in kinds}
        if self._index.schema() != INDEX_SCHEMA or not self._index.totals_ok():
            indexed: set[bytes] = set()
            rebuild = True
        else:
            indexed = set(self._index.keys())
            rebuild = False
        stored_fp = self._index.meta_get(FINGERPRINT_KEY)
        if stored_fp is not None and stored_fp != self.fingerprint.pack() and committed:
            self.fingerprint.require_same(ModelFingerprint.unpack(stored_fp), f"store {self.path}")
        adopted: dict[bytes, IndexRecord] = {}
        for key in sorted(committed - indexed):
            try:
                _, rec = self._inspect(key)
            except IncompatibleFingerprint:
                raise
            except (FormatError, ChecksumMismatch, StrataIOError, SegmentNotFound) as e:
                self.skipped.append(Skipped(sidecar_name(key), str(e), type(e).__name__))
                continue
            adopted[key] = rec
        dangling = sorted(indexed - committed)
        if rebuild:
            self._index.replace_all(adopted, self.fingerprint.pack())
        elif adopted or dangling:
            self._index.apply(adopted, dangling)
        if stored_fp != self.fingerprint.pack():
            self._index.meta_put(FINGERPRINT_KEY, self.fingerprint.pack())

    def close(self) -> None:
        self._flock.close()
        self._index.close()

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- files --------------------------------------------------------------------------------
    def _data_path(self, key: bytes) -> str:
        return os.path.join(self.path, data_name(key))

    def _sidecar_path(self, key: bytes) -> str:
        return os.path.join(self.path, sidecar_name(key))

    def _committed(self, key: bytes) -> bool:
        return files.exists(self._sidecar_path(key))

    def _has_data(self, key: bytes) -> bool:
        """Whether something is named as ``key``'s data file (an ``lstat`` through the io
        layer, nothing read): a link or a FIFO there is not gone (a reader refuses it, F-DIR-8)."""
        return files.lexists(self._data_path(key))

    def missing_data(self, key: bytes) -> DataMissing | None:
        """The damage when ``key``'s sidecar is here and its data file is gone (fsck's
        ``DATA_MISSING``), else None: two look-ups through the io layer, no byte read, so a
        put asks it before it calls a page present (the chunk store's
        :class:`~stratastore.chunks.reads.DataCheck`). Without the write lock a delete or a put
        of the key in another process may be half done; what acts on the answer checks again
        under the lock (:meth:`delete_if`, a put's commit)."""
        if self._has_data(key) or not self._committed(key):
            return None
        return DataMissing(self._data_path(key))

    def _set_aside_if_data_missing(self, key: bytes) -> bool:
        """Under the write lock: when ``key``'s sidecar is here and its data file gone (damage:
        no writer leaves that, F-DUR-2/5/8), drop its index record and move the sidecar into
        ``strata-quarantine/`` as ``strata fsck --repair`` does for ``DATA_MISSING``, never
        unlinking it (spec F-DUR-7). True when the sidecar was moved aside (the key may be
        committed again); False when the segment is whole or not here, or its sidecar cannot be
        moved (a link, a FIFO: left for fsck, reported in :attr:`skipped`)."""
        if self.missing_data(key) is None:
            return False
        self._index.delete(key)
        try:
            return quarantine(self._sidecar_path(key)) is not None
        except (SymlinkRefused, NotARegularFile, NotAStoreName) as e:
            self.skipped.append(Skipped(sidecar_name(key), str(e), type(e).__name__))
            return False

    def _read_sidecar(self, key: bytes) -> tuple[Sidecar, int]:
        """The sidecar of ``key`` and its size, checked (spec F-SC, F-KEY-6) for this store's
        model: its typed error when damaged, :class:`SegmentNotFound` when it is gone."""
        got = inspect_segment(
            key,
            self._sidecar_path(key),
            self._data_path(key),
            depth="sidecar",
            fingerprint=self.fingerprint,
            keys=self.level_keys,
        )
        if got.damage is not None:
            e = got.damage.error
            if isinstance(e, NotAuthenticated):
                with self._count_lock:  # (the commit lock may be held: a counter's own)
                    self.unauthenticated += 1
            if isinstance(e, StrataIOError) and e.errno == errno.ENOENT:
                raise SegmentNotFound(f"segment {key.hex()} was deleted from {self.path}") from e
            raise e
        assert got.sidecar is not None
        return got.sidecar, got.sidecar_bytes

    def _inspect(self, key: bytes) -> tuple[Sidecar, IndexRecord]:
        """Read and check a committed segment's sidecar and data header (no page hashing: what
        open adopts, spec F-IDX-3); the damage's typed error when it is damaged.
        :class:`SegmentNotFound` when it was deleted meanwhile (its sidecar is gone)."""
        sidecar = self._read_sidecar(key)
        got = inspect_segment(key, self._sidecar_path(key), self._data_path(key), sidecar=sidecar)
        if got.damage is not None and isinstance(got.damage.error, StrataIOError):
            self._raise_if_deleted(key, got.damage.error)
        return sidecar[0], got.record()

    def _raise_if_deleted(self, key: bytes, e: StrataIOError) -> None:
        """A data file that vanished under a read (``e``, ENOENT): :class:`SegmentNotFound` when
        the segment was deleted (its sidecar is gone too; another process moved or dropped it,
        or dropped it and wrote it again: its data file is back), else return (a committed
        sidecar without its data file is damage: the caller raises it)."""
        if e.errno == errno.ENOENT and self.missing_data(key) is None:
            raise SegmentNotFound(f"segment {key.hex()} was deleted from {self.path}") from e

    # -- reading ------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        return self._index.get(key) is not None

    __contains__ = contains

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """:meth:`contains` of each of ``keys``, in one read of the index."""
        return self._index.has_many(keys)

    def record(self, key: bytes) -> IndexRecord:
        rec = self._index.get(key)
        if rec is None:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}")
        return rec

    def sidecar(self, key: bytes) -> Sidecar:
        self.record(key)
        return self._read_sidecar(key)[0]

    def keys(self) -> list[bytes]:
        return self._index.keys()

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        """Every ``(key, record)`` of the index."""
        return list(self._index.items())

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._index)

    def stats(self) -> StoreStats:
        return StoreStats(len(self._index), self._index.used_bytes())

    def used(self) -> int:
        """Data-file plus sidecar bytes of every indexed segment: one index read, O(1)."""
        return self._index.used_bytes()

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        """``(key, record)`` of every segment, oldest ``sealed_at`` first, lazily (the index's
        ``ages`` table: O(log n) a row, no transaction held between rows)."""
        return self._index.oldest()

    def open_reader(self, key: bytes) -> SegmentReader:
        """The committed segment ``key`` held open for reads into memory the caller owns (the
        restore's read pass uses it; see :class:`SegmentReader`). Close it (a context manager).
        :class:`SegmentNotFound` when it is not here, or was deleted meanwhile;
        :class:`~stratastore.levels.errors.DataMissing` when its sidecar is here and its data
        file gone (damage: no read gets past it)."""
        rec = self.record(key)
        sc = self._sidecars.get(key, rec)
        if sc is None:
            sc = self._read_sidecar(key)[0]
            self._sidecars.put(key, rec, sc)
        try:
            return SegmentReader(sc, self._data_path(key))
        except StrataIOError as e:
            self._raise_if_deleted(key, e)
            if e.errno == errno.ENOENT:  # its sidecar is here, its data file gone: damage
                raise DataMissing(self._data_path(key)) from e
            raise

    def prefetch(self, key: bytes) -> bool:
        """Start reading the segment's data file into the page cache (a hint for a restore that
        comes soon: the batched agenda's read-ahead), its first :data:`PREFETCH_BYTES`. Never
        raises; False when it could not."""
        return files.advise_willneed(self._data_path(key), PREFETCH_BYTES)

    def view(self, key: bytes, *, verify: bool = True) -> npt.NDArray[np.uint8]:
        """A read-only uint8 array of the segment's pages (RAW codec only), read into new memory
        this process owns: never a mapping, so a file truncated or deleted later cannot fault
        the caller (it keeps what it got).

        With ``verify`` every page of that memory is hashed and a mismatch raises
        :class:`ChecksumMismatch`.
        """
        with self.open_reader(key) as seg:
            sc = seg.sidecar
            if sc.codec is not Codec.RAW:
                raise StoreError(
                    f"segment {key.hex()} is {sc.codec.name.lower()}-compressed and cannot be "
                    "viewed raw; use get_into"
                )
            payload = seg.pages()
        if verify:
            require_valid(sc, payload)
        payload.flags.writeable = False
        return payload

    def verify(self, key: bytes) -> int:
        """Hash every page of a segment: the first bad page, or -1 when all match."""
        with self.open_reader(key) as seg:
            return seg.first_bad_page()

    # -- writing ------------------------------------------------------------------------------
    def put_sealed(self, sidecar: Sidecar, stored: Buffer) -> PutResult:
        """Store a segment another level sealed: ``stored`` is its stored payload as
        ``sidecar`` describes it. Checked first (model, size, every page: spec F-SC-3), then
        committed here under this level's own sidecar (this level, sealed now) by the put
        protocol of F-DUR. An already committed key writes nothing (``created=False``)."""
        key = sidecar.key
        if self._committed(key) and self._index.get(key) is not None and self._has_data(key):
            return PutResult(key, False, 0)  # content-addressed: nothing to hash or write
        data = check_sealed(sidecar, stored, self.fingerprint)
        mine = resealed(rekeyed(sidecar, data, self.hasher), self.level)
        header = SegmentHeader(
            mine.kind, mine.codec, key, mine.page_count, mine.page_bytes, mine.stored_bytes
        )
        f = DurableFile(self._data_path(key), mode=self.file_mode).__enter__()
        try:
            f.write(encode_segment_header(header))
            f.write(data.data)
            f.prepare()
            side = prepared_file(self._sidecar_path(key), encode_sidecar(mine), mode=self.file_mode)
            try:
                prepared = _Prepared(f, side, mine, header)
            except BaseException:
                side.abort()
                raise
        except BaseException:
            f.abort()
            raise
        return _one(self._commit_prepared([prepared])[0])

    def _put(self, u: Unsealed, codec: Codec) -> PutResult:
        return _one(self._put_many([u], codec)[0])

    def _put_many(self, us: Sequence[Unsealed], codec: Codec) -> list[PutResult | StrataError]:
        """Each put's data file and sidecar written to temp names and fsynced without the
        lock, one after the other, then every one committed in one group commit (spec F-DUR-2;
        :mod:`~stratastore.levels.local.group_commit`). A key already committed writes nothing
        (``created=False``); a put that fails gets its error and the others go on."""
        out: list[PutResult | StrataError | None] = [None] * len(us)
        ready: list[tuple[int, _Prepared]] = []
        r: _Prepared | PutResult | None = None
        try:
            for i, u in enumerate(us):
                r = None
                try:
                    r = self._prepare(u, codec)
                except StrataError as e:
                    out[i] = e
                    continue
                if isinstance(r, PutResult):
                    out[i] = r
                else:
                    ready.append((i, r))
        except BaseException:
            if isinstance(r, _Prepared):  # prepared, perhaps not yet in ``ready``
                r.drop()
            for _, p in ready:
                p.drop()
            raise
        for (i, _), res in zip(ready, self._commit_prepared([p for _, p in ready]), strict=True):
            out[i] = res
        return _answered(out)

    def _commit_prepared(self, ready: Sequence[_Prepared]) -> list[PutResult | StrataError]:
        """Commit ``ready`` in the directory's group commit (:meth:`_commit_group`); the temp
        files of any put not committed are removed."""
        try:
            return self._group.commit_many(ready)
        finally:
            for p in ready:  # nothing for a put committed or dropped
                p.drop()

    def _prepare(self, u: Unsealed, codec: Codec) -> _Prepared | PutResult:
        """Hash ``u``'s pages while writing its data file to a temp name, fsync it, and write
        its sidecar to a temp name and fsync it (no lock held); ``created=False`` when the key
        is committed already (nothing written)."""
        if self._committed(u.key) and self._index.get(u.key) is not None and self._has_data(u.key):
            return PutResult(u.key, False, 0)
        enc = encode(u, codec, write_chunk=WRITE_CHUNK)
        header = SegmentHeader(u.kind, codec, u.key, u.page_count, u.page_bytes, enc.stored_bytes)
        data = DurableFile(self._data_path(u.key), mode=self.file_mode).__enter__()
        try:
            data.write(encode_segment_header(header))
            try:
                for chunk in enc.chunks:
                    data.write(chunk)
            finally:  # a stream left early waits for its workers, gives its staging back
                close = getattr(enc.chunks, "close", None)
                if close is not None:
                    close()
            data.prepare()
            sc = sidecar_for(u, enc, enc.hashes(), self.fingerprint, self.level)
            side = prepared_file(
                self._sidecar_path(sc.key), encode_sidecar(sc), mode=self.file_mode
            )
            try:
                return _Prepared(data, side, sc, header)
            except BaseException:
                side.abort()
                raise
        except BaseException:
            data.abort()
            raise

    def _commit_group(self, group: Sequence[_Prepared]) -> list[PutResult | StrataError]:
        """Under the write lock: commit ``group`` (the puts queued, each prepared) together,
        each in the order of F-DUR-2: every data file renamed in, the directory fsynced, every
        sidecar renamed in, the directory fsynced, every record indexed in one transaction.
        Keys committed already (or twice in the group) write nothing. A put that fails is undone
        and gets its error; a failure of the directory's fsync or of the index undoes every put
        of the group it covers; an interrupt undoes every put not yet indexed, then raises."""
        out: list[PutResult | StrataError | None] = [None] * len(group)
        first: dict[bytes, int] = {}  #: key -> the put of the group that commits it
        for i, p in enumerate(group):
            key = p.sc.key
            try:
                if key not in first and (
                    not self._committed(key) or self._set_aside_if_data_missing(key)
                ):
                    first[key] = i
                    continue
                p.drop()
                if key not in first:
                    self._ensure_indexed(key)
                    out[i] = PutResult(key, False, 0)
            except StrataError as e:
                p.drop()
                out[i] = e
        fresh = [i for i in first.values() if out[i] is None]
        renamed: list[int] = []
        try:
            for i in fresh:
                try:
                    group[i].data.rename()
                    renamed.append(i)
                except StrataError as e:
                    group[i].drop()
                    out[i] = e
            if renamed:
                files.fsync_dir(self.path)
            named = [i for i in renamed if self._rename_sidecar(group[i], out, i)]
            if named:
                files.fsync_dir(self.path)
                self._index.apply({group[i].sc.key: group[i].record for i in named}, [])
            for i in named:
                out[i] = PutResult(group[i].sc.key, True, group[i].sc.stored_bytes)
                self._sidecars.put(group[i].sc.key, group[i].record, group[i].sc)
        except BaseException as e:  # nothing of the group is indexed: undo what was renamed
            for i in renamed:
                if out[i] is None:
                    self._roll_back(group[i].sc.key)
                    out[i] = e if isinstance(e, StrataError) else None
            if not isinstance(e, StrataError):
                raise
        done: list[PutResult | StrataError] = []
        for i, (p, r) in enumerate(zip(group, out, strict=True)):
            if r is None:  # a key put twice in the group: as its first put went
                first_out = out[first[p.sc.key]]
                assert first_out is not None and first[p.sc.key] != i
                r = PutResult(p.sc.key, False, 0) if isinstance(first_out, PutResult) else first_out
            done.append(r)
        return done

    def _rename_sidecar(
        self, p: _Prepared, out: list[PutResult | StrataError | None], i: int
    ) -> bool:
        """Rename ``p``'s sidecar in (its data file is renamed in and fsynced): True, or its
        error in ``out[i]`` and the put undone."""
        try:
            p.side.rename()
            return True
        except StrataError as e:
            self._roll_back(p.sc.key)
            out[i] = e
            return False

    def _roll_back(self, key: bytes) -> None:
        """Make a put that failed after publishing its data file invisible again (best effort:
        if this fails too, what stays is a whole segment or an orphan file, never a torn one)."""
        try:
            self._index.delete(key)
            if self._remove(self._sidecar_path(key)):
                files.fsync_dir(self.path)
            self._remove(self._data_path(key))
        except StrataError:
            pass

    def _ensure_indexed(self, key: bytes) -> None:
        """Index a segment another writer committed but did not index (it crashed or is racing
        us to it); the caller holds the write lock."""
        if self._index.get(key) is None:
            _, rec = self._inspect(key)
            self._index.put(key, rec)

    @contextmanager
    def _write_lock(self) -> Iterator[None]:
        """The directory's commit lock (spec F-DUR-7): this process's threads, then flock."""
        with self._lock:
            self._flock.acquire()
            try:
                yield
            finally:
                self._flock.release()

    def delete(self, key: bytes) -> bool:
        """Remove a segment (spec F-DUR-5: unindex, unlink sidecar, fsync, unlink data, fsync;
        a sidecar whose data file is gone is set aside instead, F-DUR-7). Returns False when it
        was not there."""
        with self._write_lock():
            return self._delete_locked(key)

    def delete_if(self, key: bytes, still: Callable[[], bool]) -> bool:
        """:meth:`delete` ``key`` only if ``still()`` holds, asked under the directory's commit
        lock (spec F-DUR-7): no commit or delete of this or another process runs between the
        check and the delete (a reader that found a copy damaged removes that copy, never one
        written again since; a sidecar whose data file is gone is set aside, not unlinked).
        Returns whether it deleted."""
        with self._write_lock():
            return still() and self._delete_locked(key)

    def _delete_locked(self, key: bytes) -> bool:
        if self._set_aside_if_data_missing(key):  # DATA_MISSING: as repair does, F-DUR-7
            return True
        had_record = self._index.delete(key)
        self._sidecars.drop(key)
        had_sidecar = self._remove(self._sidecar_path(key))
        if had_sidecar:
            files.fsync_dir(self.path)
        had_data = self._remove(self._data_path(key))
        if had_data:
            files.fsync_dir(self.path)
        return had_record or had_sidecar

    def _remove(self, path: str) -> bool:
        """Unlink a segment file through the io layer's guard (spec F-DIR-8); a name that is a
        symbolic link or not a regular file is left alone and reported in :attr:`skipped` (it
        is not the store's: fsck reports it too). True when a file was removed."""
        try:
            return guard.remove_store_file(path, missing_ok=True)
        except (SymlinkRefused, NotARegularFile) as e:
            self.skipped.append(Skipped(os.path.basename(path), str(e), type(e).__name__))
            return False

    # -- relocating ---------------------------------------------------------------------------
    def relocate_from(self, src: SegmentBackend, key: bytes) -> Relocated:
        """Move the committed segment ``key`` from ``src`` (another level) into this store, all
        or nothing (spec F-DUR-8; the module docstring gives the order). From another directory
        store: hard link on one volume, durable copy across two; from any other backend:
        :func:`~stratastore.levels.relocation.relocate_by_copy` (read, validate, put, then drop
        it there). :class:`SegmentNotFound` when ``src`` does not hold ``key`` (another process
        moved or deleted it meanwhile); :class:`~stratastore.levels.errors.DataMissing` when its
        data file is gone there; ``"present"`` when this store already holds it whole (``src``'s
        copy is dropped; a copy here whose data file is gone is set aside and the move goes
        on)."""
        self.fingerprint.require_same(src.fingerprint, f"segment {key.hex()} of {src.path}")
        if not isinstance(src, SegmentStore) or _key_ids(src.level_keys) != _key_ids(
            self.level_keys
        ):
            return relocate_by_copy(self, src, key)  # re-keyed for this level (F-KEYED-4)
        with src._write_lock(), self._write_lock():
            missing = src.missing_data(key)
            if missing is not None:  # damage: the cascade discards it (sets it aside there)
                raise missing
            sc, _ = src._inspect(key)  # SegmentNotFound when src lost it meanwhile
            if self._committed(key) and not self._set_aside_if_data_missing(key):
                src._delete_locked(key)
                return "present"
            mine = resealed(sc, self.level)
            side = encode_sidecar(mine)
            guard.remove_store_file(self._data_path(key), missing_ok=True)  # a crashed move's
            try:
                how = link_or_copy(src._data_path(key), self._data_path(key))
                durable_write(self._sidecar_path(key), side, mode=self.file_mode)
                size = DATA_OFFSET + sc.stored_bytes
                self._index.put(key, IndexRecord.from_sidecar(mine, len(side), size))
            except BaseException:
                self._roll_back(key)
                raise
            try:
                src._delete_locked(key)
            except StrataError:
                if src._committed(key):  # still whole there: undo the copy here instead
                    self._roll_back(key)
                    src._reindex(key)
                    raise
                # its sidecar is gone, so the segment lives here alone; a leftover data file in
                # src is an orphan (invisible; fsck reports it)
        return how

    adopt = relocate_from  #: the name of 0.1 (levels/cascade.py, then tiers/disk.py)

    def _reindex(self, key: bytes) -> None:
        """Put back the record of a committed segment (after a failed move); best effort."""
        with contextlib.suppress(StrataError):
            if self._committed(key) and self._index.get(key) is None:
                self._index.put(key, self._inspect(key)[1])


def _key_ids(keys: LevelKeys | None) -> tuple[str, ...]:
    """A level's key ids (none: unkeyed): two levels of equal ids read each other's sidecars."""
    return () if keys is None else keys.key_ids
