"""stratastore: durable, tiered, validated storage for LLM conversation state.

Layers (DESIGN.md): ``format`` (pure encode/decode) -> ``io`` (the only filesystem code) ->
``store`` (content-addressed segments with an LMDB index; ``levels``: the backend protocol) ->
``chain`` -> ``catalog`` (shared by every process) -> ``tiers`` -> the ``Store``. See
format-spec/SPEC.md.
"""

from stratastore.catalog import CatalogBusy
from stratastore.chain import Checkpoint, Conversation, InvalidRequest
from stratastore.config import LevelSpec, StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.facade import BatchRestoreError, SpillError, Store, StoreClosed
from stratastore.format import (
    ChecksumMismatch,
    Codec,
    DType,
    FormatError,
    IncompatibleFingerprint,
    Kind,
    Level,
    ModelFingerprint,
    UnsupportedVersion,
)
from stratastore.io import StrataIOError
from stratastore.levels import SegmentBackend
from stratastore.levels.local import (
    PutResult,
    SegmentNotFound,
    SegmentStore,
    StoreError,
    StoreStats,
)
from stratastore.tiers.tiered import InvalidConversation

__version__ = "0.1.0"

__all__ = [
    "BatchRestoreError",
    "CatalogBusy",
    "Checkpoint",
    "ChecksumMismatch",
    "Codec",
    "ConfigError",
    "Conversation",
    "DType",
    "FormatError",
    "IncompatibleFingerprint",
    "InvalidConversation",
    "InvalidRequest",
    "Kind",
    "Level",
    "LevelSpec",
    "ModelFingerprint",
    "PutResult",
    "SegmentBackend",
    "SegmentNotFound",
    "SegmentStore",
    "SpillError",
    "Store",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreStats",
    "StrataError",
    "StrataIOError",
    "UnsupportedVersion",
    "__version__",
]
