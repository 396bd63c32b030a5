"""A capture in the engine's own layout: the stored pages (spec F-SEG-4) gathered out of a
:class:`~.destinations.LayerKV` or :class:`~.destinations.PagedKV` (the engine's contiguous
cache, or its paged pool and a request's block table), the inverse of a restore into one.

:class:`EngineCapture` is what :meth:`Store.park` makes of such a ``kv``: each segment of the
conversation, as its cuts lay it out, is a :class:`SegmentPages`, a
:class:`~stratastore.levels.sealing.PageSource` that a disk write streams (gathered, hashed and
written chunk by chunk, :mod:`stratastore.levels.streamed`), and :meth:`EngineCapture.pack` is
the whole capture in the store's own memory (a park the RAM level keeps, or one that waits for
the spill writer)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError
from stratastore.format import ModelFingerprint
from stratastore.levels.sealing import PageSource
from stratastore.restore.destinations import DestinationRefused, _PerToken

__all__ = ["EngineCapture", "SegmentPages", "as_engine_capture"]


class SegmentPages(PageSource):
    """Tokens ``[start, end)`` of ``src`` as one segment's payload: pages of ``page_tokens``
    counted from ``start`` (the last may be short), each per layer K then V."""

    def __init__(self, src: _PerToken, start: int, end: int) -> None:
        self.src, self.start, self.end = src, start, end
        self.nbytes = (end - start) * src.tb

    def gather_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        pt, pb = self.src.fp.page_tokens, self.src.fp.page_bytes
        if offset % pb or offset + out.size > self.nbytes:
            raise ValueError(f"bytes [{offset}, {offset + out.size}) are not whole pages here")
        t, pos = self.start + offset // pb * pt, 0
        while pos < out.size:
            p = min(pt, self.end - t)
            for view in self.src.page_views(t, p):  # the stored order (F-SEG-4)
                n = view.nbytes
                out[pos : pos + n] = np.frombuffer(view, np.uint8)
                pos += n
            t += p


class EngineCapture:
    """Tokens ``[0, n_tokens)`` held in the engine's layout ``src`` (see the module)."""

    def __init__(self, src: _PerToken, n_tokens: int) -> None:
        self.src, self.n_tokens = src, n_tokens
        self.nbytes = n_tokens * src.tb

    def segment(self, start: int, end: int) -> SegmentPages:
        """The payload of the segment of tokens ``[start, end)``."""
        return SegmentPages(self.src, start, end)

    def pack(self, bounds: list[tuple[int, int]]) -> npt.NDArray[np.uint8]:
        """The whole capture in new memory, each segment of ``bounds`` (the conversation's
        ``(start, end)`` segments) laid out from its own start."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        tb = self.src.tb
        for start, end in bounds:
            self.segment(start, end).gather_into(0, out[start * tb : end * tb])
        return out


def as_engine_capture(
    fp: ModelFingerprint,
    kv: object,
    n_tokens: int,
    call: str = "park",
    error: type[StrataError] = DestinationRefused,
) -> EngineCapture | None:
    """``kv`` as a capture in the engine's layout when it is a
    :class:`~.destinations.LayerKV` or :class:`~.destinations.PagedKV` (``None`` for anything
    else). One made for another model, or holding fewer than ``n_tokens`` tokens, is refused
    with ``error``."""
    if not isinstance(kv, _PerToken):
        return None
    if kv.fp != fp:
        raise error(
            f"{call}: the K/V was described for {kv.fp.describe()}; this store holds "
            f"{fp.describe()}: make the LayerKV/PagedKV with the store's fingerprint"
        )
    if kv.capacity() < n_tokens:
        raise error(
            f"{call}: the {type(kv).__name__} holds {kv.capacity():,} tokens; the "
            f"conversation has {n_tokens:,}: pass the block table (or arrays) of all of them"
        )
    return EngineCapture(kv, n_tokens)
