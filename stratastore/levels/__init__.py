"""The level seam: what a level is, and the parts every backend shares.

* :mod:`~stratastore.levels.backend`: the protocol (:class:`SegmentBackend`; the capabilities
  ``persistent``, ``shared``, ``chain_index``, ``hosts_catalog``; :class:`SharedBackend`,
  :class:`CatalogHost`) and its result types;
* :mod:`~stratastore.levels.sealing`, :mod:`~stratastore.levels.reader`: sealing a payload into
  a segment and reading one back validated (spec F-SC, F-SEG);
* :mod:`~stratastore.levels.inspect`, :mod:`~stratastore.levels.findings`: the one segment
  check that open, fsck and the CLI share, and the table of what it can find (FSCK.md);
* :mod:`~stratastore.levels.relocation`: moving a segment between any two levels by copy;
* :mod:`~stratastore.levels.registry`: a level opened from its spec by scheme (a path,
  ``memory://``, ``redis://``, ``redis+cluster://``);
* the backends beside it: :mod:`~stratastore.levels.local` (a directory with an LMDB index),
  :mod:`~stratastore.levels.redis` (a shared Redis or Redis Cluster level),
  :mod:`~stratastore.levels.memory` (a dict, for tests and scratch).

This package imports only ``format/``, ``io/``, the kernels and its own modules; a new backend
is one module (or folder), one row of the registry and a
:class:`~stratastore.testing.BackendTests` subclass.
"""

from stratastore.levels.backend import (
    CatalogHost,
    OpenSegment,
    PutResult,
    Relocated,
    SegmentBackend,
    SharedBackend,
    StoreStats,
    TableEnvironment,
    relocate_by_copy,
)
from stratastore.levels.inspect import InspectedSegment, SegmentDamage, inspect_segment
from stratastore.levels.registry import open_level

__all__ = [
    "CatalogHost",
    "InspectedSegment",
    "OpenSegment",
    "PutResult",
    "Relocated",
    "SegmentBackend",
    "SegmentDamage",
    "SharedBackend",
    "StoreStats",
    "TableEnvironment",
    "inspect_segment",
    "open_level",
    "relocate_by_copy",
]
