"""The content-addressed segment store (spec F-SC, F-IDX, F-DUR)."""

from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.local.index import SegmentIndex
from stratastore.levels.local.segment_store import PutResult, SegmentStore, Skipped, StoreStats
from stratastore.levels.reader import OutOfRange, PayloadReader, SegmentReader
from stratastore.levels.sealing import STATE_PAGE_BYTES

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
