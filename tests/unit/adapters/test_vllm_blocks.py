"""The vLLM connector's block moves, without vLLM (numpy only): a park gathers a
request's pages into the stored page layout and a restore puts them back bit for bit, in
vLLM's CPU layout (``[blocks, heads, block_size, 2 x head_dim]``) and the paged GPU layout
(``[2, blocks, block_size, heads, head_dim]``), with a block of one page or of several (a page
of 16 tokens in blocks of 64: a restore may end mid-block); a restore never writes below
``skip`` (vLLM's own prefix cache, floored to a page) nor outside the request's pages; block
ids outside the pool or given twice are refused; a store round trip lands the same bytes.
(What the connector plans: tests/unit/adapters/test_vllm_plan.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Checkpoint, ConfigError, Conversation, ModelFingerprint
from stratastore.adapters.vllm.block_layout import BlockLayout, Mover
from stratastore.adapters.vllm.pool import CpuBlocks, Pool, layer_order
from stratastore.chain import as_tokens
from stratastore.facade import Store
from stratastore.restore import DestinationRefused, PagedKV, as_engine_capture

BS, H, D, L, NB = 16, 2, 8, 3, 12
P, BIG = 16, 64  #: the store's page inside vLLM's block of 64 (4 pages a block)


def _fp() -> ModelFingerprint:
    return ModelFingerprint.create(
        "tiny", n_layers=L, n_kv_heads=H, head_dim=D, page_tokens=P, dtype="bfloat16"
    )


def _cpu_pool(seed: int, bs: int = BS) -> list[np.ndarray]:
    """Per layer [blocks, heads, 2, bs, dim] int16 (the CPU layout, as the pool views it)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-30000, 30000, (NB, H, 2, bs, D), dtype=np.int16) for _ in range(L)]


def _paged_pool(seed: int, bs: int = BS) -> list[np.ndarray]:
    """Per layer [2, blocks, bs, heads, dim] int16 (the paged layout)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-30000, 30000, (2, NB, bs, H, D), dtype=np.int16) for _ in range(L)]


def _pool(arrays: list[np.ndarray], cpu: bool, bs: int) -> Pool:
    """A :class:`Pool` over numpy arrays as it holds them (no torch)."""
    pool = Pool.__new__(Pool)
    pool.fp, pool.cpu, pool.arrays, pool.num_blocks, pool.block_size = _fp(), cpu, arrays, NB, bs
    pool.device, pool.kv_first = False, True
    rows = BlockLayout.rows(bs, D)
    pool.movers = (Mover(rows.k, P), Mover(rows.v, P))
    return pool


def _stored(blocks: CpuBlocks, n_tokens: int) -> np.ndarray:
    """The first ``n_tokens`` of ``blocks`` as stored pages, gathered as a park gathers them
    (the store's capture of a source in the engine's layout)."""
    capture = as_engine_capture(blocks.fp, blocks, n_tokens)
    assert capture is not None
    return capture.pack([(0, n_tokens)])


def _token_rows(arrays: list[np.ndarray], cpu: bool, block: int, slot: int) -> np.ndarray:
    """One token's K/V as [layers, 2, heads, dim], read one element path at a time."""
    if cpu:
        return np.stack([a[block, :, :, slot].transpose(1, 0, 2) for a in arrays])
    return np.stack([a[:, block, slot] for a in arrays])


