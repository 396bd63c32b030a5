"""Small random models written as GGUF for llama.cpp (nothing is downloaded): the Llama models of
the llama.cpp tests, of ``strata demo``'s llama.cpp phase and of ``tools/llamacpp_bench.py``,
and two models whose memory is not a plain K/V cache: a recurrent one (``mamba``) and one with a
sliding-window cache (``gemma2``, every other layer windowed).

The tokenizer is a minimal SentencePiece ("llama") vocabulary: ``<unk> <s> </s>``, the 256 byte
tokens ``<0x00>..<0xFF>`` (byte fallback, so any text tokenizes, and llama.cpp finds its newline
token ``<0x0A>``), then single characters and ``▁``-prefixed pieces up to ``vocab``. The
weights are float32 normals with ``std`` 0.2: at 0.1 the ``seed=0`` model of the default
geometry decodes one token forever after 6 (measured: 10 distinct tokens in 48 greedy ones,
37-44 with ``seed`` 1 to 3; at 0.2: 41-45 with ``seed`` 0 to 3), and "tokens identical" would
prove little. The same
arguments give the same bytes: ``seed`` picks the model, two seeds are two models of one
geometry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CHAT_TEMPLATE", "make_gemma2_gguf", "make_gguf", "make_mamba_gguf", "spm_vocab"]

#: a chat template for llama-cpp-python's Jinja2 chat formatter (``tokenizer.chat_template``)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# gguf.TokenType values (kept here so this module imports without gguf)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def spm_vocab(vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a ``vocab``-token SentencePiece vocabulary."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [_UNKNOWN, _CONTROL, _CONTROL, *([_BYTE] * 256)]
    chars = [chr(c) for c in range(33, 127)]
    pieces = ["▁", *chars, *(f"▁{c}" for c in chars), *(f"{a}{b}" for a in chars for b in chars)]
    if vocab < len(tokens) + 1 or vocab > len(tokens) + len(pieces):
        lo, hi = len(tokens) + 1, len(tokens) + len(pieces)
        raise ValueError(f"vocab {vocab} out of range [{lo}, {hi}]")
    tokens += pieces[: vocab - len(tokens)]
    types += [_NORMAL] * (vocab - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(vocab - 259)]
    return tokens, scores, types


def make_gguf(
    path: Path,
    *,
    layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int | None = None,
    vocab: int = 512,
    ctx: int = 4096,
    seed: int = 0,
    std: float = 0.2,
) -> Path:
    """A random ``llama`` model of this geometry written to ``path`` (GGUF, float32 weights,
    untied output); returns ``path``. Its K/V per token is ``layers x n_head_kv x
    (n_embd // n_head)`` elements for K and as many for V."""
    import gguf

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv} do not divide")
    head_dim = n_embd // n_head
    n_ff = n_ff or 4 * n_embd
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray[Any, Any]:
        # numpy (rows, cols) is ggml's ne = (cols, rows): out_features first, as in HF
        return (rng.standard_normal(shape) * std).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name(f"strata-tiny-llama-s{seed}")
    wr.add_context_length(ctx)
    wr.add_embedding_length(n_embd)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(n_ff)
    wr.add_head_count(n_head)
    wr.add_head_count_kv(n_head_kv)
    wr.add_rope_dimension_count(head_dim)
    wr.add_layer_norm_rms_eps(1e-5)
    _tokenizer(wr, vocab)
    wr.add_tensor("token_embd.weight", w(vocab, n_embd))
    for i in range(layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        wr.add_tensor(f"blk.{i}.attn_q.weight", w(n_head * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_k.weight", w(n_head_kv * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_v.weight", w(n_head_kv * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_output.weight", w(n_embd, n_head * head_dim))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        wr.add_tensor(f"blk.{i}.ffn_gate.weight", w(n_ff, n_embd))
        wr.add_tensor(f"blk.{i}.ffn_up.weight", w(n_ff, n_embd))
        wr.add_tensor(f"blk.{i}.ffn_down.weight", w(n_embd, n_ff))
    wr.add_tensor("output_norm.weight", ones)
    wr.add_tensor("output.weight", w(vocab, n_embd))
    return _write(wr, path)


def _tokenizer(wr: Any, vocab: int) -> None:
    """The SentencePiece vocabulary, its special tokens and :data:`CHAT_TEMPLATE`; float32."""
    wr.add_file_type(0)  # all float32
    tokens, scores, types = spm_vocab(vocab)
    wr.add_tokenizer_model("llama")
    wr.add_token_list(tokens)
    wr.add_token_scores(scores)
    wr.add_token_types(types)
    wr.add_unk_token_id(0)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_add_bos_token(True)
    wr.add_chat_template(CHAT_TEMPLATE)


def _write(wr: Any, path: Path) -> Path:
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _normals(seed: int, std: float) -> Any:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray[Any, Any]:
        # numpy (rows, cols) is ggml's ne = (cols, rows): out_features first, as in HF
        return (rng.standard_normal(shape) * std).astype(np.float32)

    return w


def make_mamba_gguf(
    path: Path,
    *,
    layers: int = 2,
    n_embd: int = 64,
    d_state: int = 16,
    d_conv: int = 4,
    vocab: int = 512,
    ctx: int = 4096,
    seed: int = 0,
    std: float = 0.2,
) -> Path:
    """A random ``mamba`` model (recurrent: llama.cpp keeps one state a sequence, its size the
    same at every length; no K/V) written to ``path``; returns ``path``. The inner size is
    ``2 * n_embd``, the time-step rank ``n_embd // 16``."""
    import gguf

    w = _normals(seed, std)
    d_inner, dt_rank = 2 * n_embd, max(1, n_embd // 16)
    ones = np.ones(n_embd, dtype=np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wr = gguf.GGUFWriter(str(path), "mamba")
    wr.add_name(f"strata-tiny-mamba-s{seed}")
    wr.add_context_length(ctx)
    wr.add_embedding_length(n_embd)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(0)
    wr.add_head_count(0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_ssm_conv_kernel(d_conv)
    wr.add_ssm_inner_size(d_inner)
    wr.add_ssm_state_size(d_state)
    wr.add_ssm_time_step_rank(dt_rank)
    _tokenizer(wr, vocab)
    wr.add_tensor("token_embd.weight", w(vocab, n_embd))
    for i in range(layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        wr.add_tensor(f"blk.{i}.ssm_in.weight", w(2 * d_inner, n_embd))
        wr.add_tensor(f"blk.{i}.ssm_conv1d.weight", w(d_inner, d_conv))
        wr.add_tensor(f"blk.{i}.ssm_conv1d.bias", w(d_inner))
        wr.add_tensor(f"blk.{i}.ssm_x.weight", w(dt_rank + 2 * d_state, d_inner))
        wr.add_tensor(f"blk.{i}.ssm_dt.weight", w(d_inner, dt_rank))
        wr.add_tensor(f"blk.{i}.ssm_dt.bias", w(d_inner))
        wr.add_tensor(f"blk.{i}.ssm_a", -np.exp(w(d_inner, d_state)))  # A < 0: a decay
        wr.add_tensor(f"blk.{i}.ssm_d", w(d_inner))
        wr.add_tensor(f"blk.{i}.ssm_out.weight", w(n_embd, d_inner))
    wr.add_tensor("output_norm.weight", ones)
    wr.add_tensor("output.weight", w(vocab, n_embd))
    return _write(wr, path)


def make_gemma2_gguf(
    path: Path,
    *,
    layers: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    window: int = 32,
    vocab: int = 512,
    ctx: int = 4096,
    seed: int = 0,
    std: float = 0.2,
) -> Path:
    """A random ``gemma2`` model (a sliding window of ``window`` tokens on every other layer,
    llama.cpp's interleaved SWA cache) written to ``path``; returns ``path``. Its output is
    tied to the token embeddings, which are drawn at a tenth of ``std``: gemma scales them by
    ``sqrt(n_embd)``, and at full ``std`` the model repeats one token (measured)."""
    import gguf

    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError(f"n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv} do not divide")
    w = _normals(seed, std)
    head_dim, n_ff = n_embd // n_head, 4 * n_embd
    ones = np.ones(n_embd, dtype=np.float32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    wr = gguf.GGUFWriter(str(path), "gemma2")
    wr.add_name(f"strata-tiny-gemma2-s{seed}")
    wr.add_context_length(ctx)
    wr.add_embedding_length(n_embd)
    wr.add_block_count(layers)
    wr.add_feed_forward_length(n_ff)
    wr.add_head_count(n_head)
    wr.add_head_count_kv(n_head_kv)
    wr.add_key_length(head_dim)
    wr.add_value_length(head_dim)
    wr.add_layer_norm_rms_eps(1e-6)
    wr.add_sliding_window(window)
    wr.add_attn_logit_softcapping(50.0)
    wr.add_final_logit_softcapping(30.0)
    _tokenizer(wr, vocab)
    wr.add_tensor("token_embd.weight", w(vocab, n_embd) * 0.1)
    for i in range(layers):
        for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            wr.add_tensor(f"blk.{i}.{norm}.weight", ones)
        wr.add_tensor(f"blk.{i}.attn_q.weight", w(n_head * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_k.weight", w(n_head_kv * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_v.weight", w(n_head_kv * head_dim, n_embd))
        wr.add_tensor(f"blk.{i}.attn_output.weight", w(n_embd, n_head * head_dim))
        wr.add_tensor(f"blk.{i}.ffn_gate.weight", w(n_ff, n_embd))
        wr.add_tensor(f"blk.{i}.ffn_up.weight", w(n_ff, n_embd))
        wr.add_tensor(f"blk.{i}.ffn_down.weight", w(n_embd, n_ff))
    wr.add_tensor("output_norm.weight", ones)
    return _write(wr, path)
