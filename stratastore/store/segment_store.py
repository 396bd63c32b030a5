"""The content-addressed segment store of one directory (one disk level).

A *segment* is the pages of one object (the K/V of a token range, or a running state) in a data
file ``strata-conv-<key>.seg``, committed by its sidecar ``strata-conv-<key>.side`` (spec F-SC).
The LMDB index in ``strata-index/`` maps key -> record and is derived state (spec F-IDX).

Order of operations (spec F-DUR):

* **put**: hash the pages while writing the data file to a temp name and fsyncing it (no lock
  held); then, under the directory's write lock: if the key is already committed, drop the temp
  file (dedupe); else rename the data file in, fsync the directory, write the sidecar with the
  durable protocol, and index it. A crash before the sidecar's rename leaves at most an orphan
  data or temp file, which no reader sees.
* **delete**: unindex, unlink the sidecar, fsync the directory, unlink the data file, fsync.
* **open**: list the directory; index every committed sidecar the index lacks (validating the
  sidecar and the data file's header and size, not rehashing pages) and drop every record whose
  sidecar is gone. Opening never writes, renames or deletes a segment file.
* **get**: read the sidecar, map the data file, check its header, then hash every page and copy
  it to the caller only if it matches (``verify=True``, the default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import numpy as np
import numpy.typing as npt
import zstandard

import numba_kernels

from ..errors import StrataError
from ..format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
    Kind,
    Level,
    MediaRef,
    ModelFingerprint,
    SegmentHeader,
    Sidecar,
    data_name,
    decode_segment_header,
    decode_sidecar,
    encode_segment_header,
    encode_sidecar,
    parse_name,
    segment_key,
    sidecar_name,
    state_key,
)
from ..format.index_record import INDEX_SCHEMA
from ..format.sidecar import MAX_SIDECAR_BYTES
from ..io import DurableFile, durable_write, files
from ..io.errors import StrataIOError
from ..io.relocate import link_or_copy
from .errors import SegmentNotFound, StoreError
from .index import FINGERPRINT_KEY, SegmentIndex

__all__ = [
    "STATE_PAGE_BYTES",
    "PutResult",
    "SegmentStore",
    "Skipped",
    "StoreStats",
    "first_bad_page",
]

#: page size of running-state segments (their pages are not tied to tokens)
STATE_PAGE_BYTES = 1 << 20
_ZSTD_LEVEL = 1
_WRITE_CHUNK = 16 << 20

Buffer = npt.NDArray[np.uint8] | bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class PutResult:
    key: bytes
    created: bool  #: False when the key was already committed (nothing was written)
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    entries: int
    disk_bytes: int  #: data files plus sidecars of the indexed segments


@dataclass(frozen=True, slots=True)
class Skipped:
    """A ``strata-conv-`` sidecar that open did not adopt, and why (fsck reports it too)."""

    name: str
    reason: str
    error: str  #: the error's class name (FormatError, ChecksumMismatch, ...)


def _byte_view(buf: Buffer) -> memoryview:
    view = buf.data if isinstance(buf, np.ndarray) else memoryview(buf)
    if not view.c_contiguous:
        raise StoreError("payload buffers must be C-contiguous; pass np.ascontiguousarray(x)")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


class SegmentStore:
    """Segments of one model in one directory; thread-safe, one writer at a time per directory
    across processes (readers never block). Use :meth:`open`."""

    def __init__(self, path: str, fingerprint: ModelFingerprint, level: Level) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.level = level
        self.root_key = fingerprint.digest()
        self.skipped: list[Skipped] = []
        self._lock = threading.Lock()
        self._index = SegmentIndex(path)
        try:
            self._flock = files.FileLock(os.path.join(self._index.path, "write.lock"))
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self._index.close()
            raise

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
    ) -> SegmentStore:
        """Open (and with ``create``, make) the store in ``path`` and reconcile its index.

        Raises :class:`StoreError` for a missing directory (without ``create``) or one on a
        network filesystem, :class:`IncompatibleFingerprint` when the directory holds another
        model's segments.
        """
        path = os.path.abspath(os.fspath(path))
        if create:
            files.makedirs(path)
        elif not os.path.isdir(path):
            raise StoreError(f"store directory {path} does not exist; create it or pass create")
        fstype = files.filesystem_type(path, mountinfo)
        if fstype in files.NETWORK_FILESYSTEMS:
            raise StoreError(
                f"store directory {path} is on a {fstype} filesystem; its LMDB index cannot live "
                "on a network filesystem: use a local disk"
            )
        store = cls(path, fingerprint, level)
        try:
            with store._write_lock():  # no commit or delete may interleave with the listing
                store._reconcile()
        except BaseException:
            store.close()
            raise
        return store

    def _reconcile(self) -> None:
        on_disk: dict[bytes, set[str]] = {}
        for name in files.listdir(self.path):
            parsed = parse_name(name)
            if parsed is not None:
                on_disk.setdefault(parsed[0], set()).add(parsed[1])
        committed = {k for k, kinds in on_disk.items() if "side" in kinds}
        if self._index.schema() != INDEX_SCHEMA:
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

    def _inspect(self, key: bytes) -> tuple[Sidecar, IndexRecord]:
        """Read and check a committed segment's sidecar and data header (no page hashing)."""
        sc, side_bytes = self._read_sidecar(key)
        head, size = files.read_head(self._data_path(key), DATA_OFFSET)
        hdr = decode_segment_header(head, data_name(key))
        self._check_data(sc, hdr, size)
        return sc, IndexRecord.from_sidecar(sc, side_bytes, size)

    def _check_data(self, sc: Sidecar, hdr: SegmentHeader, size: int) -> None:
        name = data_name(sc.key)
        if not hdr.matches(sc):
            raise FormatError(f"{name}: header does not match its sidecar (spec F-SEG-2)")
        if size != hdr.file_bytes:
            raise FormatError(
                f"{name}: {size} bytes, its header needs {hdr.file_bytes} (truncated or padded)"
            )

    def close(self) -> None:
        self._flock.close()
        self._index.close()

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- paths --------------------------------------------------------------------------------
    def _data_path(self, key: bytes) -> str:
        return os.path.join(self.path, data_name(key))

    def _sidecar_path(self, key: bytes) -> str:
        return os.path.join(self.path, sidecar_name(key))

    def _read_sidecar(self, key: bytes) -> tuple[Sidecar, int]:
        try:
            raw = files.read_file(self._sidecar_path(key), MAX_SIDECAR_BYTES)
        except StrataIOError as e:
            if e.errno != errno.ENOENT:
                raise
            raise SegmentNotFound(f"segment {key.hex()} was deleted from {self.path}") from e
        sc = decode_sidecar(raw, sidecar_name(key))
        self.fingerprint.require_same(sc.fingerprint, sidecar_name(key))
        if sc.key != key:
            raise FormatError(f"{sidecar_name(key)}: it holds key {sc.key.hex()}, not its name's")
        return sc, len(raw)

    # -- writing ------------------------------------------------------------------------------
    def put_kv(
        self,
        parent_key: bytes,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        payload: Buffer,
        *,
        token_start: int,
        media: Sequence[MediaRef] = (),
        codec: Codec = Codec.RAW,
    ) -> PutResult:
        """Store the K/V pages of ``tokens`` (which follow the prefix ``parent_key``).

        ``payload`` holds ``len(tokens) * fingerprint.token_bytes`` bytes in the page layout of
        spec F-SEG-4. The key is derived (spec F-KEY): a put of an already committed key writes
        nothing and returns ``created=False``.
        """
        n = len(tokens)
        view = _byte_view(payload)
        if n < 1:
            raise StoreError("a K/V segment needs at least one token")
        want = n * self.fingerprint.token_bytes
        if len(view) != want:
            raise StoreError(
                f"payload is {len(view)} bytes; {n} tokens of {self.fingerprint.describe()} "
                f"are {want} bytes"
            )
        if parent_key == self.root_key and token_start != 0:
            raise StoreError("a segment whose parent is the model root must start at token 0")
        key = segment_key(parent_key, tokens, media)
        return self._put(key, Kind.KV, parent_key, token_start, token_start + n,
                         self.fingerprint.page_bytes, view, codec, tuple(media))  # fmt: skip

    def put_state(
        self,
        checkpoint_key: bytes,
        payload: Buffer,
        *,
        token_pos: int,
        codec: Codec = Codec.RAW,
    ) -> PutResult:
        """Store the running state saved at the checkpoint ``checkpoint_key`` (spec F-KEY-5)."""
        view = _byte_view(payload)
        if not view:
            raise StoreError("a running-state segment needs at least one byte")
        key = state_key(checkpoint_key)
        return self._put(key, Kind.STATE, checkpoint_key, token_pos, token_pos,
                         STATE_PAGE_BYTES, view, codec, ())  # fmt: skip

    def _committed(self, key: bytes) -> bool:
        return files.exists(self._sidecar_path(key))

    def _put(
        self,
        key: bytes,
        kind: Kind,
        parent: bytes,
        t0: int,
        t1: int,
        page_bytes: int,
        view: memoryview,
        codec: Codec,
        media: tuple[MediaRef, ...],
    ) -> PutResult:
        if self._committed(key) and self._index.get(key) is not None:
            return PutResult(key, False, 0)
        n_pages = -(-len(view) // page_bytes)
        if codec is Codec.RAW:
            join_hashes = numba_kernels.start_page_hashes(view, page_bytes)
            stored: list[memoryview] | None = None
            lengths: tuple[int, ...] = ()
            stored_bytes = len(view)
        else:
            hashes_now = numba_kernels.page_hashes(view, page_bytes)
            stored = _compress_pages(view, page_bytes)
            lengths = tuple(len(p) for p in stored)
            stored_bytes = sum(lengths)
            join_hashes = lambda: hashes_now  # noqa: E731
        header = SegmentHeader(kind, codec, key, n_pages, page_bytes, stored_bytes)
        data = DurableFile(self._data_path(key))
        with data:
            data.write(encode_segment_header(header))
            for chunk in stored if stored is not None else _chunks(view, _WRITE_CHUNK):
                data.write(chunk)
            data.prepare()
            hashes = join_hashes()
            sc = Sidecar(
                kind=kind, codec=codec, level=self.level, fingerprint=self.fingerprint, key=key,
                parent_key=parent, token_start=t0, token_end=t1, page_bytes=page_bytes,
                last_page_bytes=len(view) - (n_pages - 1) * page_bytes,
                page_hashes=hashes.tobytes(), stored_bytes=stored_bytes,
                sealed_at_ns=time.time_ns(), stored_lengths=lengths, media=media,
            )  # fmt: skip
            side = encode_sidecar(sc)
            with self._write_lock():
                if self._committed(key):
                    data.abort()
                    self._ensure_indexed(key)
                    return PutResult(key, False, 0)
                try:
                    data.publish()
                    durable_write(self._sidecar_path(key), side)
                    self._index.put(key, IndexRecord.from_sidecar(sc, len(side),
                                                                  header.file_bytes))  # fmt: skip
                except BaseException:
                    self._roll_back(key)
                    raise
        return PutResult(key, True, stored_bytes)

    def _roll_back(self, key: bytes) -> None:
        """Make a put that failed after publishing its data file invisible again (best effort:
        if this fails too, what stays is a whole segment or an orphan file, never a torn one)."""
        try:
            self._index.delete(key)
            if files.unlink(self._sidecar_path(key), missing_ok=True):
                files.fsync_dir(self.path)
            files.unlink(self._data_path(key), missing_ok=True)
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
        """Remove a segment (spec F-DUR-5: unindex, unlink sidecar, fsync, unlink data, fsync).
        Returns False when it was not there."""
        with self._write_lock():
            return self._delete_locked(key)

    def _delete_locked(self, key: bytes) -> bool:
        had_record = self._index.delete(key)
        had_sidecar = files.unlink(self._sidecar_path(key), missing_ok=True)
        if had_sidecar:
            files.fsync_dir(self.path)
        had_data = files.unlink(self._data_path(key), missing_ok=True)
        if had_data:
            files.fsync_dir(self.path)
        return had_record or had_sidecar

    def adopt(self, src: SegmentStore, key: bytes) -> Literal["link", "copy", "present"]:
        """Move a committed segment from ``src`` (another level) into this store, all or nothing
        (spec F-DUR-8): make the data file here (hard link on one volume, durable copy across
        two), write this level's own sidecar (its level, a new ``sealed_at``), index it, and only
        then delete it from ``src``. Any failure undoes what was done here and leaves the segment
        whole in ``src``. Locks ``src`` then this store (callers keep that order)."""
        with src._write_lock(), self._write_lock():
            if self._committed(key):
                src._delete_locked(key)
                return "present"
            sc, _ = src._inspect(key)
            mine = dataclasses.replace(sc, level=self.level, sealed_at_ns=time.time_ns())
            side = encode_sidecar(mine)
            files.unlink(self._data_path(key), missing_ok=True)  # an orphan of a crashed move
            try:
                how = link_or_copy(src._data_path(key), self._data_path(key))
                durable_write(self._sidecar_path(key), side)
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

    def _reindex(self, key: bytes) -> None:
        """Put back the record of a committed segment (after a failed move); best effort."""
        with contextlib.suppress(StrataError):
            if self._committed(key) and self._index.get(key) is None:
                self._index.put(key, self._inspect(key)[1])

    # -- reading ------------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        return self._index.get(key) is not None

    __contains__ = contains

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
        entries = disk = 0
        for _, rec in self._index.items():
            entries += 1
            disk += rec.total_bytes
        return StoreStats(entries, disk)

    def _open_data(self, key: bytes) -> tuple[Sidecar, npt.NDArray[np.uint8]]:
        self.record(key)
        sc, _ = self._read_sidecar(key)
        mm, size = files.map_readonly(self._data_path(key))
        arr = np.frombuffer(mm, dtype=np.uint8)
        hdr = decode_segment_header(bytes(arr[:DATA_OFFSET]), data_name(key))
        self._check_data(sc, hdr, size)
        return sc, arr[hdr.data_offset :]

    def prefetch(self, key: bytes) -> bool:
        """Start reading the segment's data file into the page cache (a hint for a restore that
        comes soon: the batched agenda's read-ahead). Never raises; False when it could not."""
        return files.advise_willneed(self._data_path(key))

    def read_pages(self, key: bytes, pages: int | None = None
                   ) -> tuple[Sidecar, npt.NDArray[np.uint8]]:  # fmt: skip
        """The segment's sidecar and its pages, *not* validated (the caller hashes them, as the
        restore's read pass does): a read-only mapping for RAW; for ZSTD the first ``pages``
        pages (default all) decompressed into a new array, a frame that does not decode left as
        zeros (so that its page fails validation). The header and size are checked."""
        sc, payload = self._open_data(key)
        if sc.codec is Codec.RAW:
            return sc, payload
        n = sc.page_count if pages is None else max(0, min(pages, sc.page_count))
        out = np.zeros(max(0, (n - 1) * sc.page_bytes + sc.page_len(n - 1)) if n else 0,
                       dtype=np.uint8)  # fmt: skip
        dctx = zstandard.ZstdDecompressor()
        for i, off in enumerate(sc.stored_offsets()[:n]):
            want = sc.page_len(i)
            try:
                page = dctx.decompress(payload[off : off + sc.stored_lengths[i]].tobytes(),
                                       max_output_size=want)  # fmt: skip
            except zstandard.ZstdError:
                break
            if len(page) != want:
                break
            out[i * sc.page_bytes : i * sc.page_bytes + want] = np.frombuffer(page, np.uint8)
        return sc, out

    def get_bytes(self, key: bytes, *, max_bytes: int) -> bytes:
        """The segment's validated payload as bytes (for small objects such as running states);
        refuses one larger than ``max_bytes`` before allocating it."""
        sc, payload = self._open_data(key)
        if sc.payload_bytes > max_bytes:
            raise StoreError(
                f"segment {key.hex()} holds {sc.payload_bytes:,} bytes, over the {max_bytes:,} "
                "this read allows"
            )
        out = bytearray(sc.payload_bytes)
        self._copy_validated(sc, payload, memoryview(out), True)
        return bytes(out)

    def get_into(self, key: bytes, out: Buffer, *, verify: bool = True) -> Sidecar:
        """Copy the segment's pages into ``out`` (at least ``payload_bytes`` long).

        With ``verify`` every page is hashed and copied only if it matches its sidecar digest;
        a mismatch raises :class:`ChecksumMismatch` naming the first bad page, and ``out`` then
        holds validated pages only (spec F-SC-3). Returns the sidecar.
        """
        dst = _byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only")
        sc, payload = self._open_data(key)
        if len(dst) < sc.payload_bytes:
            raise StoreError(
                f"output buffer is {len(dst)} bytes; segment {key.hex()} needs {sc.payload_bytes}"
            )
        self._copy_validated(sc, payload, dst, verify)
        return sc

    def _copy_validated(self, sc: Sidecar, payload: npt.NDArray[np.uint8], dst: memoryview,
                        verify: bool) -> None:  # fmt: skip
        expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)
        if sc.codec is Codec.RAW:
            if verify:
                bad = numba_kernels.validated_copy(payload, dst[: sc.payload_bytes],
                                                   sc.page_bytes, expected)  # fmt: skip
                if bad >= 0:
                    self._raise_page(sc, payload, bad)
            else:
                np.frombuffer(dst, np.uint8)[: sc.payload_bytes] = payload
            return
        _decompress_into(sc, payload, dst, verify)

    def view(self, key: bytes, *, verify: bool = True) -> npt.NDArray[np.uint8]:
        """A read-only, mmap-backed uint8 array of the segment's pages (RAW codec only).

        With ``verify`` every page is hashed first and a mismatch raises
        :class:`ChecksumMismatch`. The mapping stays valid while the array lives, even if the
        segment is deleted meanwhile.
        """
        sc, payload = self._open_data(key)
        if sc.codec is not Codec.RAW:
            raise StoreError(
                f"segment {key.hex()} is {sc.codec.name.lower()}-compressed and cannot be "
                "mapped; use get_into"
            )
        if verify:
            actual = numba_kernels.page_hashes(payload, sc.page_bytes)
            expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)
            bad = np.flatnonzero((actual != expected).any(axis=1))
            if bad.size:
                self._raise_page(sc, payload, int(bad[0]))
        return payload

    def verify(self, key: bytes) -> int:
        """Hash every page of a segment: the first bad page, or -1 when all match."""
        sc, payload = self._open_data(key)
        return first_bad_page(sc, payload)

    def _raise_page(self, sc: Sidecar, payload: npt.NDArray[np.uint8], page: int) -> None:
        a = page * sc.page_bytes
        actual = numba_kernels.hash_page(payload[a : a + sc.page_len(page)].data)
        raise ChecksumMismatch(data_name(sc.key), sc.page_hash(page), actual, page)