def _expected_pages(arrays: list[np.ndarray], cpu: bool, bs: int, ids: list[int], n: int):
    """The stored pages (F-SEG-4) of a request's first ``n`` tokens, token by token."""
    out = np.empty((n // P, L, 2, P, H, D), np.int16)
    for t in range(n):
        out[t // P, :, :, t % P] = _token_rows(arrays, cpu, ids[t // bs], t % bs)
    return out


def test_cpu_blocks_round_trip_through_the_stored_layout() -> None:
    fp = _fp()
    src, dst = _cpu_pool(1), _cpu_pool(2)
    before = [a.copy() for a in dst]
    ids_src, ids_dst = [7, 2, 9], [0, 5, 11]
    pages = _stored(CpuBlocks(fp, src, ids_src), 3 * BS)
    assert pages.size == 3 * BS * fp.token_bytes
    # the stored layout (F-SEG-4): page i, layer l, K then V, [bs, heads, dim]
    p = pages.view(np.int16).reshape(3, L, 2, BS, H, D)
    assert np.array_equal(p[1, 2, 1], src[2][2, :, 1].transpose(1, 0, 2))
    CpuBlocks(fp, dst, ids_dst).write_pages(0, 3 * BS, pages, BS)
    for layer in range(L):
        assert np.array_equal(dst[layer][ids_dst], src[layer][ids_src])
        others = [b for b in range(NB) if b not in ids_dst]
        assert np.array_equal(dst[layer][others], before[layer][others])  # nothing else


def test_cpu_blocks_never_write_below_skip() -> None:
    fp = _fp()
    src, dst = _cpu_pool(3), _cpu_pool(4)
    before = [a.copy() for a in dst]
    pages = _stored(CpuBlocks(fp, src, [1, 2, 3]), 3 * BS)
    CpuBlocks(fp, dst, [4, 5, 6], skip=2 * BS).write_pages(0, 3 * BS, pages, BS)
    for layer in range(L):
        assert np.array_equal(dst[layer][[4, 5]], before[layer][[4, 5]])  # vLLM's own blocks
        assert np.array_equal(dst[layer][6], src[layer][3])


def test_cpu_blocks_refuse_a_partial_page() -> None:
    fp = _fp()
    dest = CpuBlocks(fp, _cpu_pool(5), [0, 1])
    with pytest.raises(DestinationRefused, match="not whole pages of 16"):
        dest.write_pages(0, BS + 3, np.zeros((BS + 3) * fp.token_bytes, np.uint8), BS)


def test_a_store_round_trip_lands_the_same_blocks(tmp_path: Path) -> None:
    """Park from one request's blocks, restore into another's, through a Store on disk: the
    bytes are the bytes, validated; a damaged page restores the blocks before it only."""
    fp = _fp()
    src, dst = _cpu_pool(6), _cpu_pool(7)
    tokens = as_tokens(np.arange(100, 100 + 4 * BS))
    with Store.open(
        fp,
        {
            "ram_mib": 0,
            "park": "disk",
            "cold_dir": str(tmp_path / "c"),
            "cold_mib": 16,
            "page_resume": True,
        },
    ) as store:
        kv = _stored(CpuBlocks(fp, src, [3, 1, 4, 8]), 4 * BS)
        store.park(Conversation("vllm-a", tokens, [Checkpoint(4 * BS)], cuts=[0, 2 * BS]), kv)
        store.flush()
        dest = CpuBlocks(fp, dst, [0, 2, 5, 6])
        got = store.restore(tokens, dest, max_tokens=4 * BS)
        assert got.tokens == 4 * BS
        for layer in range(L):
            assert np.array_equal(dst[layer][[0, 2, 5, 6]], src[layer][[3, 1, 4, 8]])
        # a byte flipped in the second segment's first page: the first segment only (the
        # segment found by its bytes: both are one size, and their names are content keys)
        page = kv[2 * BS * fp.token_bytes : 3 * BS * fp.token_bytes].tobytes()
        seg = next(f for f in tmp_path.glob("c/strata-conv-*.seg") if page in f.read_bytes())
        raw = bytearray(seg.read_bytes())
        raw[raw.find(page) + 5] ^= 0xFF
        seg.write_bytes(bytes(raw))
    with Store.open(
        fp,
        {
            "ram_mib": 0,
            "park": "disk",
            "cold_dir": str(tmp_path / "c"),
            "cold_mib": 16,
            "page_resume": True,
        },
    ) as store:
        fresh = _cpu_pool(8)
        before = [a.copy() for a in fresh]
        got = store.restore(tokens, CpuBlocks(fp, fresh, [0, 2, 5, 6]), max_tokens=4 * BS)
        assert got.tokens == 2 * BS
        for layer in range(L):
            assert np.array_equal(fresh[layer][[0, 2]], src[layer][[3, 1]])
            assert np.array_equal(fresh[layer][[5, 6]], before[layer][[5, 6]])


def test_the_paged_layout_gathers_what_paged_kv_restores(tmp_path: Path) -> None:
    fp = _fp()
    pools = _paged_pool(9)
    pages = _pool(pools, False, BS).copy([5, 1], 2 * BS)
    dst = [np.zeros_like(p) for p in pools]
    PagedKV(fp, dst, [0, 3]).write_pages(0, 2 * BS, pages, BS)
    for layer in range(L):
        assert np.array_equal(dst[layer][:, [0, 3]], pools[layer][:, [5, 1]])


# -- pages of 16 in blocks of 64 ---------------------------------------------------------------
@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "paged"])
def test_pages_land_in_part_of_a_block_and_nothing_else_changes(cpu: bool) -> None:
    """A restore of 5 pages into blocks of 4 fills the first block and the first page of the
    second: the rest of that block, and every other block, keep their bytes."""
    make = _cpu_pool if cpu else _paged_pool
    src, dst = make(10, BIG), make(11, BIG)
    before = [a.copy() for a in dst]
    n = 5 * P  # ends a page into the second block
    pages = _pool(src, cpu, BIG).copy([7, 2], n)
    assert np.array_equal(
        pages.view(np.int16).reshape(5, L, 2, P, H, D), _expected_pages(src, cpu, BIG, [7, 2], n)
    )
    dest = _pool(dst, cpu, BIG).destination([0, 5])
    assert dest.capacity() == 2 * BIG
    dest.write_pages(0, 3 * P, pages[: 3 * P * _fp().token_bytes], P)  # two calls, the second
    dest.write_pages(3 * P, 2 * P, pages[3 * P * _fp().token_bytes :], P)  # from mid-block
    assert np.array_equal(_pool(dst, cpu, BIG).copy([0, 5], n), pages)
    for layer in range(L):
        got, old = dst[layer], before[layer]
        if cpu:  # [blocks, heads, 2, bs, dim]
            assert np.array_equal(got[5][:, :, P:], old[5][:, :, P:])  # the block's other pages
            rest = [b for b in range(NB) if b not in (0, 5)]
            assert np.array_equal(got[rest], old[rest])
        else:  # [2, blocks, bs, heads, dim]
            assert np.array_equal(got[:, 5, P:], old[:, 5, P:])
            rest = [b for b in range(NB) if b not in (0, 5)]
            assert np.array_equal(got[:, rest], old[:, rest])


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "paged"])
def test_zero_takes_back_pages_past_skip_and_nothing_else(cpu: bool) -> None:
    """What a restore takes back past the prefix it reports: tokens [48, 112) zeroed in blocks
    of 64 with vLLM's own first 64 tokens skipped: only [64, 112), a block's first 3 pages."""
    make = _cpu_pool if cpu else _paged_pool
    dst = make(12, BIG)
    before = [a.copy() for a in dst]
    _pool(dst, cpu, BIG).destination([4, 9], skip=BIG).zero(3 * P, 4 * P)
    for layer in range(L):
        got, old = dst[layer], before[layer]
        blk = (lambda a, b: a[b]) if cpu else (lambda a, b: a[:, b])
        slots = (lambda a, lo, hi: a[:, :, lo:hi]) if cpu else (lambda a, lo, hi: a[:, lo:hi])
        assert not slots(blk(got, 9), 0, 3 * P).any()
        assert np.array_equal(slots(blk(got, 9), 3 * P, BIG), slots(blk(old, 9), 3 * P, BIG))
        rest = [b for b in range(NB) if b != 9]
        assert all(np.array_equal(blk(got, b), blk(old, b)) for b in rest)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "paged"])
