"""What a segment takes in a directory level before it is written: the bytes its two files add
to the level's ``used()`` (spec F-IDX-1: data file plus sidecar, as the index records them).

A caller that must make room before a put (a budget that counts puts in flight) asks here
instead of reading the format's layout constants itself; the store's own accounting, after
the put, comes from the files (:class:`~stratastore.format.IndexRecord`).
"""

from __future__ import annotations

from stratastore.format import DATA_OFFSET
from stratastore.format.sidecar import SIDECAR_HEAD, TRAILER_BYTES

__all__ = ["raw_segment_bytes"]

_DIGEST_BYTES = 32  #: one BLAKE3-256 digest a page in the sidecar (F-SC-3)


def raw_segment_bytes(payload_bytes: int, page_bytes: int) -> int:
    """The bytes a RAW segment of ``payload_bytes`` in pages of ``page_bytes``, with no media
    references, adds to a directory level: its data file (F-SEG-1: the header block, then the
    pages as they are) and its sidecar (F-SC-1: the v1.0 head, one digest a page, the
    trailer). Equal to the ``total_bytes`` of the index record its put makes (a put of no
    bytes is refused: for 0 this is the two files' fixed part)."""
    pages = -(-payload_bytes // page_bytes)
    sidecar = SIDECAR_HEAD.size + _DIGEST_BYTES * pages + TRAILER_BYTES
    return DATA_OFFSET + payload_bytes + sidecar
