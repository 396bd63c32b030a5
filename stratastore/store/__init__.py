"""The content-addressed segment store (DESIGN layer 3, spec F-SC, F-IDX, F-DUR)."""

from .errors import SegmentNotFound, StoreError
from .index import SegmentIndex
from .reader import OutOfRange, PayloadReader, SegmentReader
from .sealing import STATE_PAGE_BYTES
from .segment_store import (
    PutResult,
    SegmentStore,
    Skipped,
    StoreStats,
)

__all__ = [
    "STATE_PAGE_BYTES",
    "OutOfRange",
    "PayloadReader",
    "PutResult",
    "SegmentIndex",
    "SegmentNotFound",
    "SegmentReader",
    "SegmentStore",
    "Skipped",
    "StoreError",
    "StoreStats",
]
