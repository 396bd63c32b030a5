"""A restore destination written outside the package, by its members alone: no stratastore base
class, no private import. The store asks what it can do (``stratastore.Destination`` and its
capabilities), never what it is:

* with ``page_views`` and ``zero`` (``ScatterReads``) the read pass reads each stored page
  straight into its memory and hashes it there: ``page_views`` is asked once a page,
  ``write_pages`` never, and no staging buffer is taken;
* with a ``region`` besides (``StoredRegion``: memory in the stored layout itself) a run of
  pages is read at a time, into it;
* the validated restore and its ladder over a damaged page deliver the bytes a built-in
  destination (``LayerKV``) gets, page for page, zeros past the prefix included;
* a park of it streams its pages from those views to disk within the call, never copying the
  capture whole; with ``gather_pages`` besides (``GathersPages``) a run of pages is gathered
  with one call, the views asked only to check the first page;
* one with ``on_device = True`` (``OnDevice``) takes the device path: its pages are validated on
  the device and handed to it in device memory (numba's CUDA simulator here);
* one with only ``capacity`` and ``write_pages`` is restored through staging, the same bytes;
* views that are not the page are refused by name (``DestinationRefused``), never reported as
  damage of the stored pages.

The layout below is one no built-in destination has: token-major rows, ``[tokens, layers, K/V,
row bytes]``, so a stored page (per layer K then V, spec F-SEG-4) lands in ``2 * layers * p``
separate rows of it."""

from __future__ import annotations

import shutil
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from numba import cuda

import stratastore.levels.local.segment_store as segment_store
from stratastore import (
    Checkpoint,
    Conversation,
    Destination,
    DestinationRefused,
    DeviceFlatKV,
    FlatKV,
    GathersPages,
    InvalidConversation,
    LayerKV,
    ModelFingerprint,
    OnDevice,
    PagedKV,
    PageViews,
    ScatterReads,
    Store,
    StoredRegion,
)
from stratastore.levels.staging import STAGING

FP = ModelFingerprint.create(
    "outside/token-major", n_layers=3, n_kv_heads=2, head_dim=4, page_tokens=4
)
PT, TB = FP.page_tokens, FP.token_bytes
ROW = FP.n_kv_heads * FP.head_dim * FP.dtype.itemsize  # bytes of one token's K (or V)
SENTINEL = 0xEE


def write_token_major(
    rows: npt.NDArray[np.uint8], token_start: int, n_tokens: int, data: Any, page_tokens: int
) -> None:
    """Stored pages (per layer K then V, each ``[p, row]``) into ``rows[t, layer, kind]``."""
    data = np.asarray(data).reshape(-1)
    t, pos = token_start, 0
    while t < token_start + n_tokens:
        p = min(page_tokens, token_start + n_tokens - t)
        page = data[pos : pos + p * TB].reshape(FP.n_layers, 2, p, ROW)
        rows[t : t + p] = page.transpose(2, 0, 1, 3)
        t, pos = t + p, pos + p * TB


class TokenMajorKV:
    """A host cache ``[capacity, layers, 2, row]`` of bytes, with page views and ``zero``."""

    def __init__(self, capacity: int, fill: int = SENTINEL) -> None:
        self.rows = np.full((capacity, FP.n_layers, 2, ROW), fill, np.uint8)
        self.calls: Counter[str] = Counter()

    def capacity(self) -> int:
        return int(self.rows.shape[0])

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        self.calls["write_pages"] += 1
        write_token_major(self.rows, token_start, n_tokens, data, page_tokens)

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        self.calls["page_views"] += 1
        end = token_start + n_tokens
        return [
            self.rows[t, layer, kind].data
            for layer in range(FP.n_layers)
            for kind in (0, 1)
            for t in range(token_start, end)
        ]

    def zero(self, token_start: int, n_tokens: int) -> None:
        self.calls["zero"] += 1
        self.rows[token_start : token_start + n_tokens] = 0


class StoredBytes:
    """Host memory in the stored layout itself (a segment's pages at ``start * token_bytes``),
    with a ``region`` besides its page views: read a run of pages at a time."""

    def __init__(self, capacity: int, region_tokens_short: int = 0) -> None:
        self.buf = np.full(capacity * TB, SENTINEL, np.uint8)
        self.short = region_tokens_short  #: a bug to show: regions this many tokens short
        self.calls: Counter[str] = Counter()

    def capacity(self) -> int:
        return self.buf.size // TB

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        self.calls["write_pages"] += 1
        self.buf[token_start * TB : (token_start + n_tokens) * TB] = data[: n_tokens * TB]

    def region(self, token_start: int, n_tokens: int) -> npt.NDArray[np.uint8]:
        self.calls["region"] += 1
        return self.buf[token_start * TB : (token_start + n_tokens - self.short) * TB]

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        self.calls["page_views"] += 1
        return [self.region(token_start, n_tokens).data]

    def zero(self, token_start: int, n_tokens: int) -> None:
        self.buf[token_start * TB : (token_start + n_tokens) * TB] = 0