def test_a_skip_inside_a_page_floors_to_the_page(cpu: bool) -> None:
    """skip 40 (vLLM's own tokens) in pages of 16: tokens from 32 are written, none below."""
    make = _cpu_pool if cpu else _paged_pool
    src, dst = make(12, BIG), make(13, BIG)
    before = [a.copy() for a in dst]
    n = 6 * P
    pages = _pool(src, cpu, BIG).copy([3, 4], n)
    _pool(dst, cpu, BIG).destination([8, 9], skip=40).write_pages(0, n, pages, P)
    want = _expected_pages(src, cpu, BIG, [3, 4], n)
    old = _expected_pages(before, cpu, BIG, [8, 9], n)
    got = _pool(dst, cpu, BIG).copy([8, 9], n).view(np.int16).reshape(want.shape)
    assert np.array_equal(got[:2], old[:2])  # tokens 0..31 are vLLM's, untouched
    assert np.array_equal(got[2:], want[2:])  # 32..95, from the store (the page holding 40)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "paged"])
def test_a_park_gathers_whole_pages_not_whole_blocks(cpu: bool) -> None:
    make = _cpu_pool if cpu else _paged_pool
    src = make(14, BIG)
    for n in (0, P, 3 * P, BIG + P, 2 * BIG):
        got = _pool(src, cpu, BIG).copy(np.array([6, 0]), n)
        assert got.size == n * _fp().token_bytes
        want = _expected_pages(src, cpu, BIG, [6, 0], n)
        assert np.array_equal(got.view(np.int16).reshape(want.shape), want)
    for bad in (P + 1, 2 * BIG + P):  # not whole pages; past the request's blocks
        with pytest.raises(ConfigError, match="whole pages of 16"):
            _pool(src, cpu, BIG).copy([6, 0], bad)


