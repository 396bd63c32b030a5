"""``strata fsck``: an offline, read-only check of store directories.

:func:`fsck` yields :class:`Finding` records, each with a stable id, a severity (error, warning,
info), the object and a detail, in the style of git fsck; the ids, their severities, the spec
clauses they are about and what repair does are one table,
:mod:`stratastore.levels.findings` (documented in format-spec/FSCK.md). It opens nothing for
writing: the LMDB index is read with ``readonly=True`` and no lock file, and no segment file is
touched. ``deep`` re-hashes every page; otherwise the first and the last page of each segment
are sampled. One damaged segment is one finding, named by its cause; what follows from it (its
index record, the chains that stop at it) is in that finding's detail.
:func:`~stratastore.ops.repair.repair` quarantines, rebuilds and cuts chains
(format-spec/FSCK.md); which directories make up a store is
:mod:`stratastore.ops.level_dirs`'s to find. Pages are read with ``pread`` into memory fsck owns
(:class:`~stratastore.levels.reader.SegmentReader`), never through a mapping: a data file
truncated or failing while fsck reads it is a finding, never a SIGBUS.

The modules, in the order of a check: :mod:`.walk` (each directory, then what spans them),
:mod:`.entries` (links, FIFOs and modes, by ``lstat``), the segment check open shares
(:func:`~stratastore.levels.inspect.inspect_segment`), :mod:`.index` (the LMDB index against
the sidecars), :mod:`.chains` (manifests, missing and unreachable segments) and :mod:`.damage`
(one problem, one finding).
"""

from stratastore.levels.findings import Finding, Severity
from stratastore.ops.fsck.chains import committed_keys, quarantined_keys
from stratastore.ops.fsck.walk import fsck

__all__ = ["Finding", "Severity", "committed_keys", "fsck", "quarantined_keys"]