class PlainKV:
    """Only what every destination has: ``capacity`` and ``write_pages``."""

    def __init__(self, capacity: int) -> None:
        self.rows = np.full((capacity, FP.n_layers, 2, ROW), SENTINEL, np.uint8)
        self.writes = 0

    def capacity(self) -> int:
        return int(self.rows.shape[0])

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        self.writes += 1
        write_token_major(self.rows, token_start, n_tokens, data, page_tokens)


class ShortViews(TokenMajorKV):
    """Page views one row short of the page (a bug in the destination, not in the store)."""

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        return super().page_views(token_start, n_tokens)[:-1]


class DeviceTokenMajorKV:
    """The token-major layout in device memory (a numba device array), ``on_device = True``."""

    on_device = True

    def __init__(self, capacity: int) -> None:
        self.rows = cuda.to_device(np.full((capacity, FP.n_layers, 2, ROW), SENTINEL, np.uint8))
        self.given: Counter[str] = Counter()  #: what write_pages was handed: device or host

    def capacity(self) -> int:
        return int(self.rows.shape[0])

    def write_pages(self, token_start: int, n_tokens: int, data: Any, page_tokens: int) -> None:
        on_device = hasattr(data, "copy_to_host")
        self.given["device" if on_device else "host"] += 1
        pages = data[: n_tokens * TB].copy_to_host() if on_device else data
        rows = self.rows.copy_to_host()
        write_token_major(rows, token_start, n_tokens, pages, page_tokens)
        self.rows.copy_to_device(rows)

    def zero(self, token_start: int, n_tokens: int) -> None:
        rows = self.rows.copy_to_host()
        rows[token_start : token_start + n_tokens] = 0
        self.rows.copy_to_device(rows)


def layer_kv(capacity: int) -> tuple[LayerKV, list[npt.NDArray[np.uint8]], list[Any]]:
    """The built-in destination over per-layer K and V arrays, filled as ours are."""
    k = [np.full((capacity, ROW), SENTINEL, np.uint8) for _ in range(FP.n_layers)]
    v = [np.full((capacity, ROW), SENTINEL, np.uint8) for _ in range(FP.n_layers)]
    return LayerKV(FP, k, v), k, v


def as_token_major(k: list[Any], v: list[Any]) -> npt.NDArray[np.uint8]:
    """A ``LayerKV``'s arrays in our layout, to compare byte for byte."""
    return np.stack([np.stack([a, b], axis=1) for a, b in zip(k, v, strict=True)], axis=1)


def zeroed_or_untouched(rows: npt.NDArray[np.uint8]) -> bool:
    """Whether every token of ``rows`` is all zeros or all the sentinel: no stored byte."""
    tokens = rows.reshape(rows.shape[0], -1)
    return bool(((tokens == 0).all(axis=1) | (tokens == SENTINEL).all(axis=1)).all())


def conversation(n: int, cuts: list[int]) -> tuple[Conversation, npt.NDArray[np.uint8]]:
    """``n`` tokens cut at ``cuts`` (a checkpoint at each), with random K/V in the stored
    layout."""
    conv = Conversation(
        "outside",
        np.arange(n, dtype=np.uint32),
        [Checkpoint(c) for c in [*cuts[1:], n]],
        cuts=cuts,
    )
    return conv, np.random.default_rng(n).integers(0, 256, n * TB, dtype=np.uint8)


def open_store(path: Path) -> Store:
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(path), "cold_mib": 64}
    return Store.open(FP, cfg)


N, CUTS = 45, [0, 18, 33]  # three segments; the last pages of the first two are short


def parked(tmp_path: Path) -> tuple[Path, npt.NDArray[np.uint8]]:
    """A store directory holding the conversation on disk, and its K/V."""
    conv, kv = conversation(N, CUTS)
    with open_store(tmp_path / "cold") as store:
        store.park(conv, kv.copy())
        store.flush()
    return tmp_path / "cold", kv


def restore(path: Path, dest: Any) -> Any:
    with open_store(path) as store:
        return store.restore(np.arange(N, dtype=np.uint32), dest)


def test_the_protocol_is_structural() -> None:
    dest = TokenMajorKV(8)
    assert isinstance(dest, Destination) and isinstance(dest, ScatterReads)
    assert isinstance(dest, PageViews) and not isinstance(dest, OnDevice)
    assert isinstance(PlainKV(8), Destination) and not isinstance(PlainKV(8), PageViews)
    assert not any(c.__module__.startswith("stratastore") for c in TokenMajorKV.__mro__)


