"""The LMDB index of one store directory (spec F-IDX): derived, rebuildable state.

One environment per directory per process (LMDB forbids opening one twice in a process), shared
by every :class:`SegmentIndex` on that directory through a refcounted registry. The map grows
by doubling when a write transaction hits ``MapFullError`` (that transaction alone is lost, so
it is retried).

``strata-index/`` must be a real directory and ``data.mdb`` / ``lock.mdb`` regular files or
absent (spec F-DIR-8): LMDB follows links and would write through them, so anything else is
refused before LMDB sees the directory. LMDB creates its files with the store's file mode (spec
F-DIR-9).

Beside ``segments`` and ``meta`` (spec F-IDX-1), two derived tables keep the costs a level pays
per operation independent of its size: ``totals`` holds ``bytes`` (u64 LE, the data-file plus
sidecar bytes of every record) and ``ages`` holds one empty row per record keyed by its
``sealed_at_ns`` (u64 big-endian, so LMDB's bytewise order is age order) then its key. Every
write of a record updates both in its own transaction, reading the old record there first, so
:meth:`SegmentIndex.used_bytes` is one read and :meth:`SegmentIndex.oldest` a cursor walk. An
index without them (written before them) is rebuilt on open like one of another schema (F-IDX-3):
:meth:`SegmentIndex.totals_ok`. They live outside ``meta``, whose contents F-IDX-5 pins.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import lmdb

from stratastore.format.errors import FormatError
from stratastore.format.index_record import INDEX_SCHEMA, IndexRecord
from stratastore.format.naming import INDEX_DIR
from stratastore.io import files, guard
from stratastore.io.errors import StrataIOError
from stratastore.io.modes import DEFAULT_FILE_MODE
from stratastore.levels.errors import StoreError

__all__ = ["SegmentIndex"]

T = TypeVar("T")
_INITIAL_MAP = 64 << 20
_MAX_MAP = 1 << 40
_SCHEMA_KEY = b"schema"
FINGERPRINT_KEY = b"fingerprint"
_BYTES_KEY = b"bytes"
_U64 = struct.Struct("<Q")
_AGE = struct.Struct(">Q")  #: big-endian: bytewise order is numeric order
_OLDEST_BATCH = 64  #: rows :meth:`SegmentIndex.oldest` reads per short read transaction

_registry_lock = threading.Lock()
_registry: dict[str, tuple[Any, int, _Gate]] = {}


class _Gate:
    """Transactions of one environment against a change of its map size. LMDB allows
    ``set_mapsize`` only while the process has no transaction active; the Store runs restores
    and its disk writer on several threads at once, so every transaction passes
    here shared and a resize waits, exclusive, until the other threads' transactions ended. A
    thread may nest transactions; a resize waits only for the others' (LMDB's rule for its own
    is the caller's, as before)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False
        self._mine = threading.local()

    def _depth(self) -> int:
        return int(getattr(self._mine, "n", 0))

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            if not self._depth():  # a nested transaction never waits for a resize
                self._cond.wait_for(lambda: not self._resizing)
            self._active += 1
        self._mine.n = self._depth() + 1
        try:
            yield
        finally:
            self._mine.n = self._depth() - 1
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def leave_for_resize(self, env: Any) -> None:
        """From inside :meth:`shared`: adopt the map size another process set
        (``set_mapsize(0)``), counted out of the active transactions meanwhile."""
        with self._cond:
            self._active -= 1
        self._mine.n = self._depth() - 1
        try:
            self.resize(env, 0)
        finally:
            with self._cond:
                self._cond.wait_for(lambda: not self._resizing)
                self._active += 1
            self._mine.n = self._depth() + 1

    def resize(self, env: Any, size: int) -> None:
        """``env.set_mapsize(size)`` once no other thread is inside a transaction."""
        own = self._depth()
        with self._cond:
            self._cond.wait_for(lambda: not self._resizing)
            self._resizing = True
            try:
                self._cond.wait_for(lambda: self._active <= own)
                env.set_mapsize(size)
            finally:
                self._resizing = False
                self._cond.notify_all()


