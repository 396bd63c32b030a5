"""The content-addressed segment store (DESIGN layer 3, spec F-SC, F-IDX, F-DUR)."""

from .errors import SegmentNotFound, StoreError
from .index import SegmentIndex
from .reader import SegmentReader
from .segment_store import (
    STATE_PAGE_BYTES,
    PutResult,
    SegmentStore,
    Skipped,
    StoreStats,
)

__all__ = [
    "STATE_PAGE_BYTES",
    "PutResult",
    "SegmentIndex",
    "SegmentNotFound",
    "SegmentReader",
    "SegmentStore",
    "Skipped",
    "StoreError",
    "StoreStats",
]
