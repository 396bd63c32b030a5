"""The shipped backend suite (``stratastore.testing.BackendTests``) against the directory store
and against the shipped in-memory backend (``stratastore.levels.memory``), written from the
protocol alone: proof that a level is a backend behind a small protocol."""

from __future__ import annotations

import os
from pathlib import Path

from stratastore.format import DATA_OFFSET, Level, ModelFingerprint, data_name
from stratastore.levels import SegmentBackend
from stratastore.levels.local import SegmentStore
from stratastore.levels.memory import MemoryBackend
from stratastore.testing import BackendTests


class TestSegmentStoreBackend(BackendTests):
    def make_backend(
        self, path: Path, fingerprint: ModelFingerprint, level: Level
    ) -> SegmentBackend:
        return SegmentStore.open(path, fingerprint, level=level)

    def corrupt(self, backend: SegmentBackend, key: bytes, offset: int) -> None:
        with open(os.path.join(backend.path, data_name(key)), "r+b") as f:
            f.seek(DATA_OFFSET + offset)
            b = f.read(1)[0]
            f.seek(DATA_OFFSET + offset)
            f.write(bytes([b ^ 1]))


class TestMemoryBackend(BackendTests):
    supports_persistence = False

    def make_backend(
        self, path: Path, fingerprint: ModelFingerprint, level: Level
    ) -> SegmentBackend:
        return MemoryBackend(path.name, fingerprint, level)

    def corrupt(self, backend: SegmentBackend, key: bytes, offset: int) -> None:
        assert isinstance(backend, MemoryBackend)
        backend.raw[key][2][offset] ^= 1
