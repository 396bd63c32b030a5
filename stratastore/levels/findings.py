"""The table of fsck findings: every finding id, its severity, the spec clause it is about, the
MUST clauses it breaks and what repair does about it (format-spec/FSCK.md documents this table;
``tests/unit/ops/test_findings_table.py`` holds the two together).

Every module that names a finding takes it from here: fsck and repair
(:mod:`stratastore.ops.fsck`, :mod:`stratastore.ops.repair`), the conformance check
(:mod:`stratastore.testing.conformance`: a finding with ``violates`` breaks those MUST clauses,
one without is a state the spec allows), the segment check open and fsck share
(:mod:`stratastore.levels.inspect`) and the remote level's fsck. Ids are stable: scripts grep
them (git fsck's message ids). It lives in the seam because the seam's own segment check names
its damage by these ids; operator tools above it import it, never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Literal

__all__ = ["FINDINGS", "Finding", "FindingKind", "Repair", "Severity"]

Severity = Literal["error", "warning", "info"]


class Repair(Enum):
    """What ``strata fsck --repair`` does about a finding (format-spec/FSCK.md, its repair
    table); the value says it to an operator."""

    REMOVE_TEMP = "the temp file is removed"
    QUARANTINE_SEGMENT = "the segment's files are moved into strata-quarantine/ (never deleted)"
    QUARANTINE_MANIFEST = "the manifest is moved into strata-quarantine/"
    CUT_CHAIN = "the manifest is cut to its deepest checkpoint below the first missing segment"
    REBUILD_INDEX = "the index is rebuilt from the sidecars"
    LEAVE = "left alone and reported"


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of fsck (git fsck style): its stable ``id`` (a :class:`FindingKind`'s), its
    severity, the object (a file, ``<dir>/strata-index/<key>``, or a key) and a detail."""

    id: str
    severity: Severity
    object: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FindingKind:
    """One row of the table: ``id`` (stable), ``severity``, ``spec`` (the clause it is about),
    ``violates`` (the MUST clauses a store with this finding breaks; empty: a state the spec
    allows, e.g. after a crash) and ``repair`` (what repair does)."""

    id: str
    severity: Severity
    spec: str
    violates: tuple[str, ...]
    repair: Repair

    def found(self, obj: str, detail: str, severity: Severity | None = None) -> Finding:
        """A finding of this kind at ``obj``; ``severity`` overrides the table's where the
        table says it depends (``CHAIN_BROKEN`` of a saved session is an error)."""
        return Finding(self.id, severity or self.severity, obj, detail)


def _kind(
    id: str, severity: Severity, spec: str, repair: Repair, violates: tuple[str, ...] = ()
) -> FindingKind:
    return FindingKind(id, severity, spec, violates, repair)


_Q, _IDX, _LEAVE = Repair.QUARANTINE_SEGMENT, Repair.REBUILD_INDEX, Repair.LEAVE

