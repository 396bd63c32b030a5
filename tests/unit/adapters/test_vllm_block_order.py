"""The order inside a block of vLLM's CPU cache, without vLLM: whatever order a block's K and V
regions keep (token-major rows, dim-major columns, AMX's tiles, or any permutation, moved by
its offsets), a page gathered from a pool is its tokens' items in the stored layout, a page
restored lands on exactly those items (the rest of the block, and every other block, left as
they were), and a round trip gives the same bytes, pages of 16 inside blocks of 128 and 32.
The order a view is chosen by is checked against the offsets, never assumed."""

from __future__ import annotations

import numpy as np
import pytest

from stratastore import ModelFingerprint
from stratastore.adapters.vllm.block_layout import KNOWN, BlockLayout, Mover
from stratastore.adapters.vllm.pool import CpuBlocks
from stratastore.restore import DestinationRefused

L, H, D, NB, P = 2, 2, 32, 5, 16


def _fp() -> ModelFingerprint:
    return ModelFingerprint.create(
        "tiny", n_layers=L, n_kv_heads=H, head_dim=D, page_tokens=P, dtype="bfloat16"
    )


def _orders(bs: int) -> dict[str, BlockLayout]:
    """Named orders of a block's regions: each known view, and a random permutation."""
    made = {name: make(bs, D, P).offsets() for name, make, fits in KNOWN if fits(bs, D, P)}
    rng = np.random.default_rng(5)
    shuffled = rng.permutation(bs * D).reshape(bs, D).astype(np.int64)
    return {
        "rows": BlockLayout(made["rows"], made["rows"]),
        "columns/rows": BlockLayout(made["columns"], made["rows"]),
        "amx": BlockLayout(made["amx K"], made["amx V"]),
        "any permutation": BlockLayout(shuffled, shuffled[::-1].copy()),
    }


def _physical(logical: np.ndarray, order: BlockLayout) -> np.ndarray:
    """vLLM's memory for a logical ``[blocks, heads, 2, bs, dim]`` layer: each region's items
    at the order's offsets (``[blocks, heads, 2, bs, dim]`` as raw memory)."""
    nb, h, _, bs, d = logical.shape
    out = np.empty((nb, h, 2, bs * d), logical.dtype)
    for kind, offsets in enumerate((order.k, order.v)):
        out[:, :, kind][..., offsets.reshape(-1)] = logical[:, :, kind].reshape(nb, h, bs * d)
    return out.reshape(nb, h, 2, bs, d)


@pytest.mark.parametrize("bs", [32, 128])
@pytest.mark.parametrize("name", ["rows", "columns/rows", "amx", "any permutation"])
def test_pages_move_to_and_from_the_items_of_their_tokens(name: str, bs: int) -> None:
    order, fp = _orders(bs)[name], _fp()
    movers = (Mover(order.k, P), Mover(order.v, P))
    want_views = {"rows": ("rows", "rows"), "columns/rows": ("columns", "rows")}
    want_views |= {"amx": ("amx K", "amx V"), "any permutation": ("offsets", "offsets")}
    assert (movers[0].name, movers[1].name) == want_views[name]
    rng = np.random.default_rng(1)
    logical = [rng.integers(-30000, 30000, (NB, H, 2, bs, D), dtype=np.int16) for _ in range(L)]
    pool = [_physical(a, order) for a in logical]
    ids = [3, 0, 4]
    n = bs + P  # a block and part of the next: a restore that ends mid-block
    pages = _gathered(CpuBlocks(fp, pool, ids, 0, bs, movers), n)
    stored = pages.view(np.int16).reshape(n // P, L, 2, P, H, D)
    for layer in range(L):  # the stored layout: page, layer, K/V, [page tokens, heads, dim]
        for t in (0, P + 3, bs - 1, bs, n - 1):
            b, slot = ids[t // bs], t % bs
            got = stored[t // P, layer, :, t % P]  # [2, heads, dim]
            assert np.array_equal(got, logical[layer][b, :, :, slot].transpose(1, 0, 2))
    target = [np.zeros_like(a) for a in pool]
    CpuBlocks(fp, target, [1, 2, 0], 0, bs, movers).write_pages(0, n, pages, P)
    for layer in range(L):
        back = np.empty_like(logical[layer])  # the target's items in logical order
        for kind, offsets in enumerate((order.k, order.v)):
            region = target[layer][:, :, kind].reshape(NB, H, bs * D)
            back[:, :, kind] = region[..., offsets.reshape(-1)].reshape(NB, H, bs, D)
        assert np.array_equal(back[1], logical[layer][3])  # the whole first block
        part = n - bs
        assert np.array_equal(back[2][:, :, :part], logical[layer][0][:, :, :part])
        assert not back[2][:, :, part:].any() and not back[[0, 3, 4]].any()  # nothing else
    again = _gathered(CpuBlocks(fp, target, [1, 2, 0], 0, bs, movers), n)
    assert np.array_equal(again, pages)


def _gathered(blocks: CpuBlocks, n: int) -> np.ndarray:
    """The first ``n`` tokens of ``blocks`` as stored pages (what a park streams out of them)."""
    out = np.empty(n * blocks.fp.token_bytes, dtype=np.uint8)
    blocks.gather_pages(0, n, out, blocks.page)
    return out


def test_a_view_is_chosen_only_when_it_gives_the_offsets() -> None:
    rows = BlockLayout.rows(128, D)
    nearly = rows.k.copy()
    nearly[5, 1], nearly[5, 2] = nearly[5, 2], nearly[5, 1]  # two items swapped
    assert Mover(rows.k, P).name == "rows"
    assert Mover(nearly, P).name == "offsets"
    assert Mover(_orders(128)["amx"].k, 8).name == "offsets"  # a page inside AMX's tile


def test_blocks_that_are_not_contiguous_are_refused() -> None:
    fp, bs = _fp(), 32
    wide = np.zeros((NB, H, 2, bs, 2 * D), np.int16)
    views = [wide[..., :D] for _ in range(L)]  # the right shape, every row strided
    with pytest.raises(DestinationRefused, match="C-contiguous"):
        CpuBlocks(fp, views, [0], 0, bs)
