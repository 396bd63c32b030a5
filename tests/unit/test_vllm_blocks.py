"""The vLLM connector's planning and block moves, without vLLM (numpy only): a park gathers a
request's blocks into the stored page layout and a restore puts them back bit for bit, in
vLLM's CPU layout (``[blocks, heads, block_size, 2 x head_dim]``) and the paged GPU layout
(``[2, blocks, block_size, heads, head_dim]``); a restore never writes below ``skip`` (vLLM's
own prefix cache) nor outside the request's blocks; a store round trip lands the same bytes;
how much a request loads, how a park is cut, and the store's settings from vLLM's config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Checkpoint, ConfigError, Conversation, ModelFingerprint
from stratastore.adapters.vllm.plan import (
    default_store_dir,
    fingerprint,
    loadable,
    save_cuts,
    saved_tokens,
    store_config,
)
from stratastore.adapters.vllm.pool import CpuBlocks, layer_order
from stratastore.chain import as_tokens
from stratastore.facade import Store
from stratastore.restore import DestinationRefused, PagedKV

BS, H, D, L, NB = 16, 2, 8, 3, 12


def _fp() -> ModelFingerprint:
    return fingerprint(
        "tiny",
        None,
        {"a": 1},
        n_layers=L,
        n_kv_heads=H,
        head_dim=D,
        block_size=BS,
        dtype="torch.bfloat16",
        backend="cpu/vec",
    )


def _cpu_pool(seed: int) -> list[np.ndarray]:
    """Per layer [blocks, heads, 2, bs, dim] int16 (the CPU layout, as the pool views it)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-30000, 30000, (NB, H, 2, BS, D), dtype=np.int16) for _ in range(L)]


def test_cpu_blocks_round_trip_through_the_stored_layout() -> None:
    fp = _fp()
    src, dst = _cpu_pool(1), _cpu_pool(2)
    before = [a.copy() for a in dst]
    ids_src, ids_dst = [7, 2, 9], [0, 5, 11]
    pages = CpuBlocks(fp, src, ids_src).gather(3)
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
    pages = CpuBlocks(fp, src, [1, 2, 3]).gather(3)
    CpuBlocks(fp, dst, [4, 5, 6], skip=2 * BS).write_pages(0, 3 * BS, pages, BS)
    for layer in range(L):
        assert np.array_equal(dst[layer][[4, 5]], before[layer][[4, 5]])  # vLLM's own blocks
        assert np.array_equal(dst[layer][6], src[layer][3])


def test_cpu_blocks_refuse_a_partial_block() -> None:
    fp = _fp()
    dest = CpuBlocks(fp, _cpu_pool(5), [0, 1])
    with pytest.raises(DestinationRefused, match="whole blocks"):
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
        kv = CpuBlocks(fp, src, [3, 1, 4, 8]).gather(4)
        store.park(Conversation("vllm-a", tokens, [Checkpoint(4 * BS)], cuts=[0, 2 * BS]), kv)
        store.flush()
        dest = CpuBlocks(fp, dst, [0, 2, 5, 6])
        got = store.restore(tokens, dest, max_tokens=4 * BS)
        assert got.tokens == 4 * BS
        for layer in range(L):
            assert np.array_equal(dst[layer][[0, 2, 5, 6]], src[layer][[3, 1, 4, 8]])
        # a byte flipped in the second segment's first page: the first segment only
        seg = sorted(tmp_path.glob("c/strata-conv-*.seg"), key=lambda f: f.stat().st_size)
        raw = bytearray(seg[-1].read_bytes())
        raw[-(2 * BS * fp.token_bytes) + 5] ^= 0xFF
        seg[-1].write_bytes(bytes(raw))
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
    from stratastore.adapters.vllm.pool import Pool

    fp = _fp()
    rng = np.random.default_rng(9)
    pools = [rng.integers(-30000, 30000, (2, NB, BS, H, D), dtype=np.int16) for _ in range(L)]
    pool = Pool.__new__(Pool)  # the paged layout without torch: its arrays as the pool holds them
    pool.fp, pool.cpu, pool.arrays, pool.num_blocks = fp, False, pools, NB
    pages = pool.gather([5, 1], 2)
    dst = [np.zeros_like(p) for p in pools]
    PagedKV(fp, dst, [0, 3]).write_pages(0, 2 * BS, pages, BS)
    for layer in range(L):
        assert np.array_equal(dst[layer][:, [0, 3]], pools[layer][:, [5, 1]])


