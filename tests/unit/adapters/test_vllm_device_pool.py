"""The vLLM connector's worker side on CUDA caches, without vLLM and without a GPU: numba's CUDA
simulator (tests/conftest.py), the caches given only through ``__cuda_array_interface__`` (the
route a torch CUDA tensor takes), in FlashAttention's ``[2, blocks, block_size, heads, dim]``
and FlashInfer's ``[blocks, 2, block_size, heads, dim]``.

Every case runs the same requests on a host pool (numpy arrays, the host path) and on a
device pool holding the same bytes, and the two must agree bit for bit: what a park stores
(the segment files a restore reads back), what a load writes into the request's blocks, what a
load leaves alone (vLLM's own prefix and every other block), and, with a flipped byte in a
stored page, where the ladder stops and which blocks the load reports for vLLM to recompute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numba import cuda

from stratastore import ModelFingerprint, Store
from stratastore.adapters.vllm.loader import Loader
from stratastore.adapters.vllm.plan import LoadJob, SaveJob, conversation_id, save_cuts
from stratastore.adapters.vllm.pool import Pool
from stratastore.adapters.vllm.saver import Saver
from stratastore.adapters.vllm.tally import Tally
from stratastore.errors import ConfigError
from stratastore.format.naming import DATA_SUFFIX, PREFIX
from tests.conftest import CudaInterface

P, BS, H, D, L, NB = 16, 32, 2, 8, 2, 10  #: pages of 16 in blocks of 32 (2 pages a block)
SEALED_AT = 216  #: a sidecar's sealed_at_ns (spec F-SC-1)
PAYLOAD = 4096  #: where a segment file's pages start (its data_offset, spec F-SEG-3)


def _fp() -> ModelFingerprint:
    return ModelFingerprint.create(
        "tiny", n_layers=L, n_kv_heads=H, head_dim=D, page_tokens=P, dtype="bfloat16"
    )


def _shape(kv_first: bool) -> tuple[int, ...]:
    return (2, NB, BS, H, D) if kv_first else (NB, 2, BS, H, D)


def _caches(seed: int, kv_first: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        f"model.layers.{i}.self_attn.attn": rng.integers(
            -30000, 30000, _shape(kv_first), dtype=np.int16
        )
        for i in range(L)
    }


class _Pools:
    """The same caches as a host pool and as a device pool (simulated device memory)."""

    def __init__(self, caches: dict[str, np.ndarray], kv_first: bool) -> None:
        fp = _fp()
        self.host_arrays = {n: a.copy() for n, a in caches.items()}
        self.dev_arrays = {n: cuda.to_device(a) for n, a in caches.items()}
        self.host = Pool(fp, self.host_arrays, BS)
        self.device = Pool(fp, {n: CudaInterface(d) for n, d in self.dev_arrays.items()}, BS)
        assert (self.host.device, self.device.device) == (False, True)
        assert self.host.kv_first == self.device.kv_first == kv_first

    def same(self) -> bool:
        return all(
            np.array_equal(self.host_arrays[n], d.copy_to_host())
            for n, d in self.dev_arrays.items()
        )

    def blocks(self, ids: list[int], kv_first: bool) -> list[np.ndarray]:
        """Blocks ``ids`` of every layer, from the host pool and the device pool."""
        out = []
        for n, d in self.dev_arrays.items():
            for a in (self.host_arrays[n], d.copy_to_host()):
                out.append(a[:, ids] if kv_first else a[ids])
        return out


def _open(dir: Path) -> Store:
    cfg = {"ram_mib": 0, "park": "disk", "page_resume": True, "cold_dir": str(dir)}
    return Store.open(_fp(), {**cfg, "cold_mib": 64})


def _park(store: Store, pool: Pool, prompt: np.ndarray, n: int, ids: list[int]) -> None:
    """A prompt's pages parked as the worker parks them: copied in the step (the request runs
    on), then the finished request's from its held blocks."""
    saver = Saver(store, pool, Tally())
    half = n // 2 - (n // 2) % P
    cid = conversation_id(prompt, "r")
    first = SaveJob("r", cid, prompt[:half], tuple(ids), save_cuts(half, P), held=False)
    saver.submit(first, pool.copy(ids, half))
    saver.submit(SaveJob("r", cid, prompt[:n], tuple(ids), save_cuts(n, P, half)))
    saver.close()
    assert saver.finished() == {"r"}
    assert saver.tally.snapshot()["parks"] == 2


def _load(store: Store, pool: Pool, job: LoadJob) -> set[int]:
    loader = Loader(store, pool, Tally(), BS)
    loader.start([job])
    loader.wait()
    errors = loader.errors()
    loader.close()
    return errors


