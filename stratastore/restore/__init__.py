"""The restore path: two passes, the prefix ladder, destinations (spec F-SC-3, F-SEG-4).

A destination is anything with the members of :class:`Destination`; what else it can do
(direct scatter reads into its page views, a stored region, living on a device) is said by
its members too (:mod:`.capabilities`), and the fast paths ask that, never its class."""

from stratastore.restore.agenda import SHARED_READER, SharedAgenda, restore_batch
from stratastore.restore.capabilities import (
    Destination,
    GathersPages,
    OnDevice,
    PageViews,
    ScatterReads,
    StoredRegion,
    Zeroable,
    lives_on_device,
    page_gather,
    page_view_source,
    scatter_reads,
)
from stratastore.restore.destinations import (
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
    "GathersPages",
    "Job",
    "LayerKV",
    "OnDevice",
    "Outcome",
    "PageViews",
    "PagedKV",
    "Piece",
    "RestoreFailed",
    "ScatterReads",
    "SharedAgenda",
    "StoredRegion",
    "Zeroable",
    "as_destination",
    "as_engine_capture",
    "checked_block_table",
    "deliver_capture",
    "flat_bytes",
    "lives_on_device",
    "page_gather",
    "page_view_source",
    "restore_batch",
    "pack_pages",
    "recut_pages",
    "scatter_reads",
    "two_pass_restore",
]
