"""Both paged layouts of vLLM's GPU attention backends, on the host (:class:`PagedKV`) and on the
device (:class:`DevicePagedKV`, run in numba's CUDA simulator, reached through
``__cuda_array_interface__`` as a torch CUDA tensor is): FlashAttention's ``[2, num_blocks,
block_size, heads, dim]`` (``kv_first=True``) and FlashInfer's ``[num_blocks, 2, block_size,
heads, dim]`` (``kv_first=False``).

Every case is checked against a reference built here token by token (each token's K and V rows
put by hand where the layout says, and the stored pages of spec F-SEG-4 laid out by hand, pages
counted from each segment's start), and the host and device paths against each other byte for
byte: a park from the device pool and from the host pool write the same segment files and
sidecars (all but the time each was sealed); a restore writes the same bytes into both pools,
through a shuffled block table whose blocks are not contiguous; a flipped byte in a segment
file stops both at the same prefix, with nothing past it written. Tiny sizes: the simulator
runs a kernel thread by thread."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from numba import cuda

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.format import data_name
from stratastore.levels.local import SegmentStore
from stratastore.restore import (
    DestinationRefused,
    DeviceLayerKV,
    DevicePagedKV,
    LayerKV,
    PagedKV,
    Piece,
    as_engine_capture,
    two_pass_restore,
)
from stratastore.tiers.records import InvalidConversation
from tests.conftest import CudaInterface, tiny_fp
from tests.unit.restore.test_device_park import host_hashing

FP = tiny_fp()  # 2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, pages of 4 tokens
TB, PT, L = FP.token_bytes, FP.page_tokens, FP.n_layers
ROW = FP.n_kv_heads * FP.head_dim * FP.dtype.itemsize  # one token's K (or V) of one layer
N = 21
#: the second segment's pages start at token 10, not on a page of token 0; each segment's last
#: page is short (2 and 3 tokens)
CUTS = [0, 10, N]
BS, NB = 3, 10  # blocks of 3 tokens (pages of 4 span blocks), 10 in the pool
#: 8 blocks for 24 tokens, shuffled, with neighbours in memory (2, 3 and 7, 8) between others
TABLE = [6, 2, 3, 9, 0, 7, 8, 4]
LAYOUTS = [True, False]  # kv_first: FlashAttention's, FlashInfer's
SENTINEL = 0xEE


def conversation(cid: str = "c") -> Conversation:
    return Conversation(
        cid, as_tokens(np.arange(N)), [Checkpoint(CUTS[1]), Checkpoint(N)], cuts=CUTS[:-1]
    )


def token_rows(seed: int = 7) -> npt.NDArray[np.uint8]:
    """Each token's K and V rows: ``[layers, 2, N, ROW]`` random bytes."""
    return np.random.default_rng(seed).integers(0, 256, (L, 2, N, ROW), dtype=np.uint8)


def stored(rows: npt.NDArray[np.uint8], cuts: list[int] = CUTS) -> npt.NDArray[np.uint8]:
    """The stored layout of ``rows`` (spec F-SEG-4), by hand: each segment's pages counted
    from its start, a page per layer K then V, each ``[p, ROW]``."""
    out, pos = np.empty(cuts[-1] * TB, np.uint8), 0
    for a, b in itertools.pairwise(cuts):
        for p0 in range(a, b, PT):
            p = min(PT, b - p0)
            for layer, kind in itertools.product(range(L), (0, 1)):
                out[pos : pos + p * ROW] = rows[layer, kind, p0 : p0 + p].reshape(-1)
                pos += p * ROW
    return out


def pool_shape(kv_first: bool, nb: int = NB) -> tuple[int, ...]:
    lead = (2, nb) if kv_first else (nb, 2)
    return (*lead, BS, FP.n_kv_heads, FP.head_dim)


def row_of(pool: npt.NDArray[Any], kv_first: bool, block: int, kind: int, t: int) -> Any:
    """Token ``t``'s K (``kind`` 0) or V row in block ``block`` of a host pool, as bytes."""
    at = (kind, block, t % BS) if kv_first else (block, kind, t % BS)
    return pool.view(np.uint8).reshape(*pool.shape[:3], ROW)[at]