def test_the_built_in_destinations_say_the_same_capabilities() -> None:
    flat = FlatKV(FP, np.zeros(8 * TB, np.uint8))
    pools = [np.zeros((2, 2, PT, FP.n_kv_heads, FP.head_dim), np.uint16) for _ in range(3)]
    paged = PagedKV(FP, pools, [0, 1])
    layer, _, _ = layer_kv(8)
    device = DeviceFlatKV(FP, cuda.to_device(np.zeros(8 * TB, np.uint8)))
    assert isinstance(flat, StoredRegion)
    assert isinstance(layer, ScatterReads) and isinstance(paged, ScatterReads)
    assert not isinstance(layer, StoredRegion)
    assert isinstance(device, OnDevice) and not isinstance(device, PageViews)


def test_the_read_lands_in_its_page_views_with_no_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = parked(tmp_path)
    taken: list[int] = []
    take = STAGING.take

    def counting_take(nbytes: int) -> npt.NDArray[np.uint8]:
        taken.append(nbytes)
        return take(nbytes)

    monkeypatch.setattr(STAGING, "take", counting_take)
    ours = TokenMajorKV(64)
    got = restore(path, ours)
    assert (got.source, got.tokens) == ("disk", N)
    pages = sum(-(-(b - a) // PT) for a, b in zip(CUTS, [*CUTS[1:], N], strict=True))
    assert ours.calls["page_views"] == pages  # one scatter read a stored page
    assert ours.calls["write_pages"] == 0  # nothing was copied in after the read
    assert taken == []  # and no staging buffer held the pages on the way
    builtin, k, v = layer_kv(64)
    assert restore(path, builtin).tokens == N
    assert np.array_equal(ours.rows, as_token_major(k, v))


def test_a_stored_region_is_read_a_run_of_pages_at_a_time(tmp_path: Path) -> None:
    path, kv = parked(tmp_path)
    ours = StoredBytes(64)
    assert isinstance(ours, StoredRegion)
    assert restore(path, ours).tokens == N
    assert ours.calls["region"] == len(CUTS)  # one run a segment (each under a chunk)
    assert ours.calls["page_views"] == ours.calls["write_pages"] == 0
    assert np.array_equal(ours.buf[: N * TB], kv)
    short = StoredBytes(64, region_tokens_short=1)
    with pytest.raises(DestinationRefused, match=r"StoredBytes\.region\(0, 18\) gave"):
        restore(path, short)
    assert (short.buf == SENTINEL).all()  # refused before anything was read into it


def flip(path: Path, segment: int, page: int) -> None:
    """Flip one byte in page ``page`` of the ``segment``-th segment (by token order)."""
    files = sorted(path.rglob("*.seg"), key=lambda f: f.stat().st_size)
    assert len(files) == len(CUTS)
    sizes = [b - a for a, b in zip(CUTS, [*CUTS[1:], N], strict=True)]
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])  # segments of distinct sizes
    target = files[order.index(segment)]
    raw = bytearray(target.read_bytes())
    raw[4096 + page * FP.page_bytes + 5] ^= 0x10  # spec F-SEG-3: the payload from 4096
    target.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "dest_of",
    [lambda: TokenMajorKV(64), lambda: PlainKV(64)],
    ids=["direct", "no-capabilities"],
)
def test_a_damaged_page_restores_the_prefix_a_built_in_destination_gets(
    tmp_path: Path, dest_of: Any
) -> None:
    path, _ = parked(tmp_path)
    flip(path, segment=1, page=2)  # tokens 26..29: the ladder stops at the checkpoint below
    for copy in ("ours", "builtin"):
        shutil.copytree(path, tmp_path / copy)
    ours = dest_of()
    got = restore(tmp_path / "ours", ours)
    builtin, k, v = layer_kv(64)
    want = restore(tmp_path / "builtin", builtin)
    assert got.tokens == want.tokens == 18
    theirs = as_token_major(k, v)
    assert np.array_equal(ours.rows[:18], theirs[:18])
    assert zeroed_or_untouched(ours.rows[18:])  # no byte of a page past the prefix
    if isinstance(ours, TokenMajorKV):  # the same direct read: the same zeros past it too
        assert np.array_equal(ours.rows, theirs)


def test_a_destination_with_no_capabilities_gets_every_page_through_write_pages(
    tmp_path: Path,
) -> None:
    path, _ = parked(tmp_path)
    ours = PlainKV(64)
    assert restore(path, ours).tokens == N
    assert ours.writes >= len(CUTS)
    builtin, k, v = layer_kv(64)
    restore(path, builtin)
    assert np.array_equal(ours.rows, as_token_major(k, v))


