"""Torch tensors in host memory are restore destinations and park sources as they are, the way
an engine keeps its K/V (vLLM's per-layer pools, a contiguous cache): ``PagedKV``, ``LayerKV`` and
``Store.restore(prompt, tensor)`` write the tensor's own memory (bfloat16 through an integer view
of its item size), never a copy; a tensor that cannot be written in place, or one on a device, is
refused by name before anything is read. Needs torch (the ``transformers`` or ``lmcache`` extra);
skipped with that reason without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXTRA = "needs torch: pip install -e '.[transformers]' (or the lmcache extra)"
torch = pytest.importorskip("torch", reason=EXTRA)

from stratastore import Store  # noqa: E402
from stratastore.chain import Checkpoint, Conversation  # noqa: E402
from stratastore.format import ModelFingerprint  # noqa: E402
from stratastore.restore import DestinationRefused, LayerKV, PagedKV, pack_pages  # noqa: E402

FP = ModelFingerprint.create("torch-pool", n_layers=3, n_kv_heads=2, head_dim=8, page_tokens=4)
BS, BLOCKS, N = FP.page_tokens, 40, 117  # 30 blocks for 117 tokens, the last one short


def _pools(seed: int) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    shape = (2, BLOCKS, BS, FP.n_kv_heads, FP.head_dim)
    return [torch.randn(shape, generator=g, dtype=torch.bfloat16) for _ in range(FP.n_layers)]


def _tokens(pools: list[Any], table: Any) -> list[Any]:
    """Each layer's [2, N, heads, dim] K/V in token order, read through the block table."""
    return [p[:, table.long()].reshape(2, -1, FP.n_kv_heads, FP.head_dim)[:, :N] for p in pools]


def _store(tmp_path: Path) -> Store:
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    return Store.open(FP, cfg)


def _parked(tmp_path: Path) -> tuple[Store, list[Any]]:
    pools, table = _pools(1), torch.randperm(BLOCKS, dtype=torch.int32)[:30]
    want = [t.clone() for t in _tokens(pools, table)]
    store = _store(tmp_path)
    conv = Conversation("c", np.arange(N, dtype=np.uint32), [Checkpoint(N)], cuts=[0])
    report = store.park(conv, PagedKV(FP, pools, table))  # streamed from the tensors' memory
    assert (report.where, report.tokens) == ("disk", N)
    for p in pools:
        p.zero_()  # the engine reuses its blocks once park returns
    store.flush()
    return store, want


def test_paged_bfloat16_pools_park_and_restore_bit_for_bit(tmp_path: Path) -> None:
    store, want = _parked(tmp_path)
    with store:
        back = [torch.zeros_like(p) for p in _pools(0)]
        table = torch.randperm(BLOCKS, dtype=torch.int64)[:30]
        got = store.restore(np.arange(N, dtype=np.uint32), PagedKV(FP, back, table))
        assert (got.tokens, got.source) == (N, "disk")
        for b, w in zip(_tokens(back, table), want, strict=True):
            assert torch.equal(b.view(torch.int16), w.view(torch.int16))


def test_layer_tensors_and_a_flat_tensor_are_written_in_place(tmp_path: Path) -> None:
    store, want = _parked(tmp_path)
    with store:
        shape = (N + 7, FP.n_kv_heads, FP.head_dim)
        k = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(FP.n_layers)]
        v = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(FP.n_layers)]
        ptrs = [t.data_ptr() for t in k + v]
        assert store.restore(np.arange(N, dtype=np.uint32), LayerKV(FP, k, v)).tokens == N
        assert [t.data_ptr() for t in k + v] == ptrs
        for layer, w in enumerate(want):
            assert torch.equal(k[layer][:N].view(torch.int16), w[0].view(torch.int16))
            assert torch.equal(v[layer][:N].view(torch.int16), w[1].view(torch.int16))
            assert not k[layer][N:].any()

        flat = torch.zeros(N * FP.token_bytes, dtype=torch.uint8)
        assert store.restore(np.arange(N, dtype=np.uint32), flat).tokens == N
        ks = [w[0].view(torch.int16).numpy() for w in want]
        vs = [w[1].view(torch.int16).numpy() for w in want]
        assert np.array_equal(flat.numpy(), pack_pages(FP, ks, vs, N, [0]))  # the stored layout


def test_tensors_that_cannot_be_written_in_place_are_refused_by_name(tmp_path: Path) -> None:
    pools, table = _pools(2), list(range(30))
    with pytest.raises(DestinationRefused, match=r"PagedKV pool\[0\] is not contiguous"):
        PagedKV(FP, [p[:, ::2] for p in pools], table)
    with pytest.raises(DestinationRefused, match=r"pool\[1\] is a torch tensor on meta.*Device"):
        PagedKV(FP, [pools[0], pools[1].to("meta"), pools[2]], table)
    meta_out = r"out is a torch tensor on meta"
    with _store(tmp_path) as store, pytest.raises(DestinationRefused, match=meta_out):
        store.restore([1, 2, 3], torch.empty(64, dtype=torch.uint8, device="meta"))


def test_a_parameter_a_stacked_pool_and_a_flat_tensor_park(tmp_path: Path) -> None:
    """A tensor subclass is a tensor; one tensor stacked over the layers is the list of its
    layers; a flat tensor in the stored layout parks as a numpy array would."""
    store, want = _parked(tmp_path)
    with store:
        stacked = torch.zeros((FP.n_layers, 2, BLOCKS, BS, FP.n_kv_heads, FP.head_dim))
        stacked = torch.nn.Parameter(stacked.to(torch.bfloat16), requires_grad=True)
        table = torch.arange(30)
        got = store.restore(np.arange(N, dtype=np.uint32), PagedKV(FP, stacked, table))
        assert got.tokens == N
        for b, w in zip(_tokens(list(stacked.detach()), table), want, strict=True):
            assert torch.equal(b.view(torch.int16), w.view(torch.int16))

        flat = torch.zeros(N * FP.token_bytes, dtype=torch.uint8)
        store.restore(np.arange(N, dtype=np.uint32), flat)
        conv = Conversation("flat", np.arange(N, dtype=np.uint32) + 10**6, [Checkpoint(N)])
        assert store.park(conv, flat.clone()).where == "disk"
        again = torch.zeros_like(flat)
        assert store.restore(conv.tokens, again).tokens == N
        assert torch.equal(again, flat)


def test_tensors_numpy_cannot_view_are_refused_not_copied(tmp_path: Path) -> None:
    conj = torch.zeros(64, dtype=torch.complex64).conj()  # a lazy conjugate: no plain memory
    with _store(tmp_path) as store, pytest.raises(DestinationRefused, match="cannot be viewed"):
        store.restore([1, 2, 3], conj)
    grad_table = torch.arange(30, dtype=torch.float32).requires_grad_()
    with pytest.raises(DestinationRefused, match="block table"):
        PagedKV(FP, _pools(3), grad_table)
    with pytest.raises(DestinationRefused, match="list of per-layer arrays"):
        PagedKV(FP, None, list(range(30)))  # type: ignore[arg-type]
