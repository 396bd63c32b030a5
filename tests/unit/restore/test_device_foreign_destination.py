"""A restore destination carries the geometry it was built for (``DeviceFlatKV(fp, ...)``,
``DeviceLayerKV(fp, ...)``, ``DevicePagedKV(fp, ...)``, and the host ``LayerKV``/``PagedKV``), and
neither ``as_destination`` nor ``Tiers._destinations`` checks it against the Store's fingerprint.
The device destinations then drive the unchecked ``scatter_rows_device`` / D2D copies with the wrong
layer count or token size:

* one layer fewer than the store's model: the restore reports every token restored, validated,
  and the device arrays hold other bytes (wrong offsets in the stored pages, half a token);
* one layer more: under the simulator an ``IndexError`` (or ``ValueError`` for the flat
  buffer) escapes; on a GPU, whose kernels do not bounds-check, the scatter reads past the
  validated chunk into the rest of the 1 MiB-grained device staging buffer (stale bytes of an
  earlier restore) and delivers them;
* the host ``read_direct`` path instead reports healthy segments as damaged (the ladder stops
  at page 0 and the segment is listed in ``damaged_segments`` for fsck).

README: "every entry point checks dtype, layout, shape ... first", but the Store's device path
calls the ``*_device`` launchers directly. Expected: a destination for another geometry is
refused with ``DestinationRefused`` before anything is read or written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numba import cuda

from stratastore import ModelFingerprint, Store
from stratastore.restore import (
    DestinationRefused,
    DeviceFlatKV,
    DeviceLayerKV,
    DevicePagedKV,
    LayerKV,
)
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()  # 2 layers
N = 16


def _other(n_layers: int) -> ModelFingerprint:
    return ModelFingerprint.create(
        "device/other-model",
        n_layers=n_layers,
        n_kv_heads=FP.n_kv_heads,
        head_dim=FP.head_dim,
        page_tokens=FP.page_tokens,
    )


def _device_dest(kind: str, fp: ModelFingerprint) -> tuple[Any, list[Any]]:
    shape = (N, fp.n_kv_heads, fp.head_dim)
    if kind == "flat":
        buf = cuda.to_device(np.full(N * fp.token_bytes, 0xEE, np.uint8))
        return DeviceFlatKV(fp, buf), [buf]
    if kind == "layer":
        arrays = [cuda.to_device(np.full(shape, 0xEEEE, np.uint16)) for _ in range(2 * fp.n_layers)]
        return DeviceLayerKV(fp, arrays[: fp.n_layers], arrays[fp.n_layers :]), arrays
    pools = [
        cuda.to_device(np.full((2, 8, 4, fp.n_kv_heads, fp.head_dim), 0xEEEE, np.uint16))
        for _ in range(fp.n_layers)
    ]
    return DevicePagedKV(fp, pools, [0, 1, 2, 3]), pools


def _store(tmp_path: Path) -> Store:
    store = Store.open(
        FP, {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    )
    conv, kv = conversation_kv("a", N, 0, step=8)
    store.park(conv, kv.copy())
    store.flush()
    return store


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("kind", ["flat", "layer", "paged"])
def test_a_device_destination_for_another_geometry_is_refused(
    tmp_path: Path, kind: str, layers: int
) -> None:
    with _store(tmp_path) as store:
        dest, arrays = _device_dest(kind, _other(layers))
        before = [a.copy_to_host() for a in arrays]
        with pytest.raises(DestinationRefused):  # today: restored N (1 layer), IndexError (3)
            store.restore(np.arange(N), dest)
        assert all(np.array_equal(a.copy_to_host(), b) for a, b in zip(arrays, before, strict=True))
        assert store.stats()["damaged_segments"] == []


def test_a_host_destination_for_another_geometry_is_refused_not_read_as_damage(
    tmp_path: Path,
) -> None:
    with _store(tmp_path) as store:
        fp1 = _other(1)
        k = [np.zeros((N, FP.n_kv_heads, FP.head_dim), np.float16)]
        v = [np.zeros((N, FP.n_kv_heads, FP.head_dim), np.float16)]
        with pytest.raises(DestinationRefused):  # today: 0 tokens, "failed BLAKE3 validation"
            store.restore(np.arange(N), LayerKV(fp1, k, v))
        assert store.stats()["damaged_segments"] == []  # a healthy image is not marked damaged
