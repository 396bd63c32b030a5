"""A capture in the engine's own layout: the stored pages (spec F-SEG-4) gathered out of
anything with page views (:class:`~.capabilities.PageViews`: a
:class:`~.destinations.LayerKV` or :class:`~.destinations.PagedKV` over the engine's
contiguous cache or its paged pool and a request's block table, or a destination written
elsewhere with ``page_views``), the inverse of a restore into one.

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
from stratastore.restore.capabilities import (
    PageViews,
    check_page_views,
    page_gather,
    page_view_source,
)
from stratastore.restore.in_place import DestinationRefused

__all__ = ["EngineCapture", "SegmentPages", "as_engine_capture"]


class SegmentPages(PageSource):
    """Tokens ``[start, end)`` of ``src`` (``fp``'s K/V) as one segment's payload: pages of
    ``page_tokens`` counted from ``start`` (the last may be short), each per layer K then V,
    read through ``src.page_views``."""

    def __init__(self, src: PageViews, start: int, end: int, fp: ModelFingerprint) -> None:
        self.src, self.start, self.end, self.fp = src, start, end, fp
        self.nbytes = (end - start) * fp.token_bytes
        self.runs = page_gather(src)  #: asked once: the source copies runs of pages itself

    def gather_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        pt, pb, tb = self.fp.page_tokens, self.fp.page_bytes, self.fp.token_bytes
        if offset % pb or offset + out.size > self.nbytes or out.size % tb:
            raise ValueError(f"bytes [{offset}, {offset + out.size}) are not whole pages here")
        t, pos = self.start + offset // pb * pt, 0
        if self.runs is not None:
            self.runs.gather_pages(t, out.size // tb, out, pt)
            return
        while pos < out.size:
            p = min(pt, self.end - t)
            views, end = self.src.page_views(t, p), pos + p * tb
            try:
                for view in views:  # the stored order (F-SEG-4)
                    n = view.nbytes
                    out[pos : pos + n] = np.frombuffer(view, np.uint8)
                    pos += n
            except (ValueError, TypeError, BufferError):  # past the page, or not a buffer
                pos = -1
            if pos != end:  # views that are not the page: refused by name, never half read
                check_page_views(self.src, t, p, self.fp, writable=False, views=views)
                raise DestinationRefused(
                    f"{type(self.src).__name__}.page_views({t}, {p}) gave views that could not "
                    "be read as the page: give memoryviews of exactly its bytes"
                )
            t += p


class EngineCapture:
    """Tokens ``[0, n_tokens)`` held in the engine's layout ``src`` (see the module), gathered
    a run of pages at a time where ``src`` can (:class:`~.capabilities.GathersPages`), else a
    page view at a time."""

    def __init__(self, src: PageViews, n_tokens: int, fp: ModelFingerprint) -> None:
        self.src, self.n_tokens, self.fp = src, n_tokens, fp
        self.nbytes = n_tokens * fp.token_bytes

    def segment(self, start: int, end: int) -> SegmentPages:
        """The payload of the segment of tokens ``[start, end)``."""
        return SegmentPages(self.src, start, end, self.fp)

    def pack(self, bounds: list[tuple[int, int]]) -> npt.NDArray[np.uint8]:
        """The whole capture in new memory, each segment of ``bounds`` (the conversation's
        ``(start, end)`` segments) laid out from its own start."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        tb = self.fp.token_bytes
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
    """``kv`` as a capture in the engine's layout when it has page views
    (:class:`~.capabilities.PageViews`, whatever its class: a :class:`~.destinations.LayerKV`,
    a :class:`~.destinations.PagedKV`, a destination written elsewhere), ``None`` for anything
    else. One made for another model (its ``fp``), holding fewer than ``n_tokens`` tokens, or
    whose first page's views are not that page, is refused with ``error`` before anything is
    gathered."""
    src = page_view_source(kv)
    if src is None:
        return None
    made_for = getattr(kv, "fp", None)
    if isinstance(made_for, ModelFingerprint) and made_for != fp:
        raise error(
            f"{call}: the K/V was described for {made_for.describe()}; this store holds "
            f"{fp.describe()}: make the {type(kv).__name__} with the store's fingerprint"
        )
    if src.capacity() < n_tokens:
        raise error(
            f"{call}: the {type(kv).__name__} holds {src.capacity():,} tokens; the "
            f"conversation has {n_tokens:,}: pass the block table (or arrays) of all of them"
        )
    if n_tokens:
        try:
            check_page_views(src, 0, min(n_tokens, fp.page_tokens), fp, writable=False)
        except DestinationRefused as e:
            raise error(f"{call}: {e}") from None
    return EngineCapture(src, n_tokens, fp)
