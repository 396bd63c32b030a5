"""The segment-backend protocol: what a level is (DESIGN "Levels are backends").

A level stores the *sealed segments* of one model: a segment is a key (spec F-KEY), a sidecar
(F-SC: the page digests, the stored sizes, the level that sealed it) and its *stored payload*
(F-SEG-4: RAW pages, or one zstd frame a page). A backend keeps them, and nothing else; the
policy above it (budgets, the cascade, pins, GC) lives in ``tiers/`` and ``catalog/``. The
local directory store :class:`~stratastore.levels.local.SegmentStore` is the first backend;
``tests/conformance`` proves the seam with an in-memory one, and
:class:`~stratastore.testing.BackendTests` is the suite every backend passes.

Contracts every backend keeps:

* **immutable, content-addressed** (F-DUR-7): a put of a key already held writes nothing and
  returns ``created=False``; a key names one content forever.
* **all or nothing** (F-DUR-2, F-DUR-5, F-IDX-4): a put is invisible until whole; after a
  delete no read finds the key; ``keys``/``records``/``used``/``oldest`` only ever describe
  whole segments.
* **delivered means validated** (F-SC-3): ``get_into``/``get_bytes`` hash every page in the
  memory they deliver from and raise :class:`~stratastore.format.ChecksumMismatch` for one
  that does not match; ``read_into`` and the reader's range reads deliver *stored* bytes
  unvalidated, for a caller that hashes what it reads (the restore's read pass).
* **the key asked for**: ``open_reader(key)`` answers the segment ``key`` (its sidecar names
  that key, this model). The reads above the seam do not rely on it: they open a segment by
  :func:`~stratastore.levels.reader.open_checked`, and an answer that is another segment is
  damage there (a miss), whatever the backend.
* **typed errors**: a key not held is :class:`~stratastore.levels.local.SegmentNotFound` on every
  read (including one deleted by another process between two calls); another model's segment
  :class:`~stratastore.format.IncompatibleFingerprint`; a bad buffer or argument
  :class:`~stratastore.levels.local.StoreError`; a range past the end
  :class:`~stratastore.levels.local.OutOfRange`; damage a
  :class:`~stratastore.format.FormatError` / ``ChecksumMismatch``; never a crash or a raw OS
  error for a missing key.
* **cost that does not grow with the store**: ``used`` is O(1); ``oldest`` O(log n) a row.
* **thread-safe**: any method from any thread; readers never wait on writers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from stratastore.format import Codec, IndexRecord, Level, MediaRef, ModelFingerprint, Sidecar
from stratastore.levels.relocation import Relocated, relocate_by_copy
from stratastore.levels.sealing import Buffer, Payload

__all__ = [
    "CatalogHost",
    "OpenSegment",
    "PutResult",
    "Relocated",
    "SegmentBackend",
    "SharedBackend",
    "SharedSettings",
    "StoreStats",
    "TableEnvironment",
    "relocate_by_copy",
]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PutResult:
    key: bytes
    created: bool  #: False when the key was already committed (nothing was written)
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    entries: int
    disk_bytes: int  #: data files plus sidecars of the indexed segments


@runtime_checkable
class OpenSegment(Protocol):
    """A committed segment held open for reads of its stored payload into memory the caller
    owns (what the restore's read pass uses; :class:`~stratastore.levels.local.PayloadReader` builds
    every method but the positional read, so a backend implements only that). Once open, its
    reads see one version of the segment: a delete meanwhile is a typed error at the read or
    the old bytes, never a mix."""

    sidecar: Sidecar

    def read_into(self, buf: npt.NDArray[np.uint8] | memoryview, offset: int = 0) -> None:
        """Fill all of ``buf`` with stored bytes from ``offset``, unvalidated;
        :class:`~stratastore.levels.local.OutOfRange` past the end."""
        ...

    def readv_into(self, bufs: list[memoryview], offset: int = 0) -> None:
        """Fill ``bufs`` in turn (a scatter read) with stored bytes from ``offset``."""
        ...

    def advise(self, offset: int, nbytes: int) -> None:
        """A hint that stored bytes ``[offset, offset + nbytes)`` are read soon (a file's
        reader starts reading them into the page cache); never raises."""
        ...

    def stored(self) -> npt.NDArray[np.uint8]:
        """The whole stored payload, in new memory, unvalidated."""
        ...

    def pages(self, pages: int | None = None) -> npt.NDArray[np.uint8]:
        """The first ``pages`` pages (default all), decoded, unvalidated, in new memory."""
        ...

    def copy_validated(self, dst: memoryview, verify: bool) -> None:
        """Fill ``dst`` with the pages; with ``verify`` only pages that match (F-SC-3)."""
        ...

    def first_bad_page(self, *, sample: bool = False) -> int:
        """The first page that fails its digest, or -1."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class SegmentBackend(Protocol):
    """One level: the sealed segments of one model (``fingerprint``) at ``level``.

    ``path`` names it for messages and reports: a directory, or for other backends a URL-like
    string (``redis://host/db#prefix``, ``memory://name``).
    """

    path: str
    level: Level
    fingerprint: ModelFingerprint

    # -- capabilities: what the flow above may rely on (class attributes) ----------------------
    #: what is put survives a close and the process (the in-memory level: False)
    persistent: bool
    #: several nodes use it at once (the remote level): it holds copies, never the only one
    shared: bool
    #: it can be walked by parent key (:class:`SharedBackend` ``children_many``), so a prompt's
    #: chain is found in it without a catalog (the remote level, spec F-REM)
    chain_index: bool
    #: it can hold the shared catalog's tables (:class:`CatalogHost`, spec F-CAT-1)
    hosts_catalog: bool

    # -- writing (spec F-DUR-2, F-DUR-7) ------------------------------------------------------
    def put_kv(
        self,
        parent_key: bytes,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        payload: Payload,
        *,
        token_start: int,
        media: Sequence[MediaRef] = (),
        codec: Codec = Codec.RAW,
        page_hashes: npt.NDArray[np.uint8] | None = None,
    ) -> PutResult:
        """Seal and store the K/V pages of ``tokens`` after the prefix ``parent_key`` (key: spec
        F-KEY-2, layout F-SEG-4; :func:`~stratastore.levels.sealing.kv_segment` checks and keys
        it). ``payload`` must be C-contiguous and exactly ``len(tokens) * token_bytes`` long,
        else :class:`~stratastore.levels.local.StoreError`; or a
        :class:`~stratastore.levels.sealing.PageSource` of that many bytes (its pages gathered
        as they are written, :mod:`~stratastore.levels.streamed`). A key already held:
        ``created=False``.

        ``page_hashes`` (``None``: the backend hashes the pages): the ``(pages, 32)`` uint8
        BLAKE3 digests of ``payload``'s pages, which the sidecar carries as they are, not
        hashed again (a park from device memory, hashed there by the kernel over the same bytes
        before their one copy to the host). The caller vouches that they are
        of these bytes; a wrong shape is a :class:`~stratastore.levels.local.StoreError`, before
        anything is stored (``kv_segment`` checks it)."""
        ...

    def put_state(
        self, checkpoint_key: bytes, payload: Buffer, *, token_pos: int, codec: Codec = Codec.RAW
    ) -> PutResult:
        """Seal and store a running state saved at ``checkpoint_key`` (spec F-KEY-5)."""
        ...

    def put_sealed(self, sidecar: Sidecar, stored: Buffer) -> PutResult:
        """Store a segment another level sealed (the generic relocation's write): ``stored``
        is its stored payload. Checked first, model, size and every page
        (:func:`~stratastore.levels.sealing.check_sealed`), then committed under this level's
        own sidecar (its ``level``, sealed now: F-SC-5, F-DUR-8)."""
        ...

    # -- reading (spec F-SC-3, F-IDX) ---------------------------------------------------------
    def __contains__(self, key: bytes) -> bool:
        """Whether a whole segment ``key`` is held (F-IDX-4)."""
        ...

    def record(self, key: bytes) -> IndexRecord:
        """The segment's index record (F-IDX-1: kind, level, sizes, tokens, sealed_at)."""
        ...

    def keys(self) -> list[bytes]:
        """Every key held (a snapshot)."""
        ...

    def records(self) -> list[tuple[bytes, IndexRecord]]:
        """Every ``(key, record)`` held (a snapshot)."""
        ...

    def open_reader(self, key: bytes) -> OpenSegment:
        """``key`` held open for range reads (the restore's read pass). Close it."""
        ...

    def prefetch(self, key: bytes) -> bool:
        """A hint that ``key`` is read soon (read-ahead); never raises, False when ignored."""
        ...

    def read_into(self, key: bytes, offset: int, out: Buffer) -> int:
        """Copy *stored* bytes of ``key`` from ``offset`` into ``out``, unvalidated: as many as
        fit, up to the end; returns the count (0 at the end).
        :class:`~stratastore.levels.local.OutOfRange` for an offset before 0 or past the end;
        :class:`~stratastore.levels.local.StoreError` for a read-only or non-contiguous ``out``."""
        ...

    def get_into(self, key: bytes, out: Buffer, *, verify: bool = True) -> Sidecar:
        """Copy the segment's pages (decoded) into ``out`` (at least ``payload_bytes``;
        writable, contiguous: else ``StoreError``), with ``verify`` only pages that match
        their digests (F-SC-3: ``ChecksumMismatch`` names the first that does not). Returns
        the sidecar."""
        ...

    def get_bytes(self, key: bytes, *, max_bytes: int) -> bytes:
        """The validated payload as bytes; ``StoreError`` before allocating one over
        ``max_bytes``."""
        ...

    # -- managing -----------------------------------------------------------------------------
    def delete(self, key: bytes) -> bool:
        """Remove ``key`` (F-DUR-5); False when it was not held."""
        ...

    def __len__(self) -> int:
        """How many segments the level holds. O(1)."""
        ...

    def used(self) -> int:
        """Bytes the level holds: stored data plus sidecars of every segment (the directory
        store: data files plus sidecars, what F-IDX-1 records). O(1)."""
        ...

    def oldest(self) -> Iterator[tuple[bytes, IndexRecord]]:
        """Every ``(key, record)``, oldest ``sealed_at_ns`` first (ties by key), lazily: O(log
        n) a row (capacity and age GC stop after the first few). A row may be gone by the time
        it is yielded."""
        ...

    def relocate_from(self, src: SegmentBackend, key: bytes) -> Relocated:
        """Move ``key`` from ``src`` (another level of the same model) into this one, all or
        nothing (F-DUR-8): ``"link"``/``"copy"`` when moved, then gone from ``src``;
        ``"present"`` when this level held it already (``src``'s copy is dropped).
        ``SegmentNotFound`` when ``src`` does not hold it (another process moved or deleted it
        meanwhile); ``IncompatibleFingerprint`` for another model's level. Any other failure
        leaves the segment whole in ``src``. :func:`relocate_by_copy` does it for any pair."""
        ...

    def close(self) -> None:
        """Release what the backend holds; idempotent."""
        ...


