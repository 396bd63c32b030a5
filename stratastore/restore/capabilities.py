"""What a restore writes into, and what it can do: the destination protocol and its capabilities.

A **destination** is anything with ``capacity()`` and ``write_pages(...)``
(:class:`Destination`): the restore copies validated pages into it, through memory the store
owns (staging). The fast paths ask what else a destination can do, by the methods and
attributes it has (structural typing), never by its class: a destination written outside this
package gets them by having the members, with no base class to subclass.

========================  ==========================================  =========================
capability                 what the destination has                    who asks
========================  ==========================================  =========================
zero                       ``zero(token_start, n_tokens)``             the apply pass (each chunk
                           (:class:`Zeroable`)                         applied as it validates)
page views                 ``page_views(token_start, n_tokens)``       the streamed park (reads
                           (:class:`PageViews`)                        a source page by page)
page gather                ``gather_pages(token_start, n_tokens,       the streamed park (copies
                           out, page_tokens)`` (:class:`GathersPages`) a run of pages at once)
direct scatter reads       page views and ``zero``                     the read pass (each page
                           (:class:`ScatterReads`)                     read into its views)
stored region              ``region(token_start, n_tokens)``           the read pass (a run of
                           besides (:class:`StoredRegion`)             pages in one read)
on a device                ``on_device = True`` (:class:`OnDevice`)    the read pass (validated
                                                                       on the device)
========================  ==========================================  =========================

The functions :func:`scatter_reads`, :func:`lives_on_device`, :func:`page_view_source` and
:func:`page_gather` are how the read pass (:mod:`.two_pass`), the apply pass
(:mod:`.delivery`) and the park (:mod:`.gather`) ask; each asks once a restore or a park,
never a page. A page is spec F-SEG-4's: ``p`` tokens (``page_tokens``, the segment's last
page shorter), per layer K then V, each ``[p, n_kv_heads, head_dim]``: ``p * token_bytes``
bytes in that order.
"""

from __future__ import annotations

from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import numpy.typing as npt

from stratastore.format import ModelFingerprint
from stratastore.restore.in_place import DestinationRefused

__all__ = [
    "Destination",
    "GathersPages",
    "OnDevice",
    "PageViews",
    "ScatterReads",
    "StoredRegion",
    "Zeroable",
    "check_device_pages",
    "check_page_views",
    "check_region",
    "lives_on_device",
    "page_gather",
    "page_view_source",
    "scatter_reads",
]


@runtime_checkable
class Destination(Protocol):
    """What a restore writes into: every destination has these two.

    ``capacity()``: the tokens it holds from position 0 (a restore wanting more is refused
    before anything is read). ``write_pages(token_start, n_tokens, data, page_tokens)``: write
    ``n_tokens`` tokens from ``token_start``, given as consecutive stored pages of
    ``page_tokens`` (the last may be short) of one segment, ``data`` in memory the store owns
    (validated staging, decompressed pages, or a capture this process holds: valid only
    during the call; copy out of it, never keep it). Called from the thread that applies (the
    caller's, or the batch agenda's), never twice at once for one destination. A destination
    with none of the capabilities below is still restored into, through this method alone."""

    def capacity(self) -> int:
        """Tokens it can hold from position 0."""
        ...

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        """Write ``n_tokens`` tokens starting at ``token_start``, given as consecutive stored
        pages of ``page_tokens`` (the last may be short)."""
        ...


@runtime_checkable
class Zeroable(Destination, Protocol):
    """The zero capability: ``zero(token_start, n_tokens)`` sets the bytes of those tokens to
    zero. With it the apply pass writes each chunk as soon as it validates, and zeroes what
    turns out to lie past the prefix the restore reports (a ladder stop, an error) before the
    call returns; without it a chunk is written only once no later damage can take it back,
    and held (staged) until then."""

    def zero(self, token_start: int, n_tokens: int) -> None:
        """Zero tokens ``[token_start, token_start + n_tokens)``."""
        ...


@runtime_checkable
class PageViews(Protocol):
    """The page-view capability: the destination's own memory, a stored page at a time.

    ``page_views(token_start, n_tokens)`` -> a list of :class:`memoryview` over the memory
    that holds tokens ``[token_start, token_start + n_tokens)`` (one stored page: at most
    ``page_tokens``, starting on a page of its segment), in the page's byte order (spec
    F-SEG-4: per layer, K then V, each ``[n_tokens, n_kv_heads, head_dim]``): laid end to end
    they are the page, exactly ``n_tokens * token_bytes`` bytes, each C-contiguous (a numpy
    array's ``.data``, any item format). No copies: the views are where the K/V lives.

    The streamed park reads a source through it (:mod:`.gather`: a park of such a ``kv`` to
    disk gathers, hashes and writes a bounded chunk of pages at a time, from these views,
    within the call); with ``zero`` besides, a restore reads into it directly
    (:class:`ScatterReads`). Lifetimes: the views are used during the call that asked for them
    (a park, a restore) and never kept after it returns; the memory must not move or be freed
    meanwhile. Thread-safety: ``page_views`` is called from one thread at a time (the park's,
    or a restore's read pass), not always the caller's; the views of different pages may be
    read or written from several threads at once. Views that do not add up to the page are
    refused (:class:`~stratastore.restore.DestinationRefused`, naming the destination and
    the fix), never read past or half filled."""

    def capacity(self) -> int:
        """Tokens it holds from position 0."""
        ...

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        """Where the bytes of the stored page of tokens ``[token_start, token_start +
        n_tokens)`` are, in their stored order."""
        ...


