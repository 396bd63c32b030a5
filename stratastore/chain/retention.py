"""Checkpoint retention: which checkpoint leaves when a chain holds more than its count.

``lru``: the engine's policy: the tail checkpoint first, then the least recently used one; never
the root or a pinned one (the newest, just used, goes only when nothing else can).

``spread`` (the 200-turn edit table, ``--prompt-cache-spread``): the tail checkpoint first;
otherwise the checkpoint ``i`` whose removal leaves the smallest gap for its distance from the
newest, ``(len[i+1] - len[i-1]) / (len[newest] - len[i-1])``; never the root, the newest or a pinned
one; with no candidate, the ``lru`` choice. Dense recent points go first, so the kept ones thin out
geometrically towards the root. Same count, no extra memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

from stratastore.chain.model import Checkpoint
from stratastore.errors import ConfigError

__all__ = [
    "POLICIES",
    "Policy",
    "add_checkpoint",
    "enforce_count",
    "lru_victim",
    "spread_victim",
    "victim",
]

Policy = Literal["lru", "spread"]
POLICIES: tuple[Policy, ...] = ("lru", "spread")


def _movable(chain: Sequence[Checkpoint], i: int, *, newest_too: bool = False) -> bool:
    last = len(chain) if newest_too else len(chain) - 1
    return 0 < i < last and not chain[i].pinned


def _tail(chain: Sequence[Checkpoint]) -> int | None:
    for i, c in enumerate(chain):
        if c.tail and _movable(chain, i):
            return i
    return None


def lru_victim(chain: Sequence[Checkpoint]) -> int | None:
    """Index of the LRU victim, or ``None`` when only the root and pinned ones remain."""
    tail = _tail(chain)
    if tail is not None:
        return tail
    candidates = [i for i in range(len(chain)) if _movable(chain, i, newest_too=True)]
    return min(candidates, key=lambda i: (chain[i].last_used, i)) if candidates else None


def spread_victim(chain: Sequence[Checkpoint]) -> int | None:
    """Index of the spread victim, falling back to :func:`lru_victim`."""
    tail = _tail(chain)
    if tail is not None:
        return tail
    newest = chain[-1].length
    best, best_score = None, 0.0
    for i in range(len(chain)):
        if not _movable(chain, i):
            continue
        prev, nxt = chain[i - 1].length, chain[i + 1].length
        score = (nxt - prev) / (newest - prev)
        if best is None or score < best_score:
            best, best_score = i, score
    return best if best is not None else lru_victim(chain)


def victim(chain: Sequence[Checkpoint], policy: Policy) -> int | None:
    if policy == "lru":
        return lru_victim(chain)
    if policy == "spread":
        return spread_victim(chain)
    raise ConfigError(f"retention policy {policy!r} is not one of {', '.join(POLICIES)}")


def enforce_count(chain: list[Checkpoint], count: int, policy: Policy) -> list[Checkpoint]:
    """Drop victims until at most ``count`` checkpoints remain (or none can go); returns the
    dropped ones in the order they left."""
    if count < 1:
        raise ConfigError(f"checkpoint count must be at least 1, got {count}")
    dropped = []
    while len(chain) > count:
        i = victim(chain, policy)
        if i is None:
            break
        dropped.append(chain.pop(i))
    return dropped


def add_checkpoint(
    chain: list[Checkpoint], new: Checkpoint, count: int, policy: Policy
) -> list[Checkpoint]:
    """Add ``new`` to ``chain`` (ascending; at its place by length) and hold the chain to ``count``:
    the step an engine takes each time it saves a checkpoint (the 200-turn edit table's simulation
    adds one at each turn's end). Returns the dropped ones, in the order they left (``new`` itself
    among them only when the policy had nothing else to drop)."""
    at = bisect.bisect_left([c.length for c in chain], new.length)
    if at < len(chain) and chain[at].length == new.length:
        raise ConfigError(f"checkpoint at {new.length} is already in the chain")
    chain.insert(at, new)
    return enforce_count(chain, count, policy)
