"""The page-hash kernel hashes pages of at most MAX_THREADS * MAX_RUN KiB (16 MiB;
``numba_kernels.cuda.threads_for``), but a model fingerprint may have pages up to ``MAX_PAGE_BYTES``
(2 GiB), and the host path takes any of them. For a model whose pages are larger than 16 MiB (e.g.
80 layers x 8 kv heads x 128 x fp16 with 64-token pages: 20 MiB, a 70B model; or 126 layers with
32-token pages), ``Store.park`` of device K/V and ``Store.restore`` into device memory raise a bare
``ValueError`` ("pages of ... bytes exceed the kernel's 16384 KiB limit"): not a StrataError,
nothing says what to do, and the device path the docs promise does not exist for that model
although Store.open accepted it.

Here a tiny geometry with 2**19-token pages (32 MiB pages) holds the same property at a size
the simulator hashes at once (4 tokens: 256 bytes, one short page)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import cuda

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens

BIG = ModelFingerprint.create(
    "device/big-pages", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=1 << 19
)


def _image() -> tuple[Conversation, np.ndarray]:
    n = 4
    kv = np.random.default_rng(3).integers(0, 256, n * BIG.token_bytes, dtype=np.uint8)
    return Conversation("a", as_tokens(np.arange(n)), [Checkpoint(n)]), kv


def _cfg(tmp_path: Path) -> dict[str, object]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 256}


def test_a_model_with_pages_over_16_mib_parks_from_device_memory(tmp_path: Path) -> None:
    assert BIG.page_bytes > 16 << 20
    conv, kv = _image()
    with Store.open(BIG, _cfg(tmp_path)) as store:
        assert store.park(conv, cuda.to_device(kv)).where == "disk"  # today: ValueError
        store.flush()
        out = np.zeros_like(kv)
        assert store.restore(conv.tokens, out).tokens == 4
        assert np.array_equal(out, kv)


def test_a_model_with_pages_over_16_mib_restores_into_device_memory(tmp_path: Path) -> None:
    conv, kv = _image()
    with Store.open(BIG, _cfg(tmp_path)) as store:
        store.park(conv, kv.copy())  # a host park: hashed on the host, any page size
        store.flush()
        out = cuda.to_device(np.zeros_like(kv))
        r = store.restore(conv.tokens, out)  # today: ValueError from the read pass
        assert (r.source, r.tokens) == ("disk", 4)
        assert np.array_equal(out.copy_to_host(), kv)