@runtime_checkable
class TableEnvironment(Protocol):
    """A transactional environment of named tables (LMDB's API), which the shared catalog keeps
    beside a level's own index (spec F-CAT-1)."""

    @property
    def env(self) -> Any:
        """The environment its tables are opened in (``env.open_db(name)``)."""
        ...

    def write_txn(self, fn: Callable[[Any], _T]) -> _T:
        """Run ``fn(txn)`` in one write transaction; a failure is a typed error, never a raw
        one of the environment."""
        ...

    def read_txn(self) -> AbstractContextManager[Any]:
        """A read transaction, as a context manager."""
        ...


@runtime_checkable
class CatalogHost(SegmentBackend, Protocol):
    """A level that can hold the shared catalog (``hosts_catalog``): the catalog's tables live in
    the same environment as the level's index, so a park's catalog rows and its segments' index
    rows are one store's (spec F-CAT-1). The flow puts the catalog in the last disk level."""

    def catalog_tables(self) -> TableEnvironment:
        """The environment the catalog's tables are opened in."""
        ...


class SharedSettings(Protocol):
    """What the flow reads of the shared level's settings (the level's own table holds the
    rest: how to reach it, its credentials, its namespace)."""

    @property
    def shown(self) -> str:
        """The level's name as every message shows it: no credentials."""
        ...

    @property
    def eviction(self) -> str:
        """``"store"``: the flow keeps the level within :attr:`budget_bytes` after each push;
        anything else leaves the budget to the level itself."""
        ...

    @property
    def budget_bytes(self) -> int:
        """The bytes the level may hold (0: no limit)."""
        ...

    @property
    def timeout_s(self) -> float:
        """How long one lookup's round trips may take, all of them together."""
        ...

    @property
    def keep_local(self) -> bool:
        """Whether a restore from the level writes what it delivered to the local levels."""
        ...


