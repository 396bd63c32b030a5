"""llama-cpp-python driven the way the adapter drives it: ``Llama`` for the model and its
batch bookkeeping, the low-level ``llama_state_seq_*`` calls on ``llm.ctx`` for one sequence's
K/V state. Imports llama_cpp lazily (the suite collects without it)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def load(
    path: Path, *, flash_attn: bool = False, kv: str = "f16", v: str | None = None, n_ctx: int = 512
) -> Any:
    """A CPU ``Llama`` with K cache type ``kv`` and V cache type ``v`` (default: ``kv``)."""
    import llama_cpp

    types = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0}
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        seed=0,
        verbose=False,
        flash_attn=flash_attn,
        type_k=types[kv],
        type_v=types[v or kv],
    )


def logits(llm: Any) -> np.ndarray:
    """The last evaluated token's logits (a copy)."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def get_seq(llm: Any, seq: int = 0) -> bytes:
    """``llama_state_seq_get_data`` of ``seq``, exactly ``llama_state_seq_get_size`` bytes."""
    import llama_cpp

    n = llama_cpp.llama_state_seq_get_size(llm.ctx, seq)
    buf = (ctypes.c_uint8 * n)()
    got = llama_cpp.llama_state_seq_get_data(llm.ctx, buf, n, seq)
    assert got == n, f"llama_state_seq_get_data wrote {got} of {n} bytes"
    return bytes(buf)


def set_seq(llm: Any, data: bytes, seq: int = 0) -> int:
    """``llama_state_seq_set_data`` into ``seq``: the bytes it read, 0 when it refused."""
    import llama_cpp

    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return int(llama_cpp.llama_state_seq_set_data(llm.ctx, buf, len(data), seq))


def pos_max(llm: Any, seq: int = 0) -> int:
    """The highest position ``seq`` holds, -1 when it holds none."""
    import llama_cpp

    return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(llm.ctx), seq))


def adopt(llm: Any, tokens: list[int]) -> None:
    """Tell ``Llama`` that seq 0 now holds ``tokens`` (after a set_data), so that ``eval``
    appends after them and ``generate`` finds them as its prefix."""
    llm.n_tokens = len(tokens)
    llm.input_ids[: len(tokens)] = tokens
