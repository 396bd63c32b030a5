"""The read side of a directory store (spec F-SC-3, F-IDX): a committed segment's sidecar
checked (:func:`~stratastore.levels.inspect.inspect_segment`, the check open and fsck share),
its index record, and its pages read with ``pread`` into memory this process owns, hashed
there and delivered from that same memory only if they match. Data files are never mapped: a
file truncated or failing under a reader is a typed error, never a SIGBUS. A segment deleted
meanwhile (by this or another process) is :class:`SegmentNotFound`, a committed sidecar whose
data file is gone is damage.

:class:`SegmentReads` is the base of :class:`~stratastore.levels.local.SegmentStore`, which
owns the state it reads (the directory, the model, the index) and every write.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from stratastore.format import (
    Codec,
    IndexRecord,
    ModelFingerprint,
    Sidecar,
    data_name,
    sidecar_name,
)
from stratastore.io import files
from stratastore.io.errors import StrataIOError
from stratastore.levels.backend import StoreStats
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.inspect import inspect_segment
from stratastore.levels.local.index import SegmentIndex
from stratastore.levels.reader import OutOfRange, SegmentReader, require_valid
from stratastore.levels.sealing import Buffer, byte_view

__all__ = ["SegmentReads"]


class SegmentReads:
    """The reads of one directory store; see the module. Thread-safe: readers take no lock."""

    path: str
    fingerprint: ModelFingerprint
    _index: SegmentIndex

    # -- files --------------------------------------------------------------------------------
    def _data_path(self, key: bytes) -> str:
        return os.path.join(self.path, data_name(key))

    def _sidecar_path(self, key: bytes) -> str:
        return os.path.join(self.path, sidecar_name(key))

    def _committed(self, key: bytes) -> bool:
        return files.exists(self._sidecar_path(key))

    def _read_sidecar(self, key: bytes) -> tuple[Sidecar, int]:
        """The sidecar of ``key`` and its size, checked (spec F-SC, F-KEY-6) for this store's
        model: its typed error when damaged, :class:`SegmentNotFound` when it is gone."""
        got = inspect_segment(
            key,
            self._sidecar_path(key),
            self._data_path(key),
            depth="sidecar",
            fingerprint=self.fingerprint,
        )
        if got.damage is not None:
            e = got.damage.error
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
        """A data file that vanished under a read: :class:`SegmentNotFound` when the segment was
        deleted (its sidecar is gone too; another process moved or dropped it), else return
        (a committed sidecar without its data file is damage: the caller re-raises ``e``)."""
        if e.errno == errno.ENOENT and not self._committed(key):
            raise SegmentNotFound(f"segment {key.hex()} was deleted from {self.path}") from e

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
        :class:`SegmentNotFound` when it is not here, or was deleted meanwhile."""
        self.record(key)
        sc = self._read_sidecar(key)[0]
        try:
            return SegmentReader(sc, self._data_path(key))
        except StrataIOError as e:
            self._raise_if_deleted(key, e)
            raise

    def read_into(self, key: bytes, offset: int, out: Buffer) -> int:
        """Copy the *stored* bytes of ``key`` from ``offset`` into ``out`` (RAW: the pages;
        ZSTD: the frames; not validated: the caller hashes what it reads, spec F-SC-3): as
        many as fit, up to the end. Returns the count (0 at the end); :class:`OutOfRange` for
        an offset before 0 or past the end."""
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only")
        with self.open_reader(key) as seg:
            end = seg.sidecar.stored_bytes
            if offset < 0 or offset > end:
                raise OutOfRange(
                    f"segment {key.hex()}: offset {offset} is outside its {end} stored bytes"
                )
            n = min(len(dst), end - offset)
            seg.read_into(dst[:n], offset)
        return n

    def prefetch(self, key: bytes) -> bool:
        """Start reading the segment's data file into the page cache (a hint for a restore that
        comes soon: the batched agenda's read-ahead). Never raises; False when it could not."""
        return files.advise_willneed(self._data_path(key))

    def get_bytes(self, key: bytes, *, max_bytes: int) -> bytes:
        """The segment's validated payload as bytes (for small objects such as running states);
        refuses one larger than ``max_bytes`` before allocating it."""
        with self.open_reader(key) as seg:
            sc = seg.sidecar
            if sc.payload_bytes > max_bytes:
                raise StoreError(
                    f"segment {key.hex()} holds {sc.payload_bytes:,} bytes, over the "
                    f"{max_bytes:,} this read allows"
                )
            out = bytearray(sc.payload_bytes)
            seg.copy_validated(memoryview(out), True)
        return bytes(out)

    def get_into(self, key: bytes, out: Buffer, *, verify: bool = True) -> Sidecar:
        """Copy the segment's pages into ``out`` (at least ``payload_bytes`` long).

        With ``verify`` every page is read into staging memory, hashed there and copied from
        there only if it matches its sidecar digest (the bytes hashed are the bytes delivered);
        a mismatch raises :class:`ChecksumMismatch` naming the first bad page, and ``out`` then
        holds validated pages only (spec F-SC-3). A read error or a file truncated meanwhile
        raises :class:`StrataIOError` / :class:`~stratastore.io.errors.ShortRead`. Returns the
        sidecar.
        """
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only")
        with self.open_reader(key) as seg:
            sc = seg.sidecar
            if len(dst) < sc.payload_bytes:
                raise StoreError(
                    f"output buffer is {len(dst)} bytes; segment {key.hex()} needs "
                    f"{sc.payload_bytes}"
                )
            seg.copy_validated(dst[: sc.payload_bytes], verify)
        return sc

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