def first_bad_page(sc: Sidecar, payload: npt.NDArray[np.uint8], *, sample: bool = False) -> int:
    """The first page of ``payload`` (a data file's pages) that fails its sidecar digest, or -1.
    ``sample`` checks only the first and the last page of a RAW segment (fsck's quick mode); a
    compressed segment is always decoded whole."""
    if sc.codec is not Codec.RAW:
        try:
            _decompress_into(sc, payload, None, True)
        except ChecksumMismatch as e:
            return e.page if e.page is not None else 0
        return -1
    expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)
    if not sample:
        actual = numba_kernels.page_hashes(payload, sc.page_bytes)
        bad = np.flatnonzero((actual != expected).any(axis=1))
        return int(bad[0]) if bad.size else -1
    for i in sorted({0, sc.page_count - 1}):
        a = i * sc.page_bytes
        if numba_kernels.hash_page(payload[a : a + sc.page_len(i)].data) != expected[i].tobytes():
            return i
    return -1


def _chunks(view: memoryview, size: int) -> Iterator[memoryview]:
    for i in range(0, len(view), size):
        yield view[i : i + size]


def _compress_pages(view: memoryview, page_bytes: int) -> list[memoryview]:
    cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True)
    return [memoryview(cctx.compress(p)) for p in _chunks(view, page_bytes)]


def _decompress_into(
    sc: Sidecar, payload: npt.NDArray[np.uint8], dst: memoryview | None, verify: bool
) -> None:
    """Decompress each zstd page (bounded by its recorded size), validate it, then copy it into
    ``dst`` (``None``: validate only). One page is held in memory at a time."""
    dctx = zstandard.ZstdDecompressor()
    name = data_name(sc.key)
    for i, off in enumerate(sc.stored_offsets()):
        frame = payload[off : off + sc.stored_lengths[i]]
        want = sc.page_len(i)
        try:
            page = dctx.decompress(frame.tobytes(), max_output_size=want)
        except zstandard.ZstdError as e:
            raise ChecksumMismatch(name, sc.page_hash(i), b"\0" * 32, i) from e
        actual = numba_kernels.hash_page(page) if verify else sc.page_hash(i)
        if len(page) != want or actual != sc.page_hash(i):
            raise ChecksumMismatch(name, sc.page_hash(i), actual, i)
        if dst is not None:
            a = i * sc.page_bytes
            dst[a : a + want] = page
