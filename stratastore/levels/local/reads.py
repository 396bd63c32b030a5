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
from stratastore.levels.common import SealedLevel
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.inspect import inspect_segment
from stratastore.levels.local.index import SegmentIndex
from stratastore.levels.reader import SegmentReader, require_valid

__all__ = ["SegmentReads"]


class SegmentReads(SealedLevel):
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

    def prefetch(self, key: bytes) -> bool:
        """Start reading the segment's data file into the page cache (a hint for a restore that
        comes soon: the batched agenda's read-ahead). Never raises; False when it could not."""
        return files.advise_willneed(self._data_path(key))

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
