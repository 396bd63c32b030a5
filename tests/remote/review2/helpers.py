"""Helpers of the second review of the remote level (real redis-server processes)."""

from __future__ import annotations

from pathlib import Path

import redis

from stratastore import Conversation
from tests.remote.review.helpers import FP


def evict_parts(url: str, name: str, key: bytes) -> int:
    """Delete every part of segment ``key`` of store ``name`` (as an eviction would)."""
    from stratastore.levels.redis_settings import namespace

    r = redis.Redis.from_url(url)
    try:
        ns = namespace(name, FP)
        names = list(r.scan_iter(match=f"{ns}p/{{{key.hex()}}}/*", count=1000))
        return int(r.delete(*names)) if names else 0
    finally:
        r.close()


def segment_of(conv: Conversation, start: int) -> bytes:
    """The key of ``conv``'s segment starting at token ``start``."""
    return next(k for s, _, k in conv.segments(FP.digest()) if s == start)


def flip_local(folder: Path, key: bytes, offset: int) -> None:
    """Flip one payload byte (``offset`` bytes into the payload) of a local segment file."""
    path = folder / f"strata-conv-{key.hex()}.seg"
    raw = bytearray(path.read_bytes())
    raw[4096 + offset] ^= 0x01
    path.write_bytes(bytes(raw))
