"""Checkpoint chains, prefix lookup, retention and parking policy (DESIGN layer 4)."""

from .model import Checkpoint, Conversation, InvalidRequest, as_media, as_tokens, page_floor
from .prefix_index import Match, PrefixIndex
from .retained import RetainedChains
from .retention import (
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
