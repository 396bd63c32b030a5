"""stratastore: durable, tiered, validated storage for LLM conversation state.

The package root is the engine's API: :class:`Store` and its settings, the chunk store for
engines that key pages by content (:class:`ChunkStore`, :class:`ChunkConfig`,
:class:`ChunkLevel`), the conversation model (:class:`Conversation`, :class:`Checkpoint`,
:class:`ModelFingerprint`), what the calls return (:class:`ParkReport`, :class:`Restored`,
:class:`StoreDescription`), where a restore writes (the destinations) and the errors. The
on-disk enums (``Codec``, ``DType``, ``Kind``, ``Level``) are the format's, in
``stratastore.format``. Below it, by layer (docs/design.md): ``format`` (pure encode and
decode, format-spec/SPEC.md) -> ``io`` (the only filesystem code) -> ``levels`` (the level
protocol and its backends: ``levels.local``, ``levels.redis``, ``levels.memory``) -> ``chain``
-> ``catalog`` -> ``tiers`` (the flow: park, lookup, restore) -> the :class:`Store`. Operator
tools are in ``ops`` and ``metrics``, the CLI in ``cli``.
"""

from stratastore.catalog import CatalogBusy
from stratastore.chain import Checkpoint, Conversation, InvalidRequest
from stratastore.chunks import ChunkConfig, ChunkLevel, ChunkStore
from stratastore.config import LevelSpec, StoreConfig
from stratastore.errors import ConfigError, LevelUnavailable, StrataError
from stratastore.facade import BatchRestoreError, SpillError, Store, StoreClosed
from stratastore.format import (
    ChecksumMismatch,
    FormatError,
    IncompatibleFingerprint,
    KeyMismatch,
    ModelFingerprint,
    UnsupportedVersion,
)
from stratastore.io import StrataIOError
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.restore import (
    Destination,
    DestinationRefused,
    DeviceFlatKV,
    DeviceLayerKV,
    DevicePagedKV,
    FlatKV,
    GathersPages,
    LayerKV,
    OnDevice,
    PagedKV,
    PageViews,
    RestoreFailed,
    ScatterReads,
    StoredRegion,
    Zeroable,
)
from stratastore.tiers.describe import LevelDescription, RamDescription, StoreDescription
from stratastore.tiers.records import InvalidConversation, ParkReport, Restored

__version__ = "0.1.0"

__all__ = [
    "BatchRestoreError",
    "CatalogBusy",
    "Checkpoint",
    "ChecksumMismatch",
    "ChunkConfig",
    "ChunkLevel",
    "ChunkStore",
    "ConfigError",
    "Conversation",
    "Destination",
    "DestinationRefused",
    "DeviceFlatKV",
    "DeviceLayerKV",
    "DevicePagedKV",
    "FlatKV",
    "GathersPages",
    "FormatError",
    "IncompatibleFingerprint",
    "InvalidConversation",
    "InvalidRequest",
    "KeyMismatch",
    "LayerKV",
    "LevelDescription",
    "LevelSpec",
    "LevelUnavailable",
    "ModelFingerprint",
    "OnDevice",
    "PageViews",
    "PagedKV",
    "ParkReport",
    "RamDescription",
    "RestoreFailed",
    "Restored",
    "ScatterReads",
    "SegmentNotFound",
    "SpillError",
    "Store",
    "StoreClosed",
    "StoreConfig",
    "StoreDescription",
    "StoreError",
    "StoredRegion",
    "StrataError",
    "StrataIOError",
    "UnsupportedVersion",
    "Zeroable",
    "__version__",
]
