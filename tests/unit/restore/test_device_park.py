"""``Store.park`` from device memory (numba's CUDA simulator here, the same tests on a real device
in ``tools/gpu_check.sh``). The pages are hashed on the device, the K/V is copied to the host once,
and the sidecars carry the device's digests: the host never hashes the capture, whether it is
written at once (``park = disk``), mirrored, evicted or written down on close. Tiny sizes: the
simulator hashes some 20 KB/s."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import numpy.typing as npt
import pytest

import numba_kernels
import numba_kernels.cpu
import numba_kernels.cuda
from stratastore import Store
from stratastore.chain import Conversation
from stratastore.format import Codec
from stratastore.levels.local import SegmentStore, StoreError
from stratastore.restore.device_arrays import is_device_array
from stratastore.tiers.records import InvalidConversation
from tests.conftest import CudaInterface, conversation_kv, tiny_fp

FP = tiny_fp()  # 64 bytes a token, 256-byte pages of 4 tokens
N, STEP = 24, 8  # three segments of two pages each: 1.5 KB to hash on the simulated device


def _device(host: npt.NDArray[Any]) -> Any:
    from numba import cuda

    return cuda.to_device(host)


def _conv(cid: str, base: int) -> tuple[Conversation, npt.NDArray[np.uint8], Any]:
    """A conversation, its K/V on the host, and the same K/V on the device as a 2-D fp16 array
    (one row a token), as an engine holds it."""
    conv, kv = conversation_kv(cid, N, base, step=STEP)
    return conv, kv, _device(kv.view(np.float16).reshape(N, -1))


@contextmanager
def host_hashing() -> Iterator[list[str]]:
    """Record every page hash the host computes (the sealing path's and the blake3 package's
    under it); yields the list of what was called."""
    calls: list[str] = []
    mp = pytest.MonkeyPatch()

    def counting(name: str, real: Any) -> Any:
        def f(*a: Any, **kw: Any) -> Any:
            calls.append(name)
            return real(*a, **kw)

        return f

    for name in ("start_page_hashes", "page_hashes", "hash_page"):
        mp.setattr(numba_kernels, name, counting(name, getattr(numba_kernels, name)))
        mp.setattr(numba_kernels.cpu, name, counting(name, getattr(numba_kernels.cpu, name)))

    class Blake3:
        def blake3(self, *a: Any, **kw: Any) -> Any:
            calls.append("blake3")
            return blake3.blake3(*a, **kw)

    mp.setattr(numba_kernels.cpu, "blake3", Blake3())
    try:
        yield calls
    finally:
        mp.undo()


def _disk_cfg(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, **kw}


def _check_sidecars(store: Store, conv: Conversation, kv: npt.NDArray[np.uint8]) -> None:
    """Every segment of ``conv`` is on disk, its sidecar's digests blake3 of its pages."""
    level = store._tiers.levels[0].store
    tb = FP.token_bytes
    for seg in conv.segment_keys(FP.digest()):
        data = kv[seg.start * tb : seg.end * tb]
        want = b"".join(
            blake3.blake3(data[i : i + FP.page_bytes].tobytes()).digest()
            for i in range(0, data.size, FP.page_bytes)
        )
        with level.open_reader(seg.key) as r:
            assert r.sidecar.page_hashes == want


def _restored(store: Store, conv: Conversation, kv: npt.NDArray[np.uint8], source: str) -> None:
    out = np.zeros_like(kv)
    r = store.restore(conv.tokens, out)
    assert (r.source, r.tokens) == (source, N)
    assert np.array_equal(out, kv)


def test_disk_park_is_hashed_on_the_device_and_restores_bit_exact(tmp_path: Path) -> None:
    with Store.open(FP, _disk_cfg(tmp_path)) as store:
        conv, kv, dev = _conv("a", 0)
        with host_hashing() as calls:
            assert store.park(conv, dev).where == "disk"
            store.flush()
        assert calls == []  # the sidecars' digests are the device's
        _check_sidecars(store, conv, kv)
        _restored(store, conv, kv, "disk")
        b, kvb = conversation_kv("b", N, 1000, step=STEP)  # the control: a host park hashes
        with host_hashing() as calls:
            store.park(b, kvb.copy())
            store.flush()
        assert calls


