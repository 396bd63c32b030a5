"""``strata conformance``: check a directory written by any implementation against the spec's
MUST clauses (format-spec/SPEC.md), by way of a deep fsck whose findings name clauses.

A finding that breaks a MUST clause is a violation; states the spec allows (an orphan or temp
file after a crash, F-DUR-3; an index that the next open rebuilds, F-IDX-3; a chain broken by
capacity GC, F-CHAIN-3; files that are not the store's, F-DIR-2) are reported but conform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from stratastore.levels.findings import FINDINGS, Finding
from stratastore.ops.fsck import fsck
from stratastore.ops.level_dirs import StoreLevels

__all__ = ["CLAUSES", "ConformanceReport", "check_conformance"]

#: fsck id -> the MUST clauses it breaks (empty: a state the spec allows), from the findings
#: table (:mod:`stratastore.levels.findings`)
CLAUSES: dict[str, tuple[str, ...]] = {k.id: k.violates for k in FINDINGS.values()}


@dataclass
class ConformanceReport:
    violations: dict[str, list[Finding]] = field(default_factory=dict)  #: clause -> findings
    allowed: list[Finding] = field(default_factory=list)
    levels: list[str] = field(default_factory=list)  #: the level directories checked

    @property
    def conforms(self) -> bool:
        return not self.violations


def check_conformance(
    dirs: Sequence[str], *, levels: StoreLevels | None = None
) -> ConformanceReport:
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