def test_cpu_blocks_refuse_what_is_not_whole_pages_of_the_store() -> None:
    fp = _fp()
    dest = CpuBlocks(fp, _cpu_pool(15, BIG), [0, 1], block_size=BIG)
    zeros = np.zeros(2 * BIG * fp.token_bytes, np.uint8)
    for start, n, page in ((8, P, P), (0, P + 8, P), (0, BIG, BIG), (BIG, 2 * BIG, P)):
        with pytest.raises(DestinationRefused, match=rf"tokens \[{start}, {start + n}\)"):
            dest.write_pages(start, n, zeros, page)


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "paged"])
@pytest.mark.parametrize(
    "ids, said",
    [
        ([3, 3], r"(vLLM's|PagedKV) block table gives block 3 twice"),
        ([0, -1], "holds block -1; the pool's block ids are 0..11: pass only blocks"),
        ([NB], "holds block 12; the pool's block ids are 0..11"),
        ([[0, 1]], "one-dimensional"),
        ([0.5], "integer block ids"),
    ],
)
def test_bad_block_ids_are_refused_when_the_destination_is_made(
    cpu: bool, ids: object, said: str
) -> None:
    make = _cpu_pool if cpu else _paged_pool
    arrays = make(16, BIG)
    before = [a.copy() for a in arrays]
    pool = _pool(arrays, cpu, BIG)
    with pytest.raises(DestinationRefused, match=said):
        pool.destination(ids)  # type: ignore[arg-type]
    with pytest.raises(DestinationRefused, match=said):
        pool.copy(ids, P)  # type: ignore[arg-type]
    assert all(np.array_equal(a, b) for a, b in zip(arrays, before, strict=True))


def test_a_repeated_block_is_named_with_its_entries() -> None:
    with pytest.raises(DestinationRefused, match=r"block 3 twice \(entries 0 and 2\).*distinct"):
        _pool(_cpu_pool(17, BIG), True, BIG).destination([3, 4, 3])


