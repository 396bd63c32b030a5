"""A level held in memory: the level protocol's second implementation, shipped.

:class:`MemoryBackend` keeps sealed segments in a dict, written from the
:class:`~stratastore.levels.backend.SegmentBackend` protocol alone (sealing and validation are the
seam's: :mod:`stratastore.levels.sealing`, :class:`~stratastore.levels.reader.PayloadReader`). It
is what ``memory://NAME`` opens (:func:`stratastore.levels.registry.open_level`), a level for tests
and for engines that want a validated scratch level, and the reference a third-party backend can
read beside :class:`~stratastore.testing.BackendTests`. Nothing survives :meth:`close` or the
process (``persistent = False``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator

from stratastore.format import (
    Codec,
    IndexRecord,
    Level,
    ModelFingerprint,
    Sidecar,
    encode_sidecar,
)
from stratastore.levels.backend import PutResult, SegmentBackend
from stratastore.levels.common import SealedLevel
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.reader import PayloadReader
from stratastore.levels.relocation import Relocated, relocate_by_copy, resealed
from stratastore.levels.sealing import (
    Buffer,
    Unsealed,
    check_sealed,
    rekeyed,
    seal,
)

__all__ = ["MemoryBackend", "MemorySegment"]


class MemorySegment(PayloadReader):
    """A held segment open for reads: the stored bytes as they were when it was opened."""

    def __init__(self, sidecar: Sidecar, stored: bytearray) -> None:
        self.sidecar = sidecar
        self._stored = stored

    def _read_at(self, view: memoryview, offset: int) -> None:
        view[:] = memoryview(self._stored)[offset : offset + view.nbytes]


class MemoryBackend(SealedLevel):
    """A level held in a dict: key -> (sidecar, record, stored bytes). ``oldest`` walks a
    sorted list of ``(sealed_at_ns, key)`` (bisect: O(log n) a row). Thread-safe."""

    persistent = False  #: nothing survives close() or the process
    shared = False  #: one process sees it
    chain_index = False
    hosts_catalog = False

    def __init__(self, name: str, fingerprint: ModelFingerprint, level: Level) -> None:
        self.path = f"memory://{name}"
        self.fingerprint = fingerprint
        self.level = level
        self.raw: dict[bytes, tuple[Sidecar, IndexRecord, bytearray]] = {}
        self._ages: list[tuple[int, bytes]] = []
        self._used = 0
        self._lock = threading.Lock()

    # -- writing --------------------------------------------------------------------------------
    def put_sealed(self, sidecar: Sidecar, stored: Buffer) -> PutResult:
        if sidecar.key in self.raw:
            return PutResult(sidecar.key, False, 0)
        data = check_sealed(sidecar, stored, self.fingerprint)
        return self._commit(
            resealed(rekeyed(sidecar, data, self.hasher), self.level), bytearray(data.tobytes())
        )

    def _put(self, u: Unsealed, codec: Codec) -> PutResult:
        if u.key in self:
            return PutResult(u.key, False, 0)
        sc, stored = seal(u, codec, self.fingerprint, self.level)
        return self._commit(sc, bytearray(stored))

    def _commit(self, sc: Sidecar, stored: bytearray) -> PutResult:
        rec = IndexRecord.from_sidecar(sc, len(encode_sidecar(sc)), len(stored))
        with self._lock:
            if sc.key in self.raw:
                return PutResult(sc.key, False, 0)
            self.raw[sc.key] = (sc, rec, stored)
            bisect.insort(self._ages, (sc.sealed_at_ns, sc.key))
            self._used += rec.total_bytes
        return PutResult(sc.key, True, sc.stored_bytes)

    # -- reading --------------------------------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        return key in self.raw

    def _entry(self, key: bytes) -> tuple[Sidecar, IndexRecord, bytearray]:
        try:
            return self.raw[key]
        except KeyError:
            raise SegmentNotFound(f"segment {key.hex()} is not in {self.path}") from None

    def record(self, key: bytes) -> IndexRecord:
        return self._entry(key)[1]

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self.raw)

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        with self._lock:
            return [(k, rec) for k, (_, rec, _) in self.raw.items()]

    def open_reader(self, key: bytes) -> MemorySegment:
        sc, _, stored = self._entry(key)
        return MemorySegment(sc, stored)

    def prefetch(self, key: bytes) -> bool:
        return False

    # -- managing -------------------------------------------------------------------------------
    def delete(self, key: bytes) -> bool:
        with self._lock:
            got = self.raw.pop(key, None)
            if got is None:
                return False
            sc, rec, _ = got
            self._ages.pop(bisect.bisect_left(self._ages, (sc.sealed_at_ns, key)))
            self._used -= rec.total_bytes
        return True

    def __len__(self) -> int:
        return len(self.raw)

    def used(self) -> int:
        return self._used

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        after: tuple[int, bytes] = (-1, b"")
        while True:
            with self._lock:
                i = bisect.bisect_right(self._ages, after)
                if i == len(self._ages):
                    return
                after = self._ages[i]
                got = self.raw.get(after[1])
            if got is not None:
                yield after[1], got[1]

    def relocate_from(self, src: SegmentBackend, key: bytes) -> Relocated:
        return relocate_by_copy(self, src, key)

    def close(self) -> None:
        pass


_static: type[SegmentBackend] = MemoryBackend