def filled_pools(
    kv_first: bool, rows: npt.NDArray[np.uint8] | None = None, table: list[int] = TABLE
) -> list[npt.NDArray[np.uint16]]:
    """Host pools (fp16 items as uint16) of SENTINEL bytes, with ``rows`` put by hand where
    the layout and ``table`` say."""
    pools = [np.full(pool_shape(kv_first), SENTINEL * 0x101, np.uint16) for _ in range(L)]
    if rows is not None:
        for layer, kind, t in itertools.product(range(L), (0, 1), range(N)):
            row_of(pools[layer], kv_first, table[t // BS], kind, t)[:] = rows[layer, kind, t]
    return pools


def on_device(pools: Sequence[npt.NDArray[Any]]) -> list[CudaInterface]:
    """The pools in device memory, seen only through ``__cuda_array_interface__``."""
    return [CudaInterface(cuda.to_device(p)) for p in pools]


def host_of(dev: list[CudaInterface]) -> list[npt.NDArray[np.uint8]]:
    return [d.host().view(np.uint8).reshape(-1) for d in dev]


def as_bytes(pools: list[npt.NDArray[Any]]) -> list[npt.NDArray[np.uint8]]:
    return [p.view(np.uint8).reshape(-1) for p in pools]


# -- the layouts, by hand ----------------------------------------------------------------------
@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_host_and_device_pools_gather_the_stored_pages(kv_first: bool) -> None:
    rows = token_rows()
    pools = filled_pools(kv_first, rows)
    want = stored(rows)
    bounds = conversation().boundaries()
    host = as_engine_capture(FP, PagedKV(FP, pools, TABLE, kv_first=kv_first), N)
    assert host is not None and np.array_equal(host.pack(bounds), want)  # through page views
    dev = DevicePagedKV(FP, on_device(pools), TABLE, kv_first=kv_first)
    gathered = dev.gather_pages_device(bounds)
    assert np.array_equal(gathered.copy_to_host(), want)
    assert np.array_equal(dev.gather_pages_device([(0, N)]).copy_to_host(), stored(rows, [0, N]))


@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_host_and_device_writes_and_zeroes_land_where_the_layout_says(kv_first: bool) -> None:
    rows = token_rows(3)
    data = stored(rows)
    host_pools, dev = filled_pools(kv_first), on_device(filled_pools(kv_first))
    host = PagedKV(FP, host_pools, TABLE, kv_first=kv_first)
    device = DevicePagedKV(FP, dev, TABLE, kv_first=kv_first)
    for dest in (host, device):
        for a, b in itertools.pairwise(CUTS):
            dest.write_pages(a, b - a, data[a * TB : b * TB], PT)
        dest.zero(5, 7)  # tokens [5, 12): across blocks and the segment cut
    want = filled_pools(kv_first, rows)
    for layer, kind, t in itertools.product(range(L), (0, 1), range(5, 12)):
        row_of(want[layer], kv_first, TABLE[t // BS], kind, t)[:] = 0
    assert all(
        np.array_equal(h, w) and np.array_equal(d, w)
        for h, d, w in zip(as_bytes(host_pools), host_of(dev), as_bytes(want), strict=True)
    )


# -- park: from the device pool as from the host pool --------------------------------------------
def disk_cfg(path: Path) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(path), "cold_mib": 64}


def segment_files(store: Store, conv: Conversation) -> list[object]:
    """Every segment file of ``conv`` in the store's disk level, byte for byte, and its
    sidecar, decoded, all but the time it was sealed (``sealed_at_ns``)."""
    level = store._tiers.levels[0].store
    out: list[object] = []
    for seg in conv.segment_keys(FP.digest()):
        out.append((Path(level.path) / data_name(seg.key)).read_bytes())
        with level.open_reader(seg.key) as r:
            out.append(dataclasses.replace(r.sidecar, sealed_at_ns=0))
    return out


@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_a_park_from_the_device_pool_writes_what_a_park_from_the_host_pool_writes(
    tmp_path: Path, kv_first: bool
) -> None:
    rows = token_rows()
    pools = filled_pools(kv_first, rows)
    with Store.open(FP, disk_cfg(tmp_path / "host")) as store:
        assert store.park(conversation(), PagedKV(FP, pools, TABLE, kv_first=kv_first)).where == (
            "disk"
        )
        store.flush()
        from_host = segment_files(store, conversation())
    with Store.open(FP, disk_cfg(tmp_path / "dev")) as store:
        dev = on_device(pools)
        with host_hashing() as calls:
            kv = DevicePagedKV(FP, dev, TABLE, kv_first=kv_first)
            assert store.park(conversation(), kv).where == "disk"
            store.flush()
        assert calls == []  # hashed on the device
        assert segment_files(store, conversation()) == from_host
        assert all(  # the engine's pool is read, never written
            np.array_equal(d, p) for d, p in zip(host_of(dev), as_bytes(pools), strict=True)
        )
        out = np.zeros(N * TB, np.uint8)
        r = store.restore(conversation().tokens, out)
        assert (r.source, r.tokens) == ("disk", N)
        assert np.array_equal(out, stored(rows))
        # a restore into another shuffled table of a fresh pool, device and host alike
        table = [1, 8, 5, 0, 9, 4, 2, 6]
        host_pools, dev_pools = filled_pools(kv_first), on_device(filled_pools(kv_first))
        for dest in (
            PagedKV(FP, host_pools, table, kv_first=kv_first),
            DevicePagedKV(FP, dev_pools, table, kv_first=kv_first),
        ):
            r = store.restore(conversation().tokens, dest)
            assert (r.source, r.tokens) == ("disk", N)
        want = as_bytes(filled_pools(kv_first, rows, table))
        assert all(
            np.array_equal(h, w) and np.array_equal(d, w)
            for h, d, w in zip(as_bytes(host_pools), host_of(dev_pools), want, strict=True)
        )


def test_a_park_from_device_layer_arrays_writes_what_the_host_arrays_write(
    tmp_path: Path,
) -> None:
    rows = token_rows(11)
    shape = (N + 2, FP.n_kv_heads, FP.head_dim)
    arrays = [np.zeros(shape, np.float16) for _ in range(2 * L)]
    for layer, kind in itertools.product(range(L), (0, 1)):
        arrays[2 * layer + kind].view(np.uint8).reshape(N + 2, ROW)[:N] = rows[layer, kind]
    k, v = arrays[0::2], arrays[1::2]
    with Store.open(FP, disk_cfg(tmp_path / "host")) as store:
        store.park(conversation(), LayerKV(FP, k, v))
        store.flush()
        from_host = segment_files(store, conversation())
    with Store.open(FP, disk_cfg(tmp_path / "dev")) as store:
        kv = DeviceLayerKV(FP, on_device(k), on_device(v))
        assert store.park(conversation(), kv).where == "disk"
        store.flush()
        assert segment_files(store, conversation()) == from_host


@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_a_device_pool_too_small_or_a_bad_conversation_is_refused_before_the_gather(
    tmp_path: Path, kv_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numba_kernels.cuda

    launched: list[str] = []
    real = numba_kernels.cuda.gather_rows_device

    def counted(*a: Any, **kw: Any) -> None:
        launched.append("gather")
        real(*a, **kw)

    monkeypatch.setattr(numba_kernels.cuda, "gather_rows_device", counted)
    dev = on_device(filled_pools(kv_first, token_rows()))
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        short = DevicePagedKV(FP, dev, TABLE[:6], kv_first=kv_first)  # 18 tokens
        with pytest.raises(InvalidConversation, match=f"holds 18 tokens; the conversation has {N}"):
            store.park(conversation(), short)
        bad = conversation()
        bad.cuts = [0, N + 4]
        with pytest.raises(InvalidConversation, match="segment cuts"):
            store.park(bad, DevicePagedKV(FP, dev, TABLE, kv_first=kv_first))
        other = tiny_fp("test/other")
        with pytest.raises(InvalidConversation, match="make the DevicePagedKV with the store's"):
            store.park(conversation(), DevicePagedKV(other, dev, TABLE, kv_first=kv_first))
        assert launched == []
        store.flush()
        assert store.stats()["parks_disk"] == 0
    kv = DevicePagedKV(FP, dev, TABLE, kv_first=kv_first)
    for bounds in ([(0, 10), (12, 22)], [(2, 10)], [(0, 10), (10, 10)], [(0, 30)]):
        with pytest.raises(DestinationRefused, match="gather"):
            kv.gather_pages_device(bounds)
    assert kv.gather_pages_device([]).shape == (0,)


# -- restore: the device pool as the host pool, damage included -----------------------------------
def image(store: SegmentStore, rows: npt.NDArray[np.uint8]) -> list[Piece]:
    data, parent, pieces = stored(rows), store.root_key, []
    for a, b in itertools.pairwise(CUTS):
        r = store.put_kv(parent, np.arange(a, b), data[a * TB : b * TB], token_start=a)
        pieces.append(Piece(a, b, r.key, store))
        parent = r.key
    return pieces


def page_floor(bad: int) -> int:
    start = max(c for c in CUTS if c <= bad)
    return start + (bad - start) // PT * PT


#: where a byte is flipped (segment, byte offset in its payload) and the prefix restored
DAMAGE = {
    "none": (None, N),
    "first page": ((0, 5), 0),
    "second segment, middle page": ((1, PT * TB + 9), 14),
    "second segment, short last page": ((1, 2 * PT * TB + 70), 18),
}


@pytest.mark.parametrize("how", list(DAMAGE))
@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_a_device_pool_restore_is_byte_for_byte_the_host_pools(
    tmp_path: Path, kv_first: bool, how: str
) -> None:
    rows = token_rows(5)
    (flip, prefix) = DAMAGE[how]
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces = image(store, rows)
        if flip is not None:
            path = Path(store.path) / data_name(pieces[flip[0]].key)
            raw = bytearray(path.read_bytes())
            raw[4096 + flip[1]] ^= 0x10
            path.write_bytes(bytes(raw))
        staged, direct = filled_pools(kv_first), filled_pools(kv_first)
        dev = on_device(filled_pools(kv_first))
        outcomes = [
            two_pass_restore(pieces, N, dest, FP, resume_at=page_floor, chunk_bytes=2 * PT * TB)
            for dest in (
                PagedKV(FP, staged, TABLE, kv_first=kv_first, read_direct=False),
                PagedKV(FP, direct, TABLE, kv_first=kv_first),
                DevicePagedKV(FP, dev, TABLE, kv_first=kv_first),
            )
        ]
    assert {(o.tokens, o.first_bad) for o in outcomes} == {
        (prefix, None if flip is None else prefix)
    }
    # the device path does what the host path does through staging, byte for byte (a direct
    # read into the host pool zeroes what it placed past the prefix instead of leaving it)
    got = {"staged": as_bytes(staged), "direct": as_bytes(direct), "device": host_of(dev)}
    assert all(np.array_equal(a, b) for a, b in zip(got["staged"], got["device"], strict=True))
    for which, arrays in got.items():
        holds_the_prefix_and_nothing_past_it(arrays, kv_first, rows, prefix, which)


def holds_the_prefix_and_nothing_past_it(
    arrays: list[npt.NDArray[np.uint8]],
    kv_first: bool,
    rows: npt.NDArray[np.uint8],
    prefix: int,
    which: str,
) -> None:
    """The prefix's rows where the table says; past it the old bytes or zeros, never a stored
    byte; the blocks outside the table untouched."""
    pools = [p.view(np.uint16).reshape(pool_shape(kv_first)) for p in arrays]
    for layer, kind, t in itertools.product(range(L), (0, 1), range(N)):
        row = row_of(pools[layer], kv_first, TABLE[t // BS], kind, t)
        if t < prefix:
            assert np.array_equal(row, rows[layer, kind, t]), (which, layer, kind, t)
        else:
            assert (row == SENTINEL).all() or not row.any(), (which, layer, kind, t)
    for layer, block in itertools.product(range(L), sorted(set(range(NB)) - set(TABLE))):
        at = (slice(None), block) if kv_first else (block,)
        assert (pools[layer].view(np.uint8)[at] == SENTINEL).all(), (which, layer, block)


# -- refusals, by name ---------------------------------------------------------------------------
def given(arrays: list[npt.NDArray[Any]], device: bool) -> list[Any]:
    """``arrays`` as given to a host pool, or in device memory for a device one."""
    return on_device(arrays) if device else arrays


@pytest.mark.parametrize("device", [False, True])
@pytest.mark.parametrize("kv_first", LAYOUTS)
def test_a_pool_of_the_other_layout_or_shape_is_refused_naming_the_layout(
    kv_first: bool, device: bool
) -> None:
    make: Any = DevicePagedKV if device else PagedKV
    other = given([np.zeros(pool_shape(not kv_first), np.uint16) for _ in range(L)], device)
    name = "FlashAttention" if kv_first else "FlashInfer"
    lead = "[2, num_blocks" if kv_first else "[num_blocks, 2"
    with pytest.raises(DestinationRefused, match=rf"{name}.*pool\[0\] is \(\d+, \d+, 3") as e:
        make(FP, other, TABLE, kv_first=kv_first)
    assert lead in str(e.value) and f"kv_first={kv_first}" in str(e.value)
    wide = (*pool_shape(kv_first)[:3], FP.n_kv_heads, 2 * FP.head_dim)
    with pytest.raises(DestinationRefused, match="wrong offset"):
        make(
            FP,
            given([np.zeros(wide, np.uint16) for _ in range(L)], device),
            TABLE,
            kv_first=kv_first,
        )
    one = np.zeros(pool_shape(kv_first), np.uint16)
    same = [cuda.to_device(one)] * 2 if device else [one, one]
    with pytest.raises(DestinationRefused, match="overlaps"):
        make(FP, same, TABLE, kv_first=kv_first)
    good = given([np.zeros(pool_shape(kv_first), np.uint16) for _ in range(L)], device)
    with pytest.raises(DestinationRefused, match=f"block {NB}"):
        make(FP, good, [0, NB], kv_first=kv_first)
    with pytest.raises(DestinationRefused, match="twice"):
        make(FP, good, [4, 4], kv_first=kv_first)