def test_a_block_size_not_a_multiple_of_the_page_is_a_config_error() -> None:
    fp = _fp()
    with pytest.raises(
        ConfigError, match="block size 40 is not a multiple of the store's page of 16"
    ):
        CpuBlocks(fp, _cpu_pool(18, 40), [0])
    with pytest.raises(ConfigError, match="block size 24 is not a multiple"):
        Pool(fp, {}, 24)  # refused before torch is needed
    with pytest.raises(
        DestinationRefused, match=r"of \(12, 2, 2, 64, 8\); .* needs 3 of \[blocks, 2, 2, 128, 8\]"
    ):
        CpuBlocks(fp, _cpu_pool(18, BIG), [0], block_size=2 * BIG)


def test_the_pool_takes_vllms_tensors_in_blocks_of_several_pages() -> None:
    """Through torch (vLLM's tensors as vLLM registers them): the CPU layout in blocks of 64
    round-trips pages through the same memory; tensors not in blocks of the size given, or a
    block size not a multiple of the page, refuse the pool at start-up."""
    torch = pytest.importorskip("torch")
    fp = _fp()
    names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
    caches = {n: torch.randn(NB, H, BIG, 2 * D).to(torch.bfloat16) for n in names}
    pool = Pool(fp, caches, BIG)
    assert pool.cpu and pool.num_blocks == NB
    pages = pool.copy([4, 9], BIG + 2 * P)
    layer1 = caches[names[1]].view(torch.int16).numpy().reshape(NB, H, 2, BIG, D)
    # page 4 (the first of block 9), layer 1, V: [p, heads, dim]
    p = pages.view(np.int16).reshape(6, L, 2, P, H, D)
    assert np.array_equal(p[4, 1, 1], layer1[9, :, 1, :P].transpose(1, 0, 2))
    before = {n: t.clone() for n, t in caches.items()}
    pool.destination([1, 2]).write_pages(0, BIG + 2 * P, pages, P)
    assert np.array_equal(pool.copy([1, 2], BIG + 2 * P), pages)
    for n in names:  # block 2's last two pages and every other block are as they were
        got, old = (
            t.view(torch.int16).numpy().reshape(NB, H, 2, BIG, D) for t in (caches[n], before[n])
        )
        assert np.array_equal(got[2, :, :, 2 * P :], old[2, :, :, 2 * P :])
        assert np.array_equal(got[[0, *range(3, NB)]], old[[0, *range(3, NB)]])
    with pytest.raises(ConfigError, match=r"in blocks of 128 needs \[blocks, 2, 128, 16\]"):
        Pool(fp, caches, 2 * BIG)
    with pytest.raises(ConfigError, match="block size 40 is not a multiple"):
        Pool(fp, caches, 40)


def test_a_store_restore_ends_mid_block(tmp_path: Path) -> None:
    """Park 5 pages of a request in blocks of 64, restore them into another's: the restore
    ends a page into the second block and leaves the rest of it alone."""
    fp = _fp()
    src, dst = _cpu_pool(19, BIG), _cpu_pool(20, BIG)
    before = [a.copy() for a in dst]
    n = BIG + P
    tokens = as_tokens(np.arange(7, 7 + n))
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path), "cold_mib": 16}
    with Store.open(fp, {**cfg, "page_resume": True}) as store:
        kv = _pool(src, True, BIG).copy([10, 11], n)
        store.park(Conversation("vllm-b", tokens, [Checkpoint(n)], cuts=[0, 2 * P]), kv)
        store.flush()
        got = store.restore(tokens, _pool(dst, True, BIG).destination([0, 1]), max_tokens=n)
        assert got.tokens == n
    assert np.array_equal(_pool(dst, True, BIG).copy([0, 1], n), kv)
    for layer in range(L):
        assert np.array_equal(dst[layer][1][:, :, P:], before[layer][1][:, :, P:])
        assert np.array_equal(dst[layer][2:], before[layer][2:])


def test_layer_order_is_by_layer_number() -> None:
    names = [
        "model.layers.10.self_attn.attn",
        "model.layers.2.self_attn.attn",
        "model.layers.0.self_attn.attn",
    ]
    assert layer_order(names) == [names[2], names[1], names[0]]
    with pytest.raises(ConfigError, match="layer number"):
        layer_order(["model.attn"])
