"""Chunk keys: the content key an engine names a page by, and the segment that holds the page.

A chunk store holds pages addressed by a **chunk key**: 32 bytes the engine derived from the
page's content (LMCache's chunk hash, SGLang HiCache's page hash, hashed with what else makes
the page unique: model, rank, dtype). An engine whose keys are strings or hashes of another
length derives a chunk key with :func:`chunk_key`. The page of chunk key ``k`` is stored as
the running-state segment ``state_key(k)`` (spec F-KEY-5): opaque bytes in pages of
:data:`~stratastore.levels.sealing.STATE_PAGE_BYTES`, each BLAKE3-hashed in its sidecar
(F-SC-3), so what a chunk store writes is an ordinary segment every level, ``strata fsck`` and
``strata inspect`` already know.
"""

from __future__ import annotations

import blake3

from stratastore.errors import StrataError
from stratastore.format import KEY_BYTES
from stratastore.format.keys import state_key

__all__ = ["ChunkKeyError", "chunk_key", "stored_key"]

_NAME_DOMAIN = b"strata-chunk-name-v1\x00"


class ChunkKeyError(StrataError):
    """A chunk key that is not :data:`~stratastore.format.KEY_BYTES` bytes."""


def chunk_key(name: str | bytes, *, namespace: str = "") -> bytes:
    """The 32-byte chunk key of an engine's page name (a hex digest, a string, a hash of
    another length): ``BLAKE3("strata-chunk-name-v1\\0" || u32 len(namespace) || namespace ||
    name)``, with strings as UTF-8. Stable across processes and machines (never Python's
    ``hash()``). ``namespace`` keeps apart the pages of engines that could name pages alike
    (two models' adapters on one level)."""
    raw = name.encode("utf-8", "surrogatepass") if isinstance(name, str) else bytes(name)
    ns = namespace.encode("utf-8", "surrogatepass")
    h = blake3.blake3(_NAME_DOMAIN)
    h.update(len(ns).to_bytes(4, "little") + ns)
    h.update(raw)
    return h.digest()


def stored_key(key: bytes) -> bytes:
    """The segment key the page of chunk key ``key`` is stored under (spec F-KEY-5).
    :class:`ChunkKeyError` for a key that is not 32 bytes, naming :func:`chunk_key`."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        got = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ChunkKeyError(
            f"a chunk key is {KEY_BYTES} bytes, got {got}; derive one from the engine's page "
            "name with stratastore.chunks.chunk_key(name)"
        )
    return state_key(key)
