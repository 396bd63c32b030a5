"""A page held open for one validated read into the engine's memory (spec F-SC-3: every page
hashed in the memory it is delivered from, before the caller is told it is there), and what
counts as damage.

The read goes straight into the caller's buffer (one positional read of the stored bytes, with
the data file's header, past the page cache when the bytes are not in it) and is hashed there,
page by page, against the digests of the sidecar the reader opened; a
compressed page is decoded and validated through staging above the seam
(:func:`~stratastore.levels.reader.copy_validated`). The bytes hashed are the bytes
delivered: a file changed between two reads cannot reach the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from stratastore.format import (
    ChecksumMismatch,
    Codec,
    FormatError,
    IncompatibleFingerprint,
    IndexRecord,
)
from stratastore.io.errors import ShortRead
from stratastore.levels.backend import OpenSegment
from stratastore.levels.errors import DataMissing, StoreError
from stratastore.levels.reader import (
    copy_validated,
    read_pages_checked,
)
from stratastore.levels.sealing import Buffer, byte_view

__all__ = [
    "DAMAGE",
    "ConditionalDelete",
    "DataCheck",
    "OpenChunk",
    "buffer_view",
    "fill_validated",
]

#: what a page's own stored copy failing validation raises (damage: the copy is removed), a
#: sidecar whose data file is gone included (DataMissing); anything else a read raises (an I/O
#: error such as EMFILE, a closed level, a level that cannot be reached) is a miss, never a
#: delete
DAMAGE = (FormatError, ChecksumMismatch, IncompatibleFingerprint, ShortRead, DataMissing)


def buffer_view(buf: Buffer, *, writable: bool) -> memoryview:
    """``buf`` (a numpy array, bytes, bytearray, memoryview: anything with the buffer protocol)
    as a flat byte view; :class:`~stratastore.levels.errors.StoreError` naming the fix for
    something else, a non-contiguous buffer, or (``writable``) one that cannot be written."""
    try:
        view = byte_view(buf)
    except TypeError:
        raise StoreError(
            f"a page buffer must be bytes-like (a numpy array, bytes, bytearray, memoryview), "
            f"not {type(buf).__name__}"
        ) from None
    if writable and view.readonly:
        raise StoreError(
            "the buffer a page is read into must be writable (a numpy array, bytearray or "
            "writable memoryview), not read-only memory"
        )
    return view


@runtime_checkable
class ConditionalDelete(Protocol):
    """A level that can delete a key only while a condition holds, asked under its commit lock
    (the directory level, spec F-DUR-7): a reader that found a copy damaged removes that copy,
    never one written again since. On a level without it the check and the delete are two
    steps; a copy stored again between them is removed, and is then a miss (never wrong
    bytes), written again by the next put."""

    def delete_if(self, key: bytes, still: Callable[[], bool]) -> bool: ...


@runtime_checkable
class DataCheck(Protocol):
    """A level that can tell, without reading a byte, that a page it lists has lost its data
    (the directory level: its sidecar there, its data file gone, fsck's ``DATA_MISSING``): a put
    asks it before it calls a page present, so such a page is written again instead of being
    stuck (listed, never read, never written). The damage's typed error, or None."""

    def missing_data(self, key: bytes) -> DataMissing | None: ...


@dataclass
class OpenChunk:
    """A page held open for one validated read (:meth:`ChunkStore.open_chunk
    <stratastore.chunks.ChunkStore.open_chunk>`): its chunk key, the level it was found on
    (index, first = 0), the reader, and the level's index record of it before it was opened
    (None: not listed then), which tells the copy read from one stored again since."""

    key: bytes
    level: int
    reader: OpenSegment
    identity: IndexRecord | None = None

    @property
    def payload_bytes(self) -> int:
        """The page's size: what a buffer for it must hold."""
        return self.reader.sidecar.payload_bytes

    def close(self) -> None:
        """Release the reader (a page opened and not read; closing twice is harmless)."""
        self.reader.close()


def fill_validated(chunk: OpenChunk, dst: memoryview) -> None:
    """Fill ``dst`` (exactly the page's size) with the page, read straight into it and then
    hashed there against the sidecar's digests (F-SC-3); closes the reader. Raises one of
    :data:`DAMAGE` for a copy that fails, or what the level raises for a read that could not be
    made."""
    with chunk.reader as seg:
        if len(dst) != chunk.payload_bytes:
            raise FormatError(
                f"page {seg.sidecar.key.hex()[:16]}: {chunk.payload_bytes} bytes, the buffer "
                f"{len(dst)}"
            )
        if seg.sidecar.codec is Codec.RAW:
            read_pages_checked(seg, dst)  # one read, then each page hashed in ``dst``
        else:  # written RAW by a chunk store; a compressed copy decodes through staging
            copy_validated(seg, dst, True)
