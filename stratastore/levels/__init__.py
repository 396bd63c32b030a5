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
  ``memory://``, ``redis://``, ``redis+cluster://``), one row a backend carrying its settings
  schema (:mod:`~stratastore.levels.settings`), its opener and its hooks; a backend from
  outside the package is registered by :func:`register_backend` or the entry-point group
  ``stratastore.levels``;
* :mod:`~stratastore.levels.directory`, :mod:`~stratastore.levels.shared_check`: what the
  offline tools see of a directory level, and what a check of a shared level's store found;
* the backends beside it: :mod:`~stratastore.levels.local` (a directory with an LMDB index),
  :mod:`~stratastore.levels.redis` (a shared Redis or Redis Cluster level),
  :mod:`~stratastore.levels.memory` (a dict, for tests and scratch).

This package imports only ``format/``, ``io/``, the kernels and its own modules; a new backend
is one module (or folder), one row of the registry (or one :func:`register_backend` call, from
any package) and a :class:`~stratastore.testing.BackendTests` subclass.
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
from stratastore.levels.registry import (
    ENTRY_POINTS,
    BackendEntry,
    open_level,
    register_backend,
    unregister_backend,
)
from stratastore.levels.settings import LevelContext, Setting

__all__ = [
    "ENTRY_POINTS",
    "BackendEntry",
    "CatalogHost",
    "InspectedSegment",
    "LevelContext",
    "OpenSegment",
    "PutResult",
    "Relocated",
    "SegmentBackend",
    "SegmentDamage",
    "Setting",
    "SharedBackend",
    "StoreStats",
    "TableEnvironment",
    "inspect_segment",
    "open_level",
    "register_backend",
    "relocate_by_copy",
    "unregister_backend",
]
