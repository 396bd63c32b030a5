"""The transformers adapter on CUDA tensors parks from the device (packed and
hashed there, copied to the host once) and restores into device tensors validated on the device,
with no ``.to("cpu")`` round trip in the adapter.

There is no CUDA torch here, so the device path runs on CPU tensors under numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1, tests/conftest.py), where device memory is host memory: ``is_cuda``
says yes and ``device_view`` shows a tensor's memory through ``__cuda_array_interface__``, as
a CUDA tensor's own interface does. Everything else (the torch packing on the device, the
Store's device park and restore, the caches built on the restored tensors) is the code a GPU
runs. Needs the ``transformers`` extra; skipped with that reason without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXTRA = "needs the transformers extra: pip install -e '.[transformers]'"
torch = pytest.importorskip("torch", reason=EXTRA)
transformers = pytest.importorskip("transformers", reason=EXTRA)

import numba_kernels  # noqa: E402
from stratastore.adapters.hf import cache as hf  # noqa: E402
from stratastore.adapters.hf import tensors as hf_tensors  # noqa: E402
from stratastore.restore import DeviceLayerKV  # noqa: E402
from tests.adapters.test_hf_engine import (  # noqa: E402
    MODEL,
    assert_continues_exactly,
    config,
    forward,
    ids_of,
    open_kv,
    same_bytes,
    tiny,
)
from tests.conftest import CudaInterface  # noqa: E402


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every tensor counts as a CUDA one (see the module docstring); records what the adapter
    showed the Store as device memory, and fails any host hashing or host copy of the K/V."""
    shown: list[str] = []

    def view(t: Any) -> CudaInterface:
        shown.append(str(t.dtype))
        plain = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        return CudaInterface(plain.numpy())

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the host hashed or copied K/V of a CUDA cache")

    monkeypatch.setattr(hf_tensors, "is_cuda", lambda where: True)
    monkeypatch.setattr(hf_tensors, "device_view", view)
    monkeypatch.setattr(hf_tensors, "token_rows", refuse)  # the host path's per-layer copy
    for name in ("hash_page", "page_hashes", "start_page_hashes"):
        monkeypatch.setattr(numba_kernels, name, refuse)
    return shown


def test_a_cuda_cache_parks_and_restores_on_the_device(
    tmp_path: Path, on_device: list[str]
) -> None:
    model = tiny()
    ids = ids_of(24, 1)
    _, kept = forward(model, ids)
    with open_kv(model, tmp_path, park="disk") as kv:
        assert kv.park("c", ids, kept, checkpoints=[10]).where == "disk"
        kv.store.flush()
        prompt = torch.cat([ids, ids_of(3, 2)], dim=1)
        cache, n = kv.restore(prompt)
        assert n == 24
        assert isinstance(kv.restore_many([prompt])[0][0], transformers.DynamicCache)
    assert on_device, "the adapter never showed the Store device memory"
    assert same_bytes(cache, kept)
    assert_continues_exactly(model, prompt, n, cache, kept)


def test_the_device_restore_uses_device_destinations(
    tmp_path: Path, on_device: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []
    real = hf_tensors.DeviceLayerKV

    def recorded(*a: Any, **kw: Any) -> DeviceLayerKV:
        d = real(*a, **kw)
        made.append(d)
        return d

    monkeypatch.setattr(hf_tensors, "DeviceLayerKV", recorded)
    model = tiny()
    ids = ids_of(12, 3)
    _, kept = forward(model, ids)
    with open_kv(model, tmp_path, park="disk") as kv:
        kv.park("d", ids, kept)
        kv.store.flush()
        _, n = kv.restore(ids, max_tokens=12)
    assert n == 12 and len(made) == 1


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_packing_on_the_device_is_the_host_packing(dtype: str) -> None:
    """:func:`hf_tensors.pack_on_device` (torch copies, here on CPU tensors) is bit-identical to
    the host's :func:`hf_tensors.pack`, segments, short pages and a strided last dimension
    included."""
    fp = hf.ModelFingerprint.create(
        "t", n_layers=3, n_kv_heads=2, head_dim=8, page_tokens=4, dtype=dtype
    )
    torch.manual_seed(0)
    n, dt = 23, getattr(torch, dtype)
    layers = []
    for i in range(3):
        k = torch.randn(1, 2, n, 8).to(dt)
        v = torch.randn(1, 2, n, 16).to(dt)[..., ::2] if i == 1 else torch.randn(1, 2, n, 8).to(dt)
        layers.append((k, v))
    cuts = [0, 5, 13]
    rows = [(hf_tensors.token_rows(k), hf_tensors.token_rows(v)) for k, v in layers]
    host = hf_tensors.pack(fp, rows, n, cuts)
    dev = hf_tensors.pack_on_device(fp, layers, n, cuts)
    assert np.array_equal(dev.numpy(), host)


def test_a_bad_device_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(hf.ConfigError, match="not a torch device"):
        hf.TransformersCache.open(tiny().config, MODEL, config(tmp_path), device="gpu-7")