#: LMDB's meta page (64-bit builds): the page header (16 bytes), then mm_magic, mm_version,
#: mm_address, mm_mapsize, mm_dbs[2] (48 bytes each), mm_last_pg, mm_txnid
_META = struct.Struct("<16xIIQQ48s48sQQ")
_LMDB_MAGIC = 0xBEEFC0DE
_DB_ROOT = struct.Struct("<40xQ")  #: md_root, the last field of an MDB_db
_P_INVALID = (1 << 64) - 1


def lmdb_file_problem(index_dir: str) -> str | None:
    """Why ``index_dir/data.mdb`` must not be mapped, or None. LMDB trusts its file: a meta page
    whose last page (or a root) lies past the end of the file makes LMDB touch unmapped pages,
    and the process dies of SIGBUS instead of getting an error. Checks the meta page LMDB would
    pick (the valid one with the higher txnid) against the file's size. No file: None."""
    path = os.path.join(index_dir, "data.mdb")
    try:  # never a link or a FIFO (F-DIR-8); a missing file is not opened (an "open" of the
        # io seam is a creation to the power-loss explorer)
        if not guard.require_regular(path, missing_ok=True):
            return None
        head, size = files.read_head(path, 2 * 65536)
    except StrataIOError as e:
        if e.errno == errno.ENOENT:
            return None
        return f"cannot read {path}: {e}"
    if size == 0:
        return None  # a new environment: LMDB initialises it
    metas = []
    for psize in (4096, 8192, 16384, 32768, 65536):  # meta page 1 starts one page in
        if len(head) < psize + _META.size:
            break
        for off in (0, psize):
            magic, _, _, _, db0, db1, last_pg, txnid = _META.unpack_from(head, off)
            if magic == _LMDB_MAGIC:
                metas.append((txnid, last_pg, psize, db0, db1))
        if len(metas) == 2:
            break
        metas = []
    if not metas:
        return f"{path} has no valid LMDB meta pages"
    txnid, last_pg, psize, db0, db1 = max(metas)
    if (last_pg + 1) * psize > size:
        return f"{path}: its meta page says {last_pg + 1} pages, the file holds {size // psize}"
    for db in (db0, db1):
        root = _DB_ROOT.unpack(db)[0]
        if root != _P_INVALID and root > last_pg:
            return f"{path}: a root page ({root}) lies past its last page ({last_pg})"
    return None


def _open_env(path: str, file_mode: int) -> tuple[Any, _Gate]:
    with _registry_lock:
        env, refs, gate = _registry.get(path, (None, 0, _Gate()))
        if env is None:
            problem = lmdb_file_problem(path)
            if problem is not None:
                raise lmdb.CorruptedError(problem)
            env = lmdb.open(
                path,
                subdir=True,
                max_dbs=16,
                map_size=_INITIAL_MAP,
                create=False,
                sync=True,
                metasync=True,
                readahead=False,
                max_readers=256,
                mode=file_mode,
            )
        _registry[path] = (env, refs + 1, gate)
        return env, gate


def _close_env(path: str) -> None:
    with _registry_lock:
        env, refs, gate = _registry[path]
        if refs > 1:
            _registry[path] = (env, refs - 1, gate)
        else:
            del _registry[path]
            env.close()


