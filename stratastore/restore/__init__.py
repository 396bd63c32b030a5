"""The restore path (DESIGN layer 6): two passes, the prefix ladder, destinations."""

from stratastore.restore.agenda import SHARED_READER, SharedAgenda, restore_batch
from stratastore.restore.destinations import (
    Destination,
    DestinationRefused,
    FlatKV,
    LayerKV,
    PagedKV,
    as_destination,
    checked_block_table,
    flat_bytes,
)
from stratastore.restore.device import DeviceFlatKV, DeviceLayerKV, DevicePagedKV
from stratastore.restore.gather import EngineCapture, as_engine_capture
from stratastore.restore.pages import deliver_capture, pack_pages, recut_pages
from stratastore.restore.two_pass import Job, Outcome, Piece, RestoreFailed, two_pass_restore

__all__ = [
    "SHARED_READER",
    "Destination",
    "DestinationRefused",
    "DeviceFlatKV",
    "DeviceLayerKV",
    "DevicePagedKV",
    "EngineCapture",
    "FlatKV",
    "Job",
    "LayerKV",
    "Outcome",
    "PagedKV",
    "Piece",
    "RestoreFailed",
    "SharedAgenda",
    "as_destination",
    "as_engine_capture",
    "checked_block_table",
    "deliver_capture",
    "flat_bytes",
    "restore_batch",
    "pack_pages",
    "recut_pages",
    "two_pass_restore",
]
