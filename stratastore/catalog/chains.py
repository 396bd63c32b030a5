"""What a conversation's manifest means to the catalog and its GC (spec F-CAT-3, F-CAT-4,
F-CHAIN-6): the keys it names, the prefix GC keeps, the manifest cut from its tail, and the
conversation's key in the catalog. Pure: no I/O, no catalog."""

from __future__ import annotations

from dataclasses import replace

import blake3

from stratastore.format.manifest import ChainManifest

__all__ = ["conv_id_key", "cut_manifest", "evictable", "manifest_keys", "pinned_length"]


def manifest_keys(m: ChainManifest) -> set[bytes]:
    """Every segment key a manifest names: its K/V segments and its running states."""
    keys = {k for _, _, k in m.segments}
    keys.update(c.state_key for c in m.checkpoints if c.state_key)
    return keys


def pinned_length(m: ChainManifest) -> int:
    """The prefix capacity GC keeps (spec F-CHAIN-5, F-CHAIN-6): all of a session; else the
    segments that end at or below the deepest pinned checkpoint."""
    if m.session:
        return len(m.tokens)
    pin = max((c.length for c in m.checkpoints if c.pinned), default=0)
    return max((e for _, e, _ in m.segments if e <= pin), default=0)


def cut_manifest(m: ChainManifest, length: int) -> ChainManifest | None:
    """``m`` cut to its segments ending at or below ``length`` (a chain shortened from its
    tail, F-CHAIN-3), or None when nothing is left."""
    segs = tuple(s for s in m.segments if s[1] <= length)
    end = segs[-1][1] if segs else 0
    if end == 0:
        return None
    return replace(
        m,
        tokens=m.tokens[:end],
        checkpoints=tuple(c for c in m.checkpoints if c.length <= end),
        media=tuple(x for x in m.media if x[0] < end),
        segments=segs,
    )


def conv_id_key(conv_id: str) -> bytes:
    """A conversation's key in the catalog: BLAKE3 of its id, the digest its manifest file is
    named by (F-CHAIN-4); ids are up to 4 KiB, LMDB keys at most 511 bytes."""
    return blake3.blake3(conv_id.encode()).digest()


def evictable(m: ChainManifest) -> bool:
    return not m.session and pinned_length(m) < len(m.tokens)