@pytest.mark.parametrize("kv_first", [True, False], ids=["flash_attn", "flashinfer"])
def test_a_device_pool_parks_and_loads_what_the_host_pool_does(
    tmp_path: Path, kv_first: bool
) -> None:
    src = _Pools(_caches(1, kv_first), kv_first)
    prompt = np.arange(5, 5 + 4 * BS + 7, dtype=np.uint32)
    n = 4 * BS  # 8 pages over blocks 7, 2, 9, 4
    ids = [7, 2, 9, 4]
    stores = {}
    for side, pool in (("host", src.host), ("device", src.device)):
        store = _open(tmp_path / side)
        _park(store, pool, prompt, n, ids)
        store.close()
        stores[side] = tmp_path / side
    # the segments and their sidecars (a chain's manifest holds its own times)
    host_files = sorted(p.name for p in stores["host"].glob(f"{PREFIX}*"))
    dev_files = sorted(p.name for p in stores["device"].glob(f"{PREFIX}*"))
    assert host_files == dev_files and host_files  # content keys: the same segments
    for name in host_files:
        a, b = ((stores[s] / name).read_bytes() for s in ("host", "device"))
        if name.endswith(DATA_SUFFIX):
            assert a == b, name
        else:  # a sidecar: the same but when it was sealed (and so its trailer)
            same = a[:SEALED_AT] + a[SEALED_AT + 8 : -32]
            assert same == b[:SEALED_AT] + b[SEALED_AT + 8 : -32], name

    # a load of 5 pages (a block and a half past vLLM's own first block) into other blocks
    dst, before = _Pools(_caches(2, kv_first), kv_first), _caches(2, kv_first)
    job = LoadJob("r2", prompt[: 5 * P], (3, 0, 8), BS)  # vLLM holds the first block itself
    for pool in (dst.host, dst.device):
        store = _open(stores["host"])
        assert _load(store, pool, job) == set()
        store.close()
    assert dst.same()
    for name, got in dst.host_arrays.items():
        old, want = before[name], src.host_arrays[name]
        blk = _block(kv_first)
        assert np.array_equal(blk(got, 3), blk(old, 3))  # vLLM's own block: never written
        assert np.array_equal(blk(got, 0), blk(want, 2))  # the second block: loaded
        assert np.array_equal(blk(got, 8)[:, :P], blk(want, 9)[:, :P])  # the third's 1st page
        assert np.array_equal(blk(got, 8)[:, P:], blk(old, 8)[:, P:])  # not the rest of it
        for i in set(range(NB)) - {0, 8}:
            assert np.array_equal(blk(got, i), blk(old, i))


def _block(kv_first: bool) -> Any:
    """Block ``i`` of a layer's cache as ``[2, block_size, heads, dim]``."""
    return (lambda a, i: a[:, i]) if kv_first else (lambda a, i: a[i])


@pytest.mark.parametrize("kv_first", [True, False], ids=["flash_attn", "flashinfer"])
def test_a_flipped_byte_stops_both_loads_at_the_same_page(tmp_path: Path, kv_first: bool) -> None:
    src = _Pools(_caches(3, kv_first), kv_first)
    prompt = np.arange(9, 9 + 4 * BS + 3, dtype=np.uint32)
    ids = [1, 5, 6, 2]
    store = _open(tmp_path / "whole")
    _park(store, src.host, prompt, 4 * BS, ids)  # segments [0, 64) and [64, 128)
    store.close()
    first = _open(tmp_path / "first")
    _park(first, src.host, prompt, 2 * BS, ids)  # [0, 32) and [32, 64): cut otherwise
    first.close()
    whole = {p.name for p in (tmp_path / "whole").glob(f"*{DATA_SUFFIX}")}
    assert len(whole) == 2
    # the second segment is the file that holds tokens 64..127: find it by restoring with
    # each file in turn damaged and seeing where the load stops is circular, so by content:
    # its payload starts with the stored page of tokens 64..79
    page = src.host.copy(ids, 4 * BS)[4 * P * _fp().token_bytes :][: _fp().page_bytes]
    [second] = [n for n in whole if _payload(tmp_path / "whole" / n)[: page.size] == page.tobytes()]
    path = tmp_path / "whole" / second
    raw = bytearray(path.read_bytes())
    raw[PAYLOAD + _fp().page_bytes + 5] ^= 0x40  # its second page: tokens 80..95
    path.write_bytes(bytes(raw))
    dst, before = _Pools(_caches(4, kv_first), kv_first), _caches(4, kv_first)
    job = LoadJob("r3", prompt[: 4 * BS], (4, 8, 0, 3), 0)
    errors = {}
    for side, pool in (("host", dst.host), ("device", dst.device)):
        s = _open(tmp_path / "whole")
        errors[side] = _load(s, pool, job)
        s.close()
    assert errors["host"] == errors["device"] == {0, 3}  # tokens 80.. : blocks 3 and 4 of it
    blk = _block(kv_first)
    for name, old in before.items():
        want = src.host_arrays[name]
        for got in (dst.host_arrays[name], dst.dev_arrays[name].copy_to_host()):
            assert np.array_equal(blk(got, 4), blk(want, 1))  # tokens 0..31
            assert np.array_equal(blk(got, 8), blk(want, 5))  # 32..63
            assert np.array_equal(blk(got, 0)[:, :P], blk(want, 6)[:, :P])  # 64..79
            # past the stop: the old bytes, or zeros where a page was read and taken back;
            # never a byte of the damaged page or past it
            for part, was in ((blk(got, 0)[:, P:], blk(old, 0)[:, P:]), (blk(got, 3), blk(old, 3))):
                assert np.array_equal(part, was) or not part.any()
            rest = [i for i in range(NB) if i not in (4, 8, 0, 3)]
            assert all(np.array_equal(blk(got, i), blk(old, i)) for i in rest)


def _payload(path: Path) -> bytes:
    return path.read_bytes()[PAYLOAD:]


def test_a_device_cache_of_another_shape_or_items_is_refused_by_name() -> None:
    fp = _fp()
    names = [f"model.layers.{i}.self_attn.attn" for i in range(L)]
    bad = {n: cuda.to_device(np.zeros((NB, 3, BS, H, D), np.int16)) for n in names}
    with pytest.raises(ConfigError, match=r"FlashInfer"):
        Pool(fp, {n: CudaInterface(d) for n, d in bad.items()}, BS)
    wide = {n: cuda.to_device(np.zeros(_shape(True), np.int32)) for n in bad}
    with pytest.raises(ConfigError, match="2-byte items"):
        Pool(fp, {n: CudaInterface(d) for n, d in wide.items()}, BS)
