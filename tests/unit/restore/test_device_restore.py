"""A restore straight into device memory, validated on the device, run in numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1, set by tests/conftest.py).

Every case is run twice on the same image, through the host path (staged, ``read_direct=False``:
the same two passes) and through the device path, and the two must agree bit for bit: the
outcome (tokens, first bad token, damaged segments) and every byte of the destination, past the
prefix included (the old bytes, or zeros where validated pages were taken back; never a byte of
a page past the first bad one). Damage: a flipped byte in the first, a middle and the last page,
a truncated file, a missing segment; RAW and compressed segments."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from numba import cuda

import numba_kernels
from stratastore import Store
from stratastore.format import Codec, data_name
from stratastore.levels.local import SegmentStore
from stratastore.restore import (
    DestinationRefused,
    DeviceFlatKV,
    DeviceLayerKV,
    DevicePagedKV,
    FlatKV,
    LayerKV,
    PagedKV,
    Piece,
    two_pass_restore,
)
from stratastore.restore import two_pass as two_pass_module
from tests.conftest import CudaInterface, conversation_kv, writer_held
from tests.unit.restore.test_restore_safety import BLOCK, FP, PT, TABLE, TB, make_image, page_floor

SENTINEL = 0xEE
KINDS = ["flat", "layer", "paged"]


def host_and_device(kind: str, n: int) -> tuple[Any, Any, Any, Any]:
    """A host destination of ``kind`` (staged) and its device twin, both filled with SENTINEL
    bytes, and what each fills (host arrays; device arrays)."""
    if kind == "layer":
        shape = (n, FP.n_kv_heads, FP.head_dim)
        k = [
            np.full(shape, SENTINEL * 0x101, np.uint16).view(np.float16) for _ in range(FP.n_layers)
        ]
        v = [
            np.full(shape, SENTINEL * 0x101, np.uint16).view(np.float16) for _ in range(FP.n_layers)
        ]
        dk, dv = [cuda.to_device(a) for a in k], [cuda.to_device(a) for a in v]
        return LayerKV(FP, k, v, read_direct=False), [*k, *v], DeviceLayerKV(FP, dk, dv), [*dk, *dv]
    if kind == "paged":
        shape = (2, 11, BLOCK, FP.n_kv_heads, FP.head_dim)
        pools = [np.full(shape, SENTINEL * 0x101, np.uint16) for _ in range(FP.n_layers)]
        dpools = [cuda.to_device(p) for p in pools]
        return (
            PagedKV(FP, pools, TABLE, read_direct=False),
            pools,
            DevicePagedKV(FP, dpools, TABLE),
            dpools,
        )
    out = np.full(n * TB, SENTINEL, np.uint8)
    dout = cuda.to_device(out)
    return FlatKV(FP, out, read_direct=False), [out], DeviceFlatKV(FP, dout), [dout]


def as_bytes(arrays: list[Any]) -> list[npt.NDArray[np.uint8]]:
    return [
        (a.copy_to_host() if hasattr(a, "copy_to_host") else a).view(np.uint8).reshape(-1)
        for a in arrays
    ]


def flip(store: SegmentStore, key: bytes, offset: int) -> None:
    path = Path(store.path) / data_name(key)
    raw = bytearray(path.read_bytes())
    raw[4096 + offset] ^= 0x10
    path.write_bytes(bytes(raw))


# seg 2 holds tokens [42, 64): pages of 4 tokens, its last (page 5) short
DAMAGE = ["none", "first-page", "middle-page", "last-page", "truncated", "missing"]


def damage(store: SegmentStore, pieces: list[Piece], how: str) -> list[Piece]:
    if how == "first-page":
        flip(store, pieces[0].key, 5)
    elif how == "middle-page":
        flip(store, pieces[1].key, 2 * PT * TB + 9)
    elif how == "last-page":
        flip(store, pieces[2].key, 5 * PT * TB + 3)
    elif how == "truncated":
        path = Path(store.path) / data_name(pieces[1].key)
        path.write_bytes(path.read_bytes()[:-10])
    elif how == "missing":
        return [pieces[0], Piece(20, 42, pieces[1].key, None), pieces[2]]
    return pieces


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize("kind", KINDS)
def test_a_device_restore_is_bit_exact_with_the_host_path(
    tmp_path: Path, kind: str, how: str
) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, kv = make_image(store)
        pieces = damage(store, pieces, how)
        host, host_arrays, dev, dev_arrays = host_and_device(kind, 64)
        kw: dict[str, Any] = {"resume_at": page_floor, "chunk_bytes": 2 * PT * TB}
        want = two_pass_restore(pieces, 64, host, FP, **kw)
        got = two_pass_restore(pieces, 64, dev, FP, **kw)
        assert (got.tokens, got.first_bad, got.damaged) == (
            want.tokens,
            want.first_bad,
            want.damaged,
        )
        expected = {
            "none": (64, None),
            "first-page": (0, 0),
            "middle-page": (28, 28),
            "last-page": (62, 62),
            "truncated": (20, 20),
            "missing": (20, 20),
        }
        assert (got.tokens, got.first_bad) == expected[how]
        for h, d in zip(as_bytes(host_arrays), as_bytes(dev_arrays), strict=True):
            assert np.array_equal(h, d)
        if kind == "flat":  # past the prefix: old bytes or zeros, never the image's
            out = as_bytes(dev_arrays)[0]
            assert np.array_equal(out[: got.tokens * TB], kv[: got.tokens * TB])
            assert np.isin(out[got.tokens * TB :], [0, SENTINEL]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_compressed_segments_restore_to_the_device(tmp_path: Path, kind: str) -> None:
    with SegmentStore.open(tmp_path / "z", FP) as store:
        pieces, _ = make_image(store, Codec.ZSTD)
        flip(store, pieces[1].key, 0)  # a compressed frame: decoding or hashing fails
        host, host_arrays, dev, dev_arrays = host_and_device(kind, 64)
        want = two_pass_restore(pieces, 61, host, FP, resume_at=page_floor)
        got = two_pass_restore(pieces, 61, dev, FP, resume_at=page_floor)
        assert (got.tokens, got.first_bad) == (want.tokens, want.first_bad) == (20, 20)
        for h, d in zip(as_bytes(host_arrays), as_bytes(dev_arrays), strict=True):
            assert np.array_equal(h, d)


def test_the_host_never_hashes_on_the_device_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def host_hash(*_: object, **__: object) -> None:
        raise AssertionError("the host hashed a page of a device restore")

    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, _kv = make_image(store)
        flip(store, pieces[2].key, 9)
        for name in ("hash_page", "page_hashes", "start_page_hashes"):
            monkeypatch.setattr(numba_kernels, name, host_hash)
        for name in ("start_hashed", "start_scattered"):
            monkeypatch.setattr(two_pass_module, name, host_hash)
        _, _, dev, _arrays = host_and_device("layer", 64)
        o = two_pass_restore(pieces, 64, dev, FP, resume_at=page_floor, chunk_bytes=3 * PT * TB)
        assert (o.tokens, o.first_bad) == (42, 42)


# -- through the Store -----------------------------------------------------------------------
def disk_cfg(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, **kw}


def device_layer(n: int) -> tuple[DeviceLayerKV, list[Any]]:
    shape = (n, FP.n_kv_heads, FP.head_dim)
    arrays = [cuda.to_device(np.zeros(shape, np.float16)) for _ in range(2 * FP.n_layers)]
    return DeviceLayerKV(FP, arrays[: FP.n_layers], arrays[FP.n_layers :]), arrays


def layer_bytes(kv: npt.NDArray[np.uint8], n: int, cuts: list[int]) -> list[npt.NDArray[Any]]:
    """What a LayerKV of ``n`` tokens holds after a restore of ``kv`` (host path)."""
    k = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(FP.n_layers)]
    v = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(FP.n_layers)]
    dest = LayerKV(FP, k, v)
    for a, b in itertools.pairwise([*cuts, len(kv) // TB]):
        dest.write_pages(a, b - a, kv[a * TB : b * TB], PT)
    return [x.view(np.uint8).reshape(-1) for x in (*k, *v)]


def test_store_restores_disk_ram_and_pending_parks_into_device_memory(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        a, kva = conversation_kv("a", 40, 0)
        store.park(a, kva.copy())
        store.flush()
        prompt = np.concatenate([a.tokens, [9, 9]])
        flat = cuda.to_device(np.zeros(42 * TB, np.uint8))
        r = store.restore(prompt, flat)
        assert (r.source, r.tokens) == ("disk", 40)
        assert np.array_equal(flat.copy_to_host()[: 40 * TB], kva)
        dest, arrays = device_layer(42)
        r = store.restore(prompt, dest)
        assert (r.source, r.tokens) == ("disk", 40)
        assert all(
            np.array_equal(x.copy_to_host().view(np.uint8).reshape(-1)[: w.size], w)
            for x, w in zip(arrays, layer_bytes(kva, 40, a.cuts), strict=True)
        )
        b, kvb = conversation_kv("b", 24, 500)
        with writer_held(store) as entered:  # b's write is in flight: served from its capture
            store.park(b, kvb.copy())
            assert entered.wait(30)
            out = cuda.to_device(np.zeros(24 * TB, np.uint8))
            r = store.restore(b.tokens, out)
            assert (r.source, r.tokens) == ("pending", 24)
            assert np.array_equal(out.copy_to_host(), kvb)
    with Store.open(FP, {"ram_mib": 8, "park": "ram"}) as store:
        c, kvc = conversation_kv("c", 20, 900)
        store.park(c, kvc.copy())
        dest, arrays = device_layer(20)
        many = store.restore_many([(c.tokens, dest), (c.tokens, np.zeros(20 * TB, np.uint8))])
        assert next((m.source, m.tokens) for m in many) == ("ram", 20)
        assert all(
            np.array_equal(x.copy_to_host().view(np.uint8).reshape(-1), w)
            for x, w in zip(arrays, layer_bytes(kvc, 20, c.cuts), strict=True)
        )


def test_restore_many_mixes_device_and_host_destinations(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        convs = [conversation_kv(f"c{i}", 24, 100 * i) for i in range(3)]
        for conv, kv in convs:
            store.park(conv, kv.copy())
        store.flush()
        outs = [
            cuda.to_device(np.zeros(24 * TB, np.uint8)),
            np.zeros(24 * TB, np.uint8),
            cuda.to_device(np.zeros(24 * TB, np.uint8)),
        ]
        pairs = zip(convs, outs, strict=True)
        got = store.restore_many([(conv.tokens, out) for (conv, _), out in pairs])
        assert [(g.source, g.tokens) for g in got] == [("disk", 24)] * 3
        for (_, kv), out in zip(convs, outs, strict=True):
            host = out.copy_to_host() if hasattr(out, "copy_to_host") else out
            assert np.array_equal(host, kv)


# -- refusals, before anything is read ---------------------------------------------------------
def test_an_object_with_the_cuda_array_interface_is_restored_into(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        a, kva = conversation_kv("a", 16, 0)
        store.park(a, kva.copy())
        store.flush()
        mem = CudaInterface(cuda.to_device(np.zeros(16 * TB, np.uint8)))
        assert store.restore(a.tokens, mem).tokens == 16
        assert np.array_equal(mem.host(), kva)
        k = [
            CudaInterface(cuda.to_device(np.zeros((16, FP.n_kv_heads, FP.head_dim), np.float16)))
            for _ in range(4)
        ]
        dest = DeviceLayerKV(FP, k[:2], k[2:])
        assert store.restore(a.tokens, dest).tokens == 16
        assert all(
            np.array_equal(x.host().view(np.uint8).reshape(-1), w)
            for x, w in zip(k, layer_bytes(kva, 16, a.cuts), strict=True)
        )


def test_device_destinations_that_cannot_be_written_in_place_are_refused() -> None:
    shape = (8, FP.n_kv_heads, FP.head_dim)
    with pytest.raises(DestinationRefused, match="C-contiguous"):
        DeviceFlatKV(FP, cuda.to_device(np.zeros((8, 2 * TB), np.uint8))[:, :TB])
    with pytest.raises(DestinationRefused, match="read-only"):
        dev = cuda.to_device(np.zeros(8 * TB, np.uint8))
        ptr = CudaInterface(dev).__cuda_array_interface__["data"][0]
        DeviceFlatKV(FP, CudaInterface(dev, data=(ptr, True)))
    with pytest.raises(DestinationRefused, match="not device memory"):
        DeviceLayerKV(FP, [np.zeros(shape, np.float16)] * 2, [np.zeros(shape, np.float16)] * 2)
    wrong = [
        cuda.to_device(np.zeros((8, 2 * FP.n_kv_heads, FP.head_dim), np.float16)) for _ in range(4)
    ]
    with pytest.raises(DestinationRefused, match="wrong offset"):
        DeviceLayerKV(FP, wrong[:2], wrong[2:])
    one = cuda.to_device(np.zeros(shape, np.float16))
    others = [cuda.to_device(np.zeros(shape, np.float16)) for _ in range(2)]
    with pytest.raises(DestinationRefused, match="overlaps"):
        DeviceLayerKV(FP, [one, others[0]], [one, others[1]])
    pools = [
        cuda.to_device(np.zeros((2, 4, BLOCK, FP.n_kv_heads, FP.head_dim), np.uint16))
        for _ in range(FP.n_layers)
    ]
    with pytest.raises(DestinationRefused, match="block 4"):
        DevicePagedKV(FP, pools, [0, 4])
    with pytest.raises(DestinationRefused, match="twice"):
        DevicePagedKV(FP, pools, [1, 1])


def test_a_device_destination_too_small_is_refused_before_the_restore(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        a, kva = conversation_kv("a", 16, 0)
        store.park(a, kva.copy())
        store.flush()
        with pytest.raises(DestinationRefused, match="holds 8 tokens"):
            store.restore(a.tokens, cuda.to_device(np.zeros(8 * TB, np.uint8)))
        assert store.lookup(a.tokens) == ("disk", 16)