@runtime_checkable
class SharedBackend(SegmentBackend, Protocol):
    """A level several nodes share (capabilities: *shared*, *has a chain index*): what the flow's
    shared level (``tiers/remote.py``) uses beyond :class:`SegmentBackend`. It holds copies:
    every node acknowledges a park on its own levels first, and no node's catalog names its
    segments (spec F-REM). It is reached over a network, so every call is bounded in time and a
    level that cannot be reached (down, refused, timed out) is a
    :class:`~stratastore.io.errors.StrataIOError` of the call, never a hang; its messages name
    it without credentials (``path``).
    """

    @property
    def settings(self) -> SharedSettings:
        """How the flow treats the level (its budget, timeout, whether restores are kept
        locally), without credentials."""
        ...

    @property
    def ns(self) -> str:
        """The prefix of every name this level writes in the shared store (spec F-REM-1: the
        store's name and the model's fingerprint), as stats show it."""
        ...

    @property
    def counters(self) -> Mapping[str, int]:
        """What the level counted of its own calls (errors, timeouts, parts missing, puts that
        lost a race to another node...), by name: ``Store.stats()`` shows each as
        ``backend_<name>``."""
        ...

    def connect(self) -> None:
        """Reach the level once, now: a :class:`~stratastore.io.errors.StrataIOError` for one
        that cannot be reached, with ``errno`` EACCES where the credentials or TLS files were
        refused (the user's to fix: said at open, not at the first park)."""
        ...

    def open_warnings(self) -> list[str]:
        """What the user should be told about the level's configuration once it is reached
        (a server that will never evict what the settings leave it to evict), one line each;
        empty when all is well or the level cannot tell. Never raises."""
        ...

    def deadline(self, seconds: float) -> AbstractContextManager[None]:
        """A block within which every call this thread makes ends by ``seconds`` from now, all
        of them together (one lookup's round trips: one deadline); past it a call is a
        :class:`~stratastore.io.errors.StrataIOError` (``ETIMEDOUT``)."""
        ...

    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each of ``keys`` is held (:meth:`__contains__` of each), in one call."""
        ...

    def children_many(self, parents: Sequence[bytes]) -> list[list[tuple[bytes, int, int]]]:
        """The chain index (spec F-REM-5): for each of ``parents``, the K/V segments held whose
        parent key it is, as ``(key, token_start, token_end)`` rows, in one call. A hint: a
        damaged entry finds nothing, and the caller checks each child by deriving its key from
        the prompt's own tokens (F-KEY-2) before it counts."""
        ...


if TYPE_CHECKING:  # the first implementation satisfies the protocol (mypy strict checks this)
    from stratastore.levels.local.segment_store import SegmentStore

    _local: type[SegmentBackend] = SegmentStore
    _host: type[CatalogHost] = SegmentStore
