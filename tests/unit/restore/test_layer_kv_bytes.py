"""The same contract as the host path: the host ``LayerKV`` takes each layer's K and V as ``[tokens,
n_kv_heads, head_dim]`` of the model's item size *or* as ``[tokens, row]`` bytes
(``_PerToken._checked``: the byte view the adapters use), but ``DeviceLayerKV`` refuses the byte
form ("every token would land at a wrong offset"), though it is the same memory laid out the same
way. A uint8 view is also the natural way around the bfloat16 ``__cuda_array_interface__`` gap the
device path documents."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import cuda

from stratastore import Store
from stratastore.restore import DeviceLayerKV, LayerKV
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
ROW = FP.n_kv_heads * FP.head_dim * FP.dtype.itemsize
N = 16


def test_device_layer_kv_takes_token_rows_of_bytes_as_layer_kv_does(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation_kv("a", N, 0, step=8)
        store.park(conv, kv.copy())
        store.flush()
        host = [np.zeros((N, ROW), np.uint8) for _ in range(2 * FP.n_layers)]
        assert store.restore(conv.tokens, LayerKV(FP, host[:2], host[2:])).tokens == N
        dev = [cuda.to_device(np.zeros((N, ROW), np.uint8)) for _ in range(2 * FP.n_layers)]
        dest = DeviceLayerKV(FP, dev[:2], dev[2:])  # today: DestinationRefused
        assert store.restore(conv.tokens, dest).tokens == N
        assert all(np.array_equal(d.copy_to_host(), h) for d, h in zip(dev, host, strict=True))