# -- a damaged segment (one finding per segment, named by its cause) ---------------------------
SIDECAR_INVALID = _kind("SIDECAR_INVALID", "error", "F-SC", _Q, ("F-SC-1", "F-SC-6", "F-SC-7"))
SIDECAR_UNSUPPORTED = _kind(
    "SIDECAR_UNSUPPORTED", "error", "F-COMPAT-1", _LEAVE, ("F-COMPAT-1", "F-COMPAT-2")
)  # valid data for a newer reader
SIDECAR_CHECKSUM = _kind("SIDECAR_CHECKSUM", "error", "F-SC-2", _Q, ("F-SC-2",))
#: a keyed level's sidecar written without its key or with another (planted, or a key the
#: level was not given): damage to a reader
SIDECAR_UNAUTHENTICATED = _kind("SIDECAR_UNAUTHENTICATED", "error", "F-KEYED-5", _Q, ("F-KEYED-5",))
SIDECAR_KEY_MISMATCH = _kind("SIDECAR_KEY_MISMATCH", "error", "F-KEY-6", _Q, ("F-KEY-6",))
DATA_MISSING = _kind("DATA_MISSING", "error", "F-DUR-2", _Q, ("F-DUR-2",))
SEGMENT_HEADER_INVALID = _kind("SEGMENT_HEADER_INVALID", "error", "F-SEG-1", _Q, ("F-SEG-1",))
SEGMENT_HEADER_MISMATCH = _kind("SEGMENT_HEADER_MISMATCH", "error", "F-SEG-2", _Q, ("F-SEG-2",))
SEGMENT_SIZE_MISMATCH = _kind("SEGMENT_SIZE_MISMATCH", "error", "F-SEG-3", _Q, ("F-SEG-3",))
PAGE_HASH_MISMATCH = _kind("PAGE_HASH_MISMATCH", "error", "F-SC-3", _Q, ("F-SC-3",))
# -- a directory --------------------------------------------------------------------------------
#: keyed segments fsck was given no key for: their trailers and pages are not checked (one
#: finding a directory)
KEYED_UNCHECKED = _kind("KEYED_UNCHECKED", "warning", "F-KEYED-6", _LEAVE)
FINGERPRINT_MISMATCH = _kind("FINGERPRINT_MISMATCH", "error", "F-DIR-6", _LEAVE, ("F-DIR-6",))
SYMLINK = _kind("SYMLINK", "error", "F-DIR-8", _LEAVE, ("F-DIR-8",))  # never followed
NOT_REGULAR_FILE = _kind("NOT_REGULAR_FILE", "error", "F-DIR-8", _LEAVE, ("F-DIR-8",))
STORE_READABLE_BY_OTHERS = _kind("STORE_READABLE_BY_OTHERS", "warning", "F-DIR-9", _LEAVE)
ORPHAN_FILE = _kind("ORPHAN_FILE", "warning", "F-DUR-3", _Q)  # allowed after a crash
ORPHAN_TEMP = _kind("ORPHAN_TEMP", "warning", "F-DIR-3", Repair.REMOVE_TEMP)  # the same
UNKNOWN_FILE = _kind("UNKNOWN_FILE", "info", "F-DIR-2", _LEAVE)  # not the store's: allowed
# -- the index (derived state: the next open or repair rebuilds it) ----------------------------
INDEX_DANGLING = _kind("INDEX_DANGLING", "error", "F-IDX-4", _IDX, ("F-IDX-4",))
INDEX_RECORD_INVALID = _kind("INDEX_RECORD_INVALID", "error", "F-IDX-1", _IDX, ("F-IDX-1",))
INDEX_UNREADABLE = _kind("INDEX_UNREADABLE", "error", "F-IDX-3", _IDX)
INDEX_STALE = _kind("INDEX_STALE", "warning", "F-IDX-2", _IDX, ("F-IDX-2",))
#: an error: the tables change in the records' own transactions, so no crash leaves them
#: wrong, and a writer of 1.2 trusts them (a wrong ``totals`` makes its capacity GC free a
#: level that is not full)
INDEX_TABLES_STALE = _kind("INDEX_TABLES_STALE", "error", "F-IDX-7", _IDX, ("F-IDX-7",))
INDEX_MISSING = _kind("INDEX_MISSING", "warning", "F-IDX-3", _IDX)
INDEX_SCHEMA = _kind("INDEX_SCHEMA", "warning", "F-IDX-3", _IDX)
INDEX_ABSENT = _kind("INDEX_ABSENT", "info", "F-IDX-3", _IDX)
# -- chains and what spans the levels ----------------------------------------------------------
CHAIN_INVALID = _kind(
    "CHAIN_INVALID", "error", "F-CHAIN-1", Repair.QUARANTINE_MANIFEST, ("F-CHAIN-1", "F-CHAIN-2")
)
MANIFEST_KEY_MISMATCH = _kind(
    "MANIFEST_KEY_MISMATCH",
    "error",
    "F-CHAIN-2",
    Repair.QUARANTINE_MANIFEST,
    ("F-CHAIN-2", "F-KEY-2"),
)
#: an error for a saved session (:meth:`FindingKind.found` with ``severity``); allowed, since
#: capacity GC removes segments (F-CHAIN-3)
CHAIN_BROKEN = _kind("CHAIN_BROKEN", "warning", "F-CHAIN-3", Repair.CUT_CHAIN)
SEGMENT_UNREACHABLE = _kind("SEGMENT_UNREACHABLE", "warning", "F-CHAIN-3", _Q)  # a GC hole's
#: a move interrupted by a crash: two whole copies, allowed
DUPLICATE_ACROSS_LEVELS = _kind("DUPLICATE_ACROSS_LEVELS", "warning", "F-DUR-8", _LEAVE)

#: id -> its row (read-only)
FINDINGS: Mapping[str, FindingKind] = MappingProxyType(
    {
        k.id: k
        for k in (
            SIDECAR_INVALID,
            SIDECAR_UNSUPPORTED,
            SIDECAR_CHECKSUM,
            SIDECAR_UNAUTHENTICATED,
            SIDECAR_KEY_MISMATCH,
            DATA_MISSING,
            SEGMENT_HEADER_INVALID,
            SEGMENT_HEADER_MISMATCH,
            SEGMENT_SIZE_MISMATCH,
            PAGE_HASH_MISMATCH,
            FINGERPRINT_MISMATCH,
            KEYED_UNCHECKED,
            SYMLINK,
            NOT_REGULAR_FILE,
            STORE_READABLE_BY_OTHERS,
            ORPHAN_FILE,
            ORPHAN_TEMP,
            UNKNOWN_FILE,
            INDEX_DANGLING,
            INDEX_RECORD_INVALID,
            INDEX_UNREADABLE,
            INDEX_STALE,
            INDEX_TABLES_STALE,
            INDEX_MISSING,
            INDEX_SCHEMA,
            INDEX_ABSENT,
            CHAIN_INVALID,
            MANIFEST_KEY_MISMATCH,
            CHAIN_BROKEN,
            SEGMENT_UNREACHABLE,
            DUPLICATE_ACROSS_LEVELS,
        )
    }
)
