"""Checkpoint chains, prefix lookup, retention and parking policy (DESIGN layer 4)."""

from .model import Checkpoint, Conversation, InvalidRequest, as_media, as_tokens, page_floor
from .prefix_index import Match, PrefixIndex
from .retention import POLICIES, Policy, enforce_count, lru_victim, spread_victim, victim

__all__ = [
    "POLICIES",
    "Checkpoint",
    "Conversation",
    "InvalidRequest",
    "Match",
    "Policy",
    "PrefixIndex",
    "as_media",
    "as_tokens",
    "enforce_count",
    "lru_victim",
    "page_floor",
    "spread_victim",
    "victim",
]
