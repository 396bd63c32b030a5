"""A llama.cpp model and context for tests that run without llama.cpp: a GGUF file written by
hand and a stand-in for ``llama_cpp.Llama`` holding what the adapter's identity and its
:class:`~stratastore.adapters.llamacpp.LlamaCppStore` read of it (``park_rows``, ``lookup``;
never the context's state, which only llama.cpp has)."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from stratastore.adapters.llamacpp import identity
from stratastore.adapters.llamacpp.state import Layout

__all__ = ["LAYOUT", "TENSOR_BYTES", "fake_llama", "write_gguf"]

TENSOR_BYTES = 512 << 10  #: each tensor's data: float32, 128 Ki elements
LAYOUT = Layout(
    n_layer=2, k_type=1, k_row=64, v_type=1, v_row=64, v_trans=False, v_el=2, n_embd_v=32
)


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(path: Path, flip: tuple[str, int] | None = None) -> Path:
    """A GGUF v3 file written by hand (header, metadata, tensor infos, 32-byte aligned data):
    three float32 tensors; ``flip`` = (tensor, byte) turns one bit of one tensor's data."""
    rng = np.random.default_rng(0)
    names = ["token_embd.weight", "blk.0.attn_k.weight", "output.weight"]
    data = {
        n: bytearray(rng.standard_normal(TENSOR_BYTES // 4).astype(np.float32).tobytes())
        for n in names
    }
    if flip is not None:
        data[flip[0]][flip[1]] ^= 0x01
    metadata = [
        (_string("general.architecture"), 8, _string("llama")),
        (_string("general.name"), 8, _string("tiny")),
        (_string("general.alignment"), 4, struct.pack("<I", 32)),
    ]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(names), len(metadata)))
    for key, kind, value in metadata:
        out += key + struct.pack("<I", kind) + value
    for i, name in enumerate(names):  # 2 dims (ggml's ne: columns first), type 0 = F32
        dims = struct.pack("<IQQ", 2, 256, TENSOR_BYTES // 4 // 256)
        out += _string(name) + dims + struct.pack("<IQ", 0, i * TENSOR_BYTES)
    out += b"\x00" * (-len(out) % 32)
    for name in names:
        out += data[name]
    path.write_bytes(bytes(out))
    return path


def fake_llama(path: Path) -> Any:
    """What :func:`identity.fingerprint` and :meth:`LlamaCppStore.open` read of a ``Llama``."""
    params = SimpleNamespace(**{name: 0 for name in identity._ROPE_FIELDS})
    return SimpleNamespace(
        model_path=str(path),
        context_params=params,
        lora_path=None,
        n_ctx=lambda: 4096,
        input_ids=np.zeros(4096, np.intc),
        n_tokens=0,
    )