@runtime_checkable
class GathersPages(Protocol):
    """The page-gather capability: a park's source that copies a run of stored pages at once.

    ``gather_pages(token_start, n_tokens, out, page_tokens)``, the inverse of ``write_pages``:
    copy tokens ``[token_start, token_start + n_tokens)`` into ``out`` (a writable, C-contiguous
    ``uint8`` array of exactly ``n_tokens * token_bytes`` bytes) as consecutive stored pages of
    ``page_tokens`` (spec F-SEG-4; the last may be short, ``token_start`` on a page of its
    segment). For memory that does not hold a page's K or V in one piece (an engine's own order
    inside its blocks), where views per page would be copies anyway: the streamed park then
    gathers each chunk (16 MiB) with one call instead of a view per page, layer and kind. A
    source with it still has ``capacity`` and ``page_views`` (:class:`PageViews`: the first
    page is checked through them before a park gathers anything). Called from the park's
    gathering threads, several at once for different runs; ``out`` is the store's staging."""

    def capacity(self) -> int:
        """Tokens it holds from position 0."""
        ...

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        """As :class:`PageViews`."""
        ...

    def gather_pages(
        self, token_start: int, n_tokens: int, out: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        """Copy tokens ``[token_start, token_start + n_tokens)`` into ``out`` as stored pages."""
        ...


@runtime_checkable
class ScatterReads(Zeroable, PageViews, Protocol):
    """The direct-read capability: page views (written now) and ``zero``.

    The restore's read pass ``preadv``s each stored page of a segment straight into its views
    and hashes it there (spec F-SC-3): one copy, no staging (:func:`~.reads.
    read_scattered_hashed`). The views must then also be writable host memory. A page that
    fails validation, or that the restore does not deliver (past the prefix it reports, a read
    error), is zeroed through ``zero`` before the restore returns: the caller never keeps a
    byte that failed. A destination may set ``read_direct = False`` (an attribute, default
    true) to be read through staging and written with ``write_pages`` instead; its views
    still serve a park. Views that do not add up to the page, or are read-only, stop the
    restore with :class:`~stratastore.restore.DestinationRefused` (what was placed zeroed):
    never reported as damage of the stored pages."""


@runtime_checkable
class StoredRegion(ScatterReads, Protocol):
    """Direct reads into memory that holds the stored layout itself (:class:`~.FlatKV`).

    ``region(token_start, n_tokens)`` -> a writable, C-contiguous ``uint8`` array of exactly
    ``n_tokens * token_bytes`` bytes: tokens ``[token_start, token_start + n_tokens)`` as
    consecutive stored pages of one segment, from a page of it. The read pass then reads a
    run of pages with one ``pread`` a group instead of one ``preadv`` a page. The lifetimes and
    threads of :class:`PageViews`; a region of another size is refused the same way."""

    def region(self, token_start: int, n_tokens: int) -> npt.NDArray[np.uint8]:
        """The bytes of tokens ``[token_start, token_start + n_tokens)``, contiguous."""
        ...


@runtime_checkable
class OnDevice(Protocol):
    """The device capability: ``on_device = True``, memory on a CUDA device.

    The read pass reads each chunk into pinned host staging, copies it to device staging,
    hashes and checks its pages there (:mod:`.device`), and ``write_pages`` then receives that
    device staging (a numba device array of ``uint8``, valid only during the call: the copies
    out of it must have ended when it returns, since the staging is reused) or, for a RAM hit
    or a park in flight, host bytes (a numpy array): it must take both. ``zero`` is the
    :class:`Zeroable` capability here too. The model's pages must fit the device's page-hash
    kernel (64 MiB), checked before anything is read."""

    on_device: bool

    def capacity(self) -> int:
        """Tokens it can hold from position 0."""
        ...

    def write_pages(self, token_start: int, n_tokens: int, data: Any, page_tokens: int) -> None:
        """Write ``n_tokens`` tokens from ``token_start``, given as consecutive stored pages in
        device memory (validated staging) or host memory (a capture)."""
        ...


def scatter_reads(dest: object) -> ScatterReads | None:
    """``dest`` when a restore's read pass may read straight into it (:class:`ScatterReads`:
    ``page_views`` and ``zero``, not ``read_direct = False``, not on a device), else None."""
    if getattr(dest, "read_direct", True) is False or lives_on_device(dest):
        return None
    views, zero = getattr(dest, "page_views", None), getattr(dest, "zero", None)
    if callable(views) and callable(zero):
        return cast("ScatterReads", dest)
    return None


def lives_on_device(dest: object) -> bool:
    """Whether ``dest`` takes the device path (:class:`OnDevice`: ``on_device`` is true)."""
    return getattr(dest, "on_device", False) is True


def page_view_source(kv: object) -> PageViews | None:
    """``kv`` when a park may read it page by page (:class:`PageViews`), else None."""
    if callable(getattr(kv, "page_views", None)) and callable(getattr(kv, "capacity", None)):
        return cast("PageViews", kv)
    return None


def page_gather(src: object) -> GathersPages | None:
    """``src`` when a park may copy runs of its pages at once (:class:`GathersPages`), else
    None."""
    if callable(getattr(src, "gather_pages", None)) and page_view_source(src) is not None:
        return cast("GathersPages", src)
    return None


def check_page_views(
    src: PageViews,
    token_start: int,
    n_tokens: int,
    fp: ModelFingerprint,
    *,
    writable: bool = True,
    views: list[memoryview] | None = None,
) -> None:
    """Refuse (:class:`DestinationRefused`) the views ``src`` gives for the page of tokens
    ``[token_start, token_start + n_tokens)`` (``views``, when the caller holds them) unless
    they are memoryviews that add up to the page (and, with ``writable``, are writable)."""
    got = src.page_views(token_start, n_tokens) if views is None else views
    name = f"{type(src).__name__}.page_views({token_start}, {n_tokens})"
    want = n_tokens * fp.token_bytes
    if not isinstance(got, list) or not all(isinstance(v, memoryview) for v in got):
        kinds = sorted({type(v).__name__ for v in got}) if isinstance(got, list) else []
        raise DestinationRefused(
            f"{name} gave {type(got).__name__} {kinds or ''}; it must give a list of "
            "memoryviews over the destination's memory (a numpy array's .data): fix "
            "page_views, or set read_direct = False to have pages copied in with write_pages"
        )
    total = sum(v.nbytes for v in got)
    if total != want:
        raise DestinationRefused(
            f"{name} gave {len(got)} views of {total:,} bytes; a page of {n_tokens} tokens of "
            f"{fp.describe()} is {want:,} bytes (spec F-SEG-4: per layer K then V, each "
            f"[{n_tokens}, {fp.n_kv_heads}, {fp.head_dim}]): give views of exactly the page's "
            "bytes, or set read_direct = False to have pages copied in with write_pages"
        )
    if writable and any(v.readonly for v in got):
        raise DestinationRefused(
            f"{name} gave a read-only view; a direct read lands in the views: give writable "
            "memory, or set read_direct = False to have pages copied in with write_pages"
        )


def check_region(
    dest: object, region: object, token_start: int, n_tokens: int, fp: ModelFingerprint
) -> npt.NDArray[np.uint8]:
    """``region`` (what ``dest.region(token_start, n_tokens)`` gave) when it is a writable,
    C-contiguous uint8 array of the tokens' bytes; else :class:`DestinationRefused`."""
    want = n_tokens * fp.token_bytes
    if (
        isinstance(region, np.ndarray)
        and region.dtype == np.uint8
        and region.size == want
        and region.flags.c_contiguous
        and region.flags.writeable
    ):
        return region
    got = (
        f"{region.shape} of {region.dtype}"
        if isinstance(region, np.ndarray)
        else type(region).__name__
    )
    raise DestinationRefused(
        f"{type(dest).__name__}.region({token_start}, {n_tokens}) gave {got}; it must give "
        f"a writable, C-contiguous uint8 array of the {want:,} bytes of those tokens: fix "
        "region, or remove it to be read page by page through page_views"
    )


def check_device_pages(dest: object, fp: ModelFingerprint) -> None:
    """Refuse a destination on a device (:class:`OnDevice`) when ``fp``'s pages are larger
    than the device's page-hash kernel takes (``numba_kernels.cuda.MAX_PAGE_BYTES``)."""
    from numba_kernels.cuda import MAX_PAGE_BYTES

    if fp.page_bytes > MAX_PAGE_BYTES:
        raise DestinationRefused(
            f"{type(dest).__name__} lives on a device; {fp.describe()} has pages of "
            f"{fp.page_bytes:,} bytes and the device's page-hash kernel takes at most "
            f"{MAX_PAGE_BYTES:,}: restore into host memory, or use a model fingerprint with "
            "fewer page_tokens"
        )
