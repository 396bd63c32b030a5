"""The LMDB index of one store directory (spec F-IDX): derived, rebuildable state.

One environment per directory per process (LMDB forbids opening one twice in a process), shared
by every :class:`SegmentIndex` on that directory through a refcounted registry. The map grows
by doubling when a write transaction hits ``MapFullError`` (that transaction alone is lost, so
it is retried).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import lmdb

from ..format.index_record import INDEX_SCHEMA, IndexRecord
from ..format.naming import INDEX_DIR
from ..io import files
from .errors import StoreError

__all__ = ["SegmentIndex"]

T = TypeVar("T")
_INITIAL_MAP = 64 << 20
_MAX_MAP = 1 << 40
_SCHEMA_KEY = b"schema"
FINGERPRINT_KEY = b"fingerprint"

_registry_lock = threading.Lock()
_registry: dict[str, tuple[Any, int]] = {}


def _open_env(path: str) -> Any:
    with _registry_lock:
        env, refs = _registry.get(path, (None, 0))
        if env is None:
            env = lmdb.open(path, subdir=True, max_dbs=4, map_size=_INITIAL_MAP,
                            sync=True, metasync=True, readahead=False, max_readers=256)  # fmt: skip
        _registry[path] = (env, refs + 1)
        return env


def _close_env(path: str) -> None:
    with _registry_lock:
        env, refs = _registry[path]
        if refs > 1:
            _registry[path] = (env, refs - 1)
        else:
            del _registry[path]
            env.close()


class SegmentIndex:
    """``key -> IndexRecord`` plus a small ``meta`` table, in ``DIR/strata-index/``."""

    def __init__(self, store_dir: str) -> None:
        self.path = os.path.realpath(os.path.join(store_dir, INDEX_DIR))
        files.makedirs(self.path)
        try:
            self.env = _open_env(self.path)
        except lmdb.Error as e:
            raise StoreError(
                f"index {self.path} cannot be opened ({e}); it is derived state: delete that "
                "directory and open the store again to rebuild it from the sidecars"
            ) from e
        self._segments = self.env.open_db(b"segments")
        self._meta = self.env.open_db(b"meta")
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def _write(self, fn: Callable[[Any], T]) -> T:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                size = self.env.info()["map_size"] * 2
                if size > _MAX_MAP:
                    raise StoreError(f"index {self.path} is over {_MAX_MAP} bytes") from None
                self.env.set_mapsize(size)
            except lmdb.Error as e:
                raise StoreError(
                    f"index {self.path}: write failed ({e}); the segment files are the truth: "
                    "free space or fix the volume, then reopen to reconcile the index"
                ) from e

    # -- meta ---------------------------------------------------------------------------------
    def schema(self) -> int | None:
        with self.env.begin() as txn:
            raw = txn.get(_SCHEMA_KEY, db=self._meta)
        return int.from_bytes(raw, "little") if raw is not None else None

    def meta_get(self, name: bytes) -> bytes | None:
        with self.env.begin() as txn:
            raw = txn.get(name, db=self._meta)
        return bytes(raw) if raw is not None else None

    def meta_put(self, name: bytes, value: bytes) -> None:
        self._write(lambda txn: txn.put(name, value, db=self._meta))

    # -- records ------------------------------------------------------------------------------
    def get(self, key: bytes) -> IndexRecord | None:
        with self.env.begin() as txn:
            raw = txn.get(key, db=self._segments)
        return IndexRecord.unpack(bytes(raw), f"index record {key.hex()}") if raw else None

    def put(self, key: bytes, rec: IndexRecord) -> None:
        self._write(lambda txn: txn.put(key, rec.pack(), db=self._segments))

    def delete(self, key: bytes) -> bool:
        return bool(self._write(lambda txn: txn.delete(key, db=self._segments)))

    def keys(self) -> list[bytes]:
        with self.env.begin() as txn:
            return [bytes(k) for k in txn.cursor(db=self._segments).iternext(values=False)]

    def items(self) -> Iterator[tuple[bytes, IndexRecord]]:
        with self.env.begin() as txn:
            rows = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self._segments)]
        for k, v in rows:
            yield k, IndexRecord.unpack(v, f"index record {k.hex()}")

    def __len__(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat(self._segments)["entries"])

    def replace_all(self, records: dict[bytes, IndexRecord], fingerprint: bytes) -> None:
        """Make the index exactly ``records`` in one transaction (the rebuild, spec F-IDX-3)."""

        def run(txn: Any) -> None:
            txn.drop(self._segments, delete=False)
            for k, rec in records.items():
                txn.put(k, rec.pack(), db=self._segments)
            txn.put(_SCHEMA_KEY, INDEX_SCHEMA.to_bytes(4, "little"), db=self._meta)
            txn.put(FINGERPRINT_KEY, fingerprint, db=self._meta)

        self._write(run)

    def apply(self, puts: dict[bytes, IndexRecord], deletes: list[bytes]) -> None:
        """Apply record puts and deletes in one transaction."""

        def run(txn: Any) -> None:
            for k in deletes:
                txn.delete(k, db=self._segments)
            for k, rec in puts.items():
                txn.put(k, rec.pack(), db=self._segments)

        self._write(run)