def test_device_park_spilled_on_close_is_not_hashed_again(tmp_path: Path) -> None:
    cfg = {"ram_mib": 1, "spill_on": "evict", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    conv, kv, dev = _conv("a", 0)
    store = Store.open(FP, cfg, probe=lambda: 1 << 40)
    try:
        assert store.park(conv, dev).where == "ram"
        _restored(store, conv, kv, "ram")  # a restore of the whole takes it out: park it again
        conv, kv, dev = _conv("a", 0)
        assert store.park(conv, dev).where == "ram"
        assert store.describe().levels[0].entries == 0  # RAM only, until close
    finally:
        with host_hashing() as calls:
            store.close()
    assert calls == []
    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        _check_sidecars(store, conv, kv)
        _restored(store, conv, kv, "disk")


def test_device_park_mirrored_and_evicted_is_not_hashed_again(tmp_path: Path) -> None:
    free = lambda: 1 << 40  # noqa: E731
    mirror = {"ram_mib": 1, "cold_dir": str(tmp_path / "m"), "cold_mib": 64}  # spill_on = park
    with Store.open(FP, mirror, probe=free) as store:
        conv, kv, dev = _conv("a", 0)
        with host_hashing() as calls:
            assert store.park(conv, dev).where == "ram"
            store.flush()
        assert calls == []
        _check_sidecars(store, conv, kv)
    evict = {
        "ram_mib": 1,
        "slots": 1,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "e"),
        "cold_mib": 64,
    }
    with Store.open(FP, evict, probe=free) as store:
        conv, kv, dev = _conv("a", 0)
        b, _, devb = _conv("b", 1000)
        with host_hashing() as calls:
            store.park(conv, dev)
            store.park(b, devb)  # one slot: "a" is evicted, and written down
            store.flush()
        assert store.stats()["levels"]["ram"]["evictions"] >= 1 and calls == []
        _check_sidecars(store, conv, kv)
        _restored(store, conv, kv, "disk")


def test_an_object_with_only_the_cuda_array_interface_is_parked(tmp_path: Path) -> None:
    with Store.open(FP, _disk_cfg(tmp_path)) as store:
        conv, kv, dev = _conv("a", 0)
        obj = CudaInterface(dev)
        assert is_device_array(obj) and not hasattr(obj, "copy_to_host")
        with host_hashing() as calls:
            assert store.park(conv, obj).where == "disk"
            store.flush()
        assert calls == []
        _check_sidecars(store, conv, kv)
        _restored(store, conv, kv, "disk")


def test_bad_device_arrays_are_refused_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[int] = []
    real = numba_kernels.cuda.page_hashes_device
    monkeypatch.setattr(
        numba_kernels.cuda,
        "page_hashes_device",
        lambda *a, **kw: launched.append(1) or real(*a, **kw),
    )
    with Store.open(FP, _disk_cfg(tmp_path)) as store:
        conv, kv = conversation_kv("a", N, 0, step=STEP)
        wide = np.zeros((N, 2 * FP.token_bytes), np.uint8)
        strided = CudaInterface(
            _device(wide), shape=(N, FP.token_bytes), strides=(2 * FP.token_bytes, 1)
        )
        bad = {
            "wrong size": (_device(kv[: -FP.token_bytes]), "K/V is 1472 bytes"),
            # the right count of items of the wrong dtype: twice the bytes
            "wrong dtype": (_device(np.zeros(kv.size // 2, np.float32)), "K/V is 3072 bytes"),
            "not C-contiguous": (_device(wide)[:, ::2], "not C-contiguous"),
            "strided interface": (strided, "not C-contiguous"),
            "unreadable interface": (
                CudaInterface(_device(kv), typestr="<x9"),
                "numba cannot read",
            ),
        }
        for what, (arr, message) in bad.items():
            with pytest.raises(InvalidConversation, match=message):
                store.park(conv, arr)
            assert launched == [], what  # refused before the device hashed anything
        store.flush()
        s = store.stats()
        assert s["parks_disk"] == s["parks_ram"] == s["discards"] == 0
        assert store.describe().levels[0].entries == 0
        # a bad conversation is refused before the device runs too
        conv.cuts = [0, N + 4]
        with pytest.raises(InvalidConversation, match="segment cuts"):
            store.park(conv, _device(kv))
        assert launched == []


def test_save_session_from_device(tmp_path: Path) -> None:
    cfg = {"ram_mib": 1, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
    conv, kv, dev = _conv("x", 0)
    with Store.open(FP, cfg) as store:
        store.save_session("chat-1", conv.tokens, dev, checkpoints=[8])
        out = np.zeros_like(kv)
        store.load_session("chat-1", out)
        assert np.array_equal(out, kv)
        with pytest.raises(InvalidConversation, match="not C-contiguous"):
            store.save_session("chat-2", conv.tokens, _device(kv.reshape(N, -1))[:, ::2])


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_put_kv_takes_the_callers_digests(store: SegmentStore, codec: Codec) -> None:
    data = np.random.default_rng(1).integers(0, 256, 10 * FP.token_bytes, dtype=np.uint8)
    given = numba_kernels.page_hashes(data, FP.page_bytes)  # 3 pages, the last short
    with host_hashing() as calls:
        key = store.put_kv(
            store.root_key, np.arange(10), data, token_start=0, codec=codec, page_hashes=given
        ).key
    assert calls == []
    sc = store.get_into(key, np.zeros_like(data))  # reads validate against them
    assert sc.page_hashes == given.tobytes()


def test_put_kv_refuses_digests_of_another_shape(store: SegmentStore) -> None:
    data = np.zeros(10 * FP.token_bytes, np.uint8)  # 3 pages
    good = numba_kernels.page_hashes(data, FP.page_bytes)
    for bad in (
        good[:2],
        good[:, :16],
        good.astype(np.int8),
        good.reshape(-1),
        good.tobytes(),
        np.zeros((4, 32), np.uint8),
    ):
        with pytest.raises(StoreError, match="page_hashes"):
            store.put_kv(store.root_key, np.arange(10), data, token_start=0, page_hashes=bad)  # type: ignore[arg-type]
    assert store.keys() == [] and store.used() == 0