def test_loadable_leaves_a_token_and_whole_blocks() -> None:
    assert loadable(1000, 361, 128) == 256
    assert loadable(256, 257, 128) == 256
    assert loadable(256, 256, 128) == 128  # never the whole prompt
    assert loadable(0, 500, 16) == 0 and loadable(15, 500, 16) == 0


def test_parks_are_whole_blocks_cut_where_they_resumed() -> None:
    assert saved_tokens(320, 3, 128) == 256
    assert saved_tokens(1000, 2, 128) == 256
    assert save_cuts(512, 256, 128) == (0, 256) and save_cuts(256, 0, 128) == (0,)
    assert save_cuts(256, 256, 128) == (0,)
    assert save_cuts(1000, 384, 128) == (0, 256, 384, 512, 768)
    assert save_cuts(96, 48, 16) == (0, 48) and save_cuts(600, 0, 16) == (0, 256, 512)
    assert save_cuts(1024, 0, 384) == (0, 384, 768)  # a chunk is whole blocks


def test_layer_order_is_by_layer_number() -> None:
    names = [
        "model.layers.10.self_attn.attn",
        "model.layers.2.self_attn.attn",
        "model.layers.0.self_attn.attn",
    ]
    assert layer_order(names) == [names[2], names[1], names[0]]
    with pytest.raises(ConfigError, match="layer number"):
        layer_order(["model.attn"])


def test_store_settings_from_vllms_extra_config(tmp_path: Path) -> None:
    cfg, said = store_config(None)
    assert cfg.cold_dir == default_store_dir() and cfg.page_resume and cfg.park == "disk"
    assert "default store" in said
    cfg, _ = store_config({"strata": {"cold_dir": str(tmp_path), "cold_mib": 8}})
    assert cfg.cold_dir == str(tmp_path) and cfg.cold_mib == 8 and cfg.page_resume
    toml = tmp_path / "strata.toml"
    toml.write_text(f'cold_dir = "{tmp_path}"\ncold_mib = 4\n')
    cfg, said = store_config({"strata_config": str(toml)})
    assert cfg.cold_mib == 4 and str(toml) in said
    assert default_store_dir({"XDG_CACHE_HOME": "/x"}) == "/x/stratastore/vllm"
    for bad, match in (
        ({"strata": {}, "strata_config": "f"}, "not both"),
        ({"strata": [1]}, "mapping"),
        ({"strata_config": 3}, "TOML"),
        ({"strata": {"cold_mib": "lots"}}, "cold_mib"),
    ):
        with pytest.raises(ConfigError, match=match):
            store_config(bad)


def test_the_fingerprint_names_the_model_and_its_backend() -> None:
    a = fingerprint(
        "m",
        "r1",
        {"x": 1},
        n_layers=2,
        n_kv_heads=2,
        head_dim=8,
        block_size=16,
        dtype="bfloat16",
        backend="cpu/vec",
    )
    same = fingerprint(
        "m",
        "r1",
        {"x": 1},
        n_layers=2,
        n_kv_heads=2,
        head_dim=8,
        block_size=16,
        dtype="torch.bfloat16",
        backend="cpu/vec",
    )
    assert a == same
    for other in ({"backend": "cpu/amx"}, {"hf": {"x": 2}}, {"rev": "r2"}):
        b = fingerprint(
            "m",
            other.get("rev", "r1"),
            other.get("hf", {"x": 1}),
            n_layers=2,
            n_kv_heads=2,
            head_dim=8,
            block_size=16,
            dtype="bfloat16",
            backend=other.get("backend", "cpu/vec"),
        )
        assert b != a
    with pytest.raises(ConfigError, match="dtype"):
        fingerprint(
            "m",
            None,
            {},
            n_layers=2,
            n_kv_heads=2,
            head_dim=8,
            block_size=16,
            dtype="torch.complex64",
        )
