"""Checkpoint chains, prefix lookup, retention and parking policy."""

from stratastore.chain.model import (
    Checkpoint,
    Conversation,
    InvalidRequest,
    as_media,
    as_tokens,
    page_floor,
)
from stratastore.chain.prefix_index import Match, PrefixIndex
from stratastore.chain.retained import RetainedChains
from stratastore.chain.retention import (
    POLICIES,
    Policy,
    add_checkpoint,
    enforce_count,
    lru_victim,
    spread_victim,
    victim,
)

__all__ = [
    "POLICIES",
    "Checkpoint",
    "Conversation",
    "InvalidRequest",
    "Match",
    "Policy",
    "PrefixIndex",
    "RetainedChains",
    "add_checkpoint",
    "as_media",
    "as_tokens",
    "enforce_count",
    "lru_victim",
    "page_floor",
    "spread_victim",
    "victim",
]
