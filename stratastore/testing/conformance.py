"""``strata conformance``: check a directory written by any implementation against the spec's
MUST clauses (format-spec/SPEC.md), by way of a deep fsck whose findings name clauses.

A finding that breaks a MUST clause is a violation; states the spec allows (an orphan or temp
file after a crash, F-DUR-3; an index that the next open rebuilds, F-IDX-3; a chain broken by
capacity GC, F-CHAIN-3; files that are not the store's, F-DIR-2) are reported but conform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stratastore.ops.fsck import Finding, fsck
from stratastore.ops.level_dirs import StoreLevels

__all__ = ["CLAUSES", "ConformanceReport", "check_conformance"]

#: fsck id -> the MUST clauses it breaks
CLAUSES: dict[str, tuple[str, ...]] = {
    "SIDECAR_INVALID": ("F-SC-1", "F-SC-6", "F-SC-7"),
    "SIDECAR_UNSUPPORTED": ("F-COMPAT-1", "F-COMPAT-2"),
    "SIDECAR_CHECKSUM": ("F-SC-2",),
    "SIDECAR_KEY_MISMATCH": ("F-KEY-6",),
    "DATA_MISSING": ("F-DUR-2",),
    "SEGMENT_HEADER_INVALID": ("F-SEG-1",),
    "SEGMENT_HEADER_MISMATCH": ("F-SEG-2",),
    "SEGMENT_SIZE_MISMATCH": ("F-SEG-3",),
    "PAGE_HASH_MISMATCH": ("F-SC-3",),
    "FINGERPRINT_MISMATCH": ("F-DIR-6",),
    "INDEX_DANGLING": ("F-IDX-4",),
    "INDEX_RECORD_INVALID": ("F-IDX-1",),
    "INDEX_STALE": ("F-IDX-2",),
    "CHAIN_INVALID": ("F-CHAIN-1", "F-CHAIN-2"),
    "MANIFEST_KEY_MISMATCH": ("F-CHAIN-2", "F-KEY-2"),
    "DUPLICATE_ACROSS_LEVELS": (),  # a move interrupted by a crash: allowed (F-DUR-8)
    "CHAIN_BROKEN": (),  # allowed: capacity GC removes segments (F-CHAIN-3)
    "SEGMENT_UNREACHABLE": (),  # allowed: what a chain past a GC hole names (F-CHAIN-3)
    "ORPHAN_FILE": (),  # allowed after a crash (F-DUR-3)
    "ORPHAN_TEMP": (),  # allowed after a crash (F-DIR-3)
    "INDEX_MISSING": (),  # allowed: the index is derived (F-IDX-3)
    "INDEX_ABSENT": (),
    "INDEX_SCHEMA": (),
    "INDEX_UNREADABLE": (),
    "UNKNOWN_FILE": (),  # allowed: F-DIR-2
    "SYMLINK": ("F-DIR-8",),  # a link where a store file or directory belongs
    "NOT_REGULAR_FILE": ("F-DIR-8",),  # a FIFO, device or directory named like a store file
    "STORE_READABLE_BY_OTHERS": (),  # allowed: a permission choice (F-DIR-9 is a SHOULD)
}


@dataclass
class ConformanceReport:
    violations: dict[str, list[Finding]] = field(default_factory=dict)  #: clause -> findings
    allowed: list[Finding] = field(default_factory=list)
    levels: list[str] = field(default_factory=list)  #: the level directories checked

    @property
    def conforms(self) -> bool:
        return not self.violations


def check_conformance(dirs: Sequence[str], *, levels: StoreLevels | None = None
                      ) -> ConformanceReport:  # fmt: skip
    """Every page of the level directories ``dirs`` re-hashed; each finding filed under the
    clauses it breaks (or as allowed). ``levels``: the store's levels, for chain checks (default:
    ``dirs`` and their sibling levels); :func:`~stratastore.ops.level_dirs.find_store_levels` finds
    them from a store root or a config file, as ``strata conformance`` does."""
    report = ConformanceReport(levels=[str(d) for d in dirs])
    for f in fsck(dirs, deep=True, levels=levels):
        clauses = CLAUSES[f.id]
        if not clauses:
            report.allowed.append(f)
        for c in clauses:
            report.violations.setdefault(c, []).append(f)
    return report