class SegmentIndex:
    """``key -> IndexRecord`` plus a small ``meta`` table, in ``DIR/strata-index/``."""

    def __init__(self, store_dir: str, *, file_mode: int = DEFAULT_FILE_MODE) -> None:
        # the store directory is the one the caller named (it may be a link they chose); what
        # is inside it is never followed: strata-index/ and LMDB's files are checked first
        self.path = os.path.join(os.path.realpath(store_dir), INDEX_DIR)
        self.file_mode = file_mode
        guard.store_subdir(os.path.dirname(self.path), INDEX_DIR, mode=file_mode)
        for name in ("data.mdb", "lock.mdb"):
            guard.require_regular(os.path.join(self.path, name), missing_ok=True)
        try:
            self.env, self._gate = _open_env(self.path, file_mode)
        except lmdb.Error as e:
            raise StoreError(
                f"index {self.path} cannot be opened ({e}); it is derived state: delete that "
                "directory and open the store again to rebuild it from the sidecars"
            ) from e
        try:
            self._segments = self.env.open_db(b"segments")
            self._meta = self.env.open_db(b"meta")
            self._ages = self.env.open_db(b"ages")
            self._totals = self.env.open_db(b"totals")
        except lmdb.Error as e:
            _close_env(self.path)
            raise StoreError(
                f"index {self.path} is damaged ({e}); it is derived state: "
                f"`strata fsck --repair --yes {store_dir}` rebuilds it from the sidecars"
            ) from e
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _close_env(self.path)

    def _write(self, fn: Callable[[Any], T]) -> T:
        while True:
            try:
                with self._gate.shared(), self.env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                size = self.env.info()["map_size"] * 2
                if size > _MAX_MAP:
                    raise StoreError(f"index {self.path} is over {_MAX_MAP} bytes") from None
                self._gate.resize(self.env, size)
            except lmdb.MapResizedError:  # another process grew the map: adopt its size
                self._gate.resize(self.env, 0)
            except lmdb.Error as e:
                raise StoreError(
                    f"index {self.path}: write failed ({e}); the segment files are the truth: "
                    "free space or fix the volume, then reopen to reconcile the index"
                ) from e

    def write_txn(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(txn)`` in one write transaction of this environment (the shared catalog's
        tables live here too, F-CAT-1): retried when the map grows, errors as StoreError."""
        return self._write(fn)

    def read_txn(self) -> contextlib.AbstractContextManager[Any]:
        """A read transaction of this environment (see :meth:`write_txn`)."""
        return self._reading()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Any]:
        """A read transaction; LMDB's own errors (a damaged ``data.mdb``) become a StoreError
        naming the fix, as the index is derived state (spec F-IDX-3). A map another process
        grew (the environment is shared) is adopted first."""
        try:
            with self._gate.shared():
                txn = self._begin_read()
                with txn:
                    yield txn
        except lmdb.Error as e:
            raise StoreError(
                f"index {self.path} is damaged ({e}); it is derived state: "
                f"`strata fsck --repair --yes {os.path.dirname(self.path)}` rebuilds it from the "
                "sidecars (or delete that directory and open the store again)"
            ) from e

    def _begin_read(self) -> Any:
        """A read transaction, the caller inside the gate: a map another process grew is
        adopted (a resize needs the gate: left and taken again around it)."""
        try:
            return self.env.begin()
        except lmdb.MapResizedError:
            pass
        self._gate.leave_for_resize(self.env)
        return self.env.begin()

    # -- meta ---------------------------------------------------------------------------------
    def schema(self) -> int | None:
        with self._reading() as txn:
            raw = txn.get(_SCHEMA_KEY, db=self._meta)
        return int.from_bytes(raw, "little") if raw is not None else None

    def meta_get(self, name: bytes) -> bytes | None:
        with self._reading() as txn:
            raw = txn.get(name, db=self._meta)
        return bytes(raw) if raw is not None else None

    def meta_put(self, name: bytes, value: bytes) -> None:
        self._write(lambda txn: txn.put(name, value, db=self._meta))

    # -- records ------------------------------------------------------------------------------
    def get(self, key: bytes) -> IndexRecord | None:
        with self._reading() as txn:
            raw = txn.get(key, db=self._segments)
        return IndexRecord.unpack(bytes(raw), f"index record {key.hex()}") if raw else None

    def has_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each of ``keys`` has a record, in one read transaction (nothing unpacked)."""
        with self._reading() as txn:
            return [txn.get(k, db=self._segments) is not None for k in keys]

    def put(self, key: bytes, rec: IndexRecord) -> None:
        self._write(lambda txn: self._put_in(txn, key, rec, self._unput_in(txn, key) or 0))

    def delete(self, key: bytes) -> bool:
        def run(txn: Any) -> bool:
            removed = self._unput_in(txn, key)
            if removed is None:
                return False
            self._add_bytes(txn, -removed)
            return True

        return self._write(run)

    def keys(self) -> list[bytes]:
        with self._reading() as txn:
            return [bytes(k) for k in txn.cursor(db=self._segments).iternext(values=False)]

    def items(self) -> Iterator[tuple[bytes, IndexRecord]]:
        with self._reading() as txn:
            rows = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self._segments)]
        for k, v in rows:
            yield k, IndexRecord.unpack(v, f"index record {k.hex()}")

    def __len__(self) -> int:
        with self._reading() as txn:
            return int(txn.stat(self._segments)["entries"])

    def used_bytes(self) -> int:
        """Data-file plus sidecar bytes of every record (the ``totals`` counter): one read."""
        with self._reading() as txn:
            raw = txn.get(_BYTES_KEY, db=self._totals)
        return _U64.unpack(raw)[0] if raw is not None else 0

    def totals_ok(self) -> bool:
        """The derived tables exist and cover every record (else open rebuilds the index: an
        index written before them has none, and an older writer would not have kept ``ages`` in
        step)."""
        with self._reading() as txn:
            if txn.get(_BYTES_KEY, db=self._totals) is None:
                return False
            return bool(txn.stat(self._ages)["entries"] == txn.stat(self._segments)["entries"])

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        """Every ``(key, record)``, oldest ``sealed_at_ns`` first (ties by key), read lazily a
        few rows per short read transaction: O(log n) a row, nothing held between rows. A row
        removed after its batch was read may still be yielded (the caller's delete or move then
        finds it gone); one added meanwhile behind the cursor is not."""
        after = b""
        while True:
            with self._reading() as txn:
                cur = txn.cursor(db=self._ages)
                rows: list[tuple[bytes, bytes]] = []
                ok = cur.set_range(after + b"\0") if after else cur.first()
                while ok and len(rows) < _OLDEST_BATCH:
                    age_key = bytes(cur.key())
                    raw = txn.get(age_key[_AGE.size :], db=self._segments)
                    if raw is not None:
                        rows.append((age_key, bytes(raw)))
                    after = age_key
                    ok = cur.next()
            for age_key, raw in rows:
                key = age_key[_AGE.size :]
                yield key, IndexRecord.unpack(raw, f"index record {key.hex()}")
            if not ok:
                return

    # all record writes go through these three, inside the caller's write transaction
    def _unput_in(self, txn: Any, key: bytes) -> int | None:
        """Remove ``key``'s record and its age row; the bytes it accounted for (None: there was
        no record)."""
        raw = txn.get(key, db=self._segments)
        if raw is None:
            return None
        try:
            old = IndexRecord.unpack(bytes(raw), f"index record {key.hex()}")
        except FormatError:  # an invalid record: nothing it says can be trusted or undone
            txn.delete(key, db=self._segments)
            return 0
        txn.delete(_AGE.pack(old.sealed_at_ns) + key, db=self._ages)
        txn.delete(key, db=self._segments)
        return old.total_bytes

    def _put_in(self, txn: Any, key: bytes, rec: IndexRecord, removed: int) -> None:
        txn.put(key, rec.pack(), db=self._segments)
        txn.put(_AGE.pack(rec.sealed_at_ns) + key, b"", db=self._ages)
        self._add_bytes(txn, rec.total_bytes - removed)

    def _add_bytes(self, txn: Any, delta: int) -> int:
        raw = txn.get(_BYTES_KEY, db=self._totals)
        now = _U64.unpack(raw)[0] if raw is not None else 0
        txn.put(_BYTES_KEY, _U64.pack(max(0, now + delta)), db=self._totals)
        return delta

    def replace_all(self, records: dict[bytes, IndexRecord], fingerprint: bytes) -> None:
        """Make the index exactly ``records`` in one transaction (the rebuild, spec F-IDX-3),
        with the derived ``ages`` and ``totals`` tables."""

        def run(txn: Any) -> None:
            for db in (self._segments, self._ages, self._totals):
                txn.drop(db, delete=False)
            self._add_bytes(txn, 0)
            for k, rec in records.items():
                self._put_in(txn, k, rec, 0)
            txn.put(_SCHEMA_KEY, INDEX_SCHEMA.to_bytes(4, "little"), db=self._meta)
            txn.put(FINGERPRINT_KEY, fingerprint, db=self._meta)

        self._write(run)

    def apply(self, puts: dict[bytes, IndexRecord], deletes: list[bytes]) -> None:
        """Apply record puts and deletes in one transaction."""

        def run(txn: Any) -> None:
            for k in deletes:
                self._add_bytes(txn, -(self._unput_in(txn, k) or 0))
            for k, rec in puts.items():
                self._put_in(txn, k, rec, self._unput_in(txn, k) or 0)

        self._write(run)