def test_a_park_streams_from_its_page_views(tmp_path: Path) -> None:
    conv, kv = conversation(N, CUTS)
    source = TokenMajorKV(64)
    for a, b in zip(CUTS, [*CUTS[1:], N], strict=True):  # the engine's K/V, in its layout
        write_token_major(source.rows, a, b - a, kv[a * TB : b * TB], PT)
    with open_store(tmp_path / "cold") as store:
        report = store.park(conv, source)
        assert (report.where, report.tokens) == ("disk", N)
        assert source.calls["page_views"] >= N // PT and source.calls["write_pages"] == 0
        source.rows[...] = 0  # the engine reuses its memory: the park holds its own bytes
    flat = np.zeros(N * TB, np.uint8)
    assert restore(tmp_path / "cold", flat).tokens == N
    assert np.array_equal(flat, kv)  # the stored layout, segment by segment


class TokenMajorRuns(TokenMajorKV):
    """The same cache, gathering a run of pages itself (``GathersPages``)."""

    def gather_pages(
        self, token_start: int, n_tokens: int, out: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        self.calls["gather_pages"] += 1
        t, pos = token_start, 0
        while t < token_start + n_tokens:
            p = min(page_tokens, token_start + n_tokens - t)
            out[pos : pos + p * TB] = self.rows[t : t + p].transpose(1, 2, 0, 3).reshape(-1)
            t, pos = t + p, pos + p * TB


def test_a_park_gathers_runs_of_pages_from_a_source_that_can(tmp_path: Path) -> None:
    conv, kv = conversation(N, CUTS)
    source = TokenMajorRuns(64)
    assert isinstance(source, GathersPages)
    for a, b in zip(CUTS, [*CUTS[1:], N], strict=True):
        write_token_major(source.rows, a, b - a, kv[a * TB : b * TB], PT)
    with open_store(tmp_path / "cold") as store:
        report = store.park(conv, source)
        assert (report.where, report.tokens) == ("disk", N)
        segments = len(conv.boundaries())
        assert 1 <= source.calls["gather_pages"] <= segments  # a run a call, not a page
        assert source.calls["page_views"] == 1  # the first page, checked before the park
    flat = np.zeros(N * TB, np.uint8)
    assert restore(tmp_path / "cold", flat).tokens == N
    assert np.array_equal(flat, kv)


def test_a_streamed_park_holds_chunks_not_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = (16 << 20) // TB  # 16 MiB of K/V
    monkeypatch.setattr(segment_store, "WRITE_CHUNK", 1 << 20)
    source = TokenMajorKV(n, fill=7)
    conv = Conversation("big", np.arange(n, dtype=np.uint32), [Checkpoint(n)], cuts=[0])
    with open_store(tmp_path / "cold") as store:
        tracemalloc.start()
        try:
            assert store.park(conv, source).where == "disk"
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"a streamed park of 16 MiB peaked at {peak / 2**20:.1f} MiB"


def test_a_destination_on_a_device_is_validated_there(tmp_path: Path) -> None:
    path, _ = parked(tmp_path)
    flip(path, segment=2, page=1)  # tokens 37..40: the ladder stops at the checkpoint 33
    for copy in ("ours", "builtin"):
        shutil.copytree(path, tmp_path / copy)
    ours = DeviceTokenMajorKV(64)
    assert restore(tmp_path / "ours", ours).tokens == 33
    assert ours.given["device"] > 0 and ours.given["host"] == 0  # validated device staging
    builtin, k, v = layer_kv(64)
    assert restore(tmp_path / "builtin", builtin).tokens == 33
    rows = ours.rows.copy_to_host()
    assert np.array_equal(rows[:33], as_token_major(k, v)[:33])
    assert zeroed_or_untouched(rows[33:])


def test_views_that_are_not_the_page_are_refused_by_name(tmp_path: Path) -> None:
    path, _ = parked(tmp_path)
    bad = ShortViews(64)
    with pytest.raises(DestinationRefused, match=r"ShortViews\.page_views\(0, 4\).* bytes"):
        restore(path, bad)
    assert zeroed_or_untouched(bad.rows)  # what the views took was zeroed
    ours = TokenMajorKV(64)  # the segments were not taken for damaged
    assert restore(path, ours).tokens == N
    conv, _ = conversation(N, CUTS)
    refused = pytest.raises(InvalidConversation, match=r"ShortViews\.page_views")
    with open_store(tmp_path / "other") as store, refused:
        store.park(conv, ShortViews(64))
