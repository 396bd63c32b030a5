"""A GGUF model's identity (stratastore.adapters.llamacpp.identity), no llama.cpp needed (the
GGUF files are written here, the ``Llama`` is a stand-in): two files equal in their metadata and
in the first and last 64 KiB of every tensor, different in one byte inside a tensor, are two
models, and one's store refuses the other; a store written under the identity that read samples
of the weights is refused with the fix; a file whose header is not a GGUF model's is a
ConfigError naming it."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ConfigError, IncompatibleFingerprint
from stratastore.adapters.llamacpp import LlamaCppStore, fingerprint, gguf_digest
from stratastore.adapters.llamacpp import store as store_module
from stratastore.facade import Store
from stratastore.format import DType, ModelFingerprint
from tests.llama_stand_in import LAYOUT, TENSOR_BYTES, fake_llama, write_gguf

EDGE = 64 << 10  #: the bytes at either end of a tensor the two models agree in (and more)


@pytest.fixture
def twins(tmp_path: Path) -> tuple[Path, Path]:
    """Two models equal in metadata and in the first and last :data:`EDGE` bytes (and the
    middle 4 KiB) of every tensor; the second differs in one byte a quarter into one tensor."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_gguf(tmp_path / "a" / "model.gguf")
    b = write_gguf(tmp_path / "b" / "model.gguf", flip=("blk.0.attn_k.weight", TENSOR_BYTES // 4))
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    assert len(raw_a) == len(raw_b)
    differ = np.flatnonzero(np.frombuffer(raw_a, np.uint8) != np.frombuffer(raw_b, np.uint8))
    data_start = len(raw_a) - 3 * TENSOR_BYTES
    assert len(differ) == 1
    within = (int(differ[0]) - data_start) % TENSOR_BYTES
    assert EDGE <= within < TENSOR_BYTES - EDGE
    assert not TENSOR_BYTES // 2 - 2048 <= within < TENSOR_BYTES // 2 + 2048
    return a, b


def test_one_byte_inside_a_tensor_is_another_model(twins: tuple[Path, Path]) -> None:
    a, b = twins
    assert gguf_digest(str(a)) != gguf_digest(str(b))
    fp_a = fingerprint(fake_llama(a), LAYOUT)
    fp_b = fingerprint(fake_llama(b), LAYOUT)
    assert fp_a.model_digest != fp_b.model_digest
    assert fingerprint(fake_llama(a), LAYOUT) == fp_a  # the same file: the same model


def _cfg(root: Path) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(root / "cold"), "cold_mib": 16}


def _park_one(store: LlamaCppStore, n: int = 40) -> None:
    rows = np.random.default_rng(1).integers(0, 255, (LAYOUT.n_layer, n, 128), dtype=np.uint8)
    store.park_rows("conv-1", list(range(1, n + 1)), rows)
    store.store.flush()


def test_a_store_written_for_one_refuses_the_other(
    twins: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "context_layout", lambda llm: LAYOUT)
    a, b = twins
    with LlamaCppStore.open(fake_llama(a), _cfg(tmp_path)) as store:
        _park_one(store)
    with pytest.raises(IncompatibleFingerprint, match="model id digest"):
        LlamaCppStore.open(fake_llama(b), _cfg(tmp_path))
    with LlamaCppStore.open(fake_llama(a), _cfg(tmp_path)) as store:
        assert store.lookup(list(range(1, 41))) == 39  # its own model: its K/V


def test_a_store_of_the_sampled_identity_is_refused_with_the_fix(
    twins: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity string was ``"gguf:"`` and a digest of the metadata and 4 KiB of each
    tensor: the same model has another fingerprint now, and its old store says what to do."""
    monkeypatch.setattr(store_module, "context_layout", lambda llm: LAYOUT)
    a, _ = twins
    now = fingerprint(fake_llama(a), LAYOUT)
    before = ModelFingerprint.create(
        "gguf:" + "ab" * 32,
        n_layers=now.n_layers,
        n_kv_heads=now.n_kv_heads,
        head_dim=now.head_dim,
        page_tokens=now.page_tokens,
        dtype=DType.INT8,
    )
    before = ModelFingerprint(
        before.model_digest,
        now.extra_digest,
        now.n_layers,
        now.n_kv_heads,
        now.head_dim,
        now.page_tokens,
        now.dtype,
        now.kv_layout,
    )
    with LlamaCppStore(fake_llama(a), Store.open(before, _cfg(tmp_path)), before, LAYOUT) as old:
        _park_one(old)
    with pytest.raises(IncompatibleFingerprint, match="model id digest") as got:
        LlamaCppStore.open(fake_llama(a), _cfg(tmp_path))
    said = str(got.value)
    assert "4 KiB of each tensor" in said and "use another directory" in said
    assert str(tmp_path / "cold") in said


@pytest.mark.parametrize(
    "content, said",
    [
        (struct.pack("<Q", 2) + b"{}", "starts b'\\x02"),  # a safetensors file
        (b"GGUF", "is 4 bytes"),
        (b"GGUF" + bytes(64), "GGUF version 0"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1), "0 tensors"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1, 2**40), "damaged"),
    ],
)
def test_a_file_that_is_not_a_gguf_model_is_a_config_error_naming_it(
    tmp_path: Path, content: bytes, said: str
) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match="not a GGUF model") as got:
        gguf_digest(str(bad))
    assert said in str(got.value) and str(bad) in str(got.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a GGUF model.*missing\.gguf"):
        gguf_digest(str(tmp_path / "missing.gguf"))
