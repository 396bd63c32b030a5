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

__all__ = ["ChunkKeyError", "chunk_key", "name_bytes", "stored_key"]

_NAME_DOMAIN = b"strata-chunk-name-v1\x00"


class ChunkKeyError(StrataError):
    """A chunk key that is not :data:`~stratastore.format.KEY_BYTES` bytes, or a page name
    (or namespace) :func:`chunk_key` does not take."""


#: the ``memoryview`` formats of a buffer of single bytes (``bytes``, ``bytearray`` and
#: ``array('b'/'B')`` views): a view of anything else is not a name's bytes
_BYTE_FORMATS = frozenset({"B", "b", "c"})


def name_bytes(name: object) -> bytes:
    """The bytes a page name stands for: a ``str`` as UTF-8 (lone surrogates kept), and a
    bytes-like name (``bytes``, ``bytearray``, a C-contiguous ``memoryview`` of single bytes)
    as its bytes. Anything else is a :class:`ChunkKeyError` naming its type: ``bytes(5)``
    would be five zero bytes and ``bytes([1, 2])`` a list's values, so an ``int``, a list,
    ``None`` or a ``bool`` would silently share another name's key; a numpy array is refused
    too (its bytes depend on its dtype and byte order: pass ``array.tobytes()`` when those
    bytes are the name)."""
    if isinstance(name, str):
        return name.encode("utf-8", "surrogatepass")
    if isinstance(name, bytes | bytearray):
        return bytes(name)
    if (
        isinstance(name, memoryview)
        and name.format in _BYTE_FORMATS
        and name.c_contiguous
        and not name.suboffsets
    ):
        return name.tobytes()
    what = type(name).__name__
    if isinstance(name, memoryview):
        what = f"memoryview of format {name.format!r}, {'' if name.c_contiguous else 'not '}"
        what += "C-contiguous"
    raise ChunkKeyError(
        f"a page name is a str or bytes-like (bytes, bytearray, a C-contiguous memoryview of "
        f"bytes), not a {what}; give the engine's name as one (str(n), or array.tobytes() for "
        "an array's bytes)"
    )


def chunk_key(name: str | bytes | bytearray | memoryview, *, namespace: str = "") -> bytes:
    """The 32-byte chunk key of an engine's page name (a hex digest, a string, a hash of
    another length): ``BLAKE3("strata-chunk-name-v1\\0" || u32 len(namespace) || namespace ||
    name)``, with strings as UTF-8. Stable across processes and machines (never Python's
    ``hash()``). ``namespace`` keeps apart the pages of engines that could name pages alike
    (two models' adapters on one level). A name of another type (an ``int``, a list, ``None``,
    a numpy array: :func:`name_bytes`) or a ``namespace`` that is not a ``str`` is a
    :class:`ChunkKeyError`, never another name's key."""
    raw = name_bytes(name)
    if not isinstance(namespace, str):
        raise ChunkKeyError(
            f"a chunk key's namespace is a str, not a {type(namespace).__name__}; name it "
            "(namespace='tp0')"
        )
    ns = namespace.encode("utf-8", "surrogatepass")
    h = blake3.blake3(_NAME_DOMAIN)
    h.update(len(ns).to_bytes(4, "little") + ns)
    h.update(raw)
    return h.digest()


def stored_key(key: bytes) -> bytes:
    """The segment key the page of chunk key ``key`` is stored under (spec F-KEY-5).
    :class:`ChunkKeyError` for a key that is not 32 bytes, naming :func:`chunk_key`."""
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        got = f"{len(key)} bytes" if isinstance(key, bytes) else f"a {type(key).__name__}"
        raise ChunkKeyError(
            f"a chunk key is {KEY_BYTES} bytes (a bytes object), got {got}; derive one from "
            "the engine's page name with stratastore.chunks.chunk_key(name)"
        )
    return state_key(key)
