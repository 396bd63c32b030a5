"""What makes a llama.cpp context's K/V bytes what they are: the GGUF model, the K/V cache types,
the context settings that change them; and the :class:`~.state.Layout` of its sequence states.

The model's identity is the BLAKE3 of every byte of the GGUF file
(:func:`~stratastore.adapters.weights_digest.file_digest`: its metadata, tensor infos and every
tensor's data), read once in a process for each version of the file: two files that differ
anywhere in their weights are two models. A LoRA adapter given to ``Llama`` (``lora_path``,
``lora_scale``) is part of it. A store holds one fingerprint (spec F-DIR-6): another model,
adapter, K/V type or RoPE setting opens another store, or is refused by this one. RoPE settings
are compared as the ``Llama`` was given them: a value equal to the model's default but given
explicitly is another fingerprint. Adapters or control vectors applied through llama.cpp's
low-level API are not seen. The identity string is ``"gguf-file:"`` and the digest's hex: a
store written when the identity read the metadata and 4 KiB of each tensor
(``"gguf:"``) is another fingerprint, refused at open with the fix
(:data:`~stratastore.adapters.weights_digest.EARLIER_IDENTITY`).
"""

from __future__ import annotations

import struct
from typing import Any

from stratastore.adapters.llamacpp.state import Layout
from stratastore.adapters.weights_digest import file_digest
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint
from stratastore.io import StrataIOError, files

__all__ = [
    "GGUF_MAGIC",
    "STATE_TOKEN_BYTES",
    "context_layout",
    "fingerprint",
    "gguf_digest",
    "memory_kind",
    "state_fingerprint",
]

#: bytes a token's page entry holds in a store of running states (:func:`state_fingerprint`):
#: its id, as an unsigned 32-bit little-endian integer
STATE_TOKEN_BYTES = 4

GGUF_MAGIC = b"GGUF"  #: a GGUF file's first four bytes
_GGUF_HEAD = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata count
assert _GGUF_HEAD.size == 24
_GGUF_VERSIONS = (2, 3)  #: the GGUF versions llama.cpp reads (1 is long gone)

#: ggml types a K/V cache may hold: (bytes a block, elements a block); ggml's enum values
_GGML_BLOCKS = {
    0: (4, 1),  # F32
    1: (2, 1),  # F16
    30: (2, 1),  # BF16
    2: (18, 32),  # Q4_0
    3: (20, 32),  # Q4_1
    6: (22, 32),  # Q5_0
    7: (24, 32),  # Q5_1
    8: (34, 32),  # Q8_0
    20: (18, 32),  # IQ4_NL
}

#: context settings that change the K bytes (RoPE), hashed into the fingerprint
_ROPE_FIELDS = (
    "rope_scaling_type",
    "rope_freq_base",
    "rope_freq_scale",
    "yarn_ext_factor",
    "yarn_attn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_orig_ctx",
)


def gguf_digest(path: str) -> bytes:
    """The model's identity (see the module): the BLAKE3 of every byte of the GGUF file at
    ``path`` (a link resolved), computed once in this process for each version of the file.
    :class:`ConfigError` naming the file when it cannot be read or its header is not a GGUF
    model's (the magic, version 2 or 3, at least one tensor, counts the file can hold)."""
    path = files.realpath(path)  # a model under a hub's cache is a link to its blob
    try:
        head, size = files.read_head(path, _GGUF_HEAD.size)
    except StrataIOError as e:
        raise ConfigError(f"{path}: not a GGUF model this adapter can read ({e})") from None
    if len(head) < _GGUF_HEAD.size or head[:4] != GGUF_MAGIC:
        raise ConfigError(
            f"{path}: not a GGUF model this adapter can read (it starts {head[:4]!r}, a GGUF "
            f"{GGUF_MAGIC!r}, and is {size} bytes)"
        )
    _, version, n_tensors, n_kv = _GGUF_HEAD.unpack(head)
    if version not in _GGUF_VERSIONS:
        raise ConfigError(
            f"{path}: not a GGUF model this adapter can read (GGUF version {version}; "
            f"llama.cpp reads {' and '.join(map(str, _GGUF_VERSIONS))})"
        )
    if n_tensors == 0 or max(n_tensors, n_kv) > size:
        raise ConfigError(
            f"{path}: not a GGUF model this adapter can read ({n_tensors} tensors and {n_kv} "
            f"metadata keys in {size} bytes: no model, or a damaged file)"
        )
    return file_digest(path)


def _metadata_int(llm: Any, key: str, default: int) -> int:
    value = getattr(llm, "metadata", {}).get(key)
    try:
        return int(value) if value is not None else default
    except ValueError:  # an array (per-layer values): not a geometry this adapter reads
        raise ConfigError(
            f"the model's {key} is {value!r}, not one number: models whose layers differ in "
            "K/V geometry are not supported by the llama.cpp adapter"
        ) from None


def _row_bytes(ggml_type: int, elements: int, what: str) -> int:
    if ggml_type not in _GGML_BLOCKS:
        raise ConfigError(
            f"{what} cache type {ggml_type} is not one the llama.cpp adapter knows "
            f"(ggml types {sorted(_GGML_BLOCKS)}): use f16 (the default), bf16, f32 or q8_0"
        )
    block, per = _GGML_BLOCKS[ggml_type]
    if elements % per:
        raise ConfigError(
            f"{what} rows of {elements} elements are not whole blocks of {per} (ggml type "
            f"{ggml_type})"
        )
    return elements // per * block


def context_layout(llm: Any) -> Layout:
    """The layout of ``llm``'s sequence states (a ``llama_cpp.Llama``): its model's layers and
    K/V heads, the context's K/V types, V transposed unless flash attention is on.
    :class:`ConfigError` for what the adapter cannot read: flash attention left to llama.cpp
    to choose (``AUTO``: whether V is transposed is not known before a state is written),
    K/V types it does not know, per-layer geometries, a sliding-window, recurrent or hybrid
    memory, and a ``Llama`` that keeps every token's logits."""
    import llama_cpp

    params = llm.context_params
    fa = int(params.flash_attn_type)
    if fa not in (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    ):
        raise ConfigError(
            "flash attention is left to llama.cpp (flash_attn_type AUTO): the llama.cpp "
            "adapter needs to know it: create the Llama with flash_attn=True or False"
        )
    model = llm.model
    arch = str(llm.metadata.get("general.architecture", "?"))
    what = memory_kind(llm)
    if what is not None:
        raise ConfigError(
            f"the model ({arch}) keeps {what}: LlamaCppStore stores a plain K/V cache as pages "
            "(one stream, every layer alike); such a model's state is stored whole at "
            "checkpoints: open LlamaCheckpointStore, or use StrataLlamaCache, which picks it"
        )
    if getattr(llm, "_logits_all", False):  # llama-cpp-python keeps it in no public attribute
        raise ConfigError(
            "the Llama keeps every token's logits (logits_all=True, or a draft model): a "
            "restored prefix has no logits for its tokens, so prompt logprobs would be wrong; "
            "create it with logits_all=False"
        )
    _metadata_int(llm, f"{arch}.attention.head_count_kv", 0)  # per-layer counts: refused
    n_layer = int(llama_cpp.llama_model_n_layer(model))
    n_head = int(llama_cpp.llama_model_n_head(model))
    n_head_kv = int(llama_cpp.llama_model_n_head_kv(model))
    n_embd = int(llama_cpp.llama_model_n_embd(model))
    head_k = _metadata_int(llm, f"{arch}.attention.key_length", n_embd // max(n_head, 1))
    head_v = _metadata_int(llm, f"{arch}.attention.value_length", n_embd // max(n_head, 1))
    k_type, v_type = int(params.type_k), int(params.type_v)
    n_embd_v = n_head_kv * head_v
    v_trans = fa == llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    if v_trans and _GGML_BLOCKS.get(v_type, (0, 2))[1] != 1:
        raise ConfigError(f"a quantized V cache (ggml type {v_type}) needs flash attention on")
    return Layout(
        n_layer=n_layer,
        k_type=k_type,
        k_row=_row_bytes(k_type, n_head_kv * head_k, "the K"),
        v_type=v_type,
        v_row=_row_bytes(v_type, n_embd_v, "the V"),
        v_trans=v_trans,
        v_el=_GGML_BLOCKS[v_type][0],
        n_embd_v=n_embd_v,
        version=str(getattr(llama_cpp, "__version__", "?")),
    )


def memory_kind(llm: Any) -> str | None:
    """What ``llm``'s model keeps beside (or instead of) a plain K/V cache, in words: a
    sliding-window cache, a recurrent state, a hybrid memory; ``None`` for a plain K/V cache.
    A model that keeps one has no per-token K/V rows to store as pages: its sequence's state is
    stored whole at checkpoints (:class:`~.checkpoints.LlamaCheckpointStore`)."""
    import llama_cpp

    model = llm.model
    memory = [
        ("a hybrid (attention + recurrent) memory", bool(llama_cpp.llama_model_is_hybrid(model))),
        ("a recurrent state", bool(llama_cpp.llama_model_is_recurrent(model))),
        ("a sliding-window (SWA) cache", int(llama_cpp.llama_model_n_swa(model)) > 0),
    ]
    return next((what for what, has in memory if has), None)


def _model_path(llm: Any) -> str:
    path = getattr(llm, "model_path", None)
    if not path or not files.is_file(files.realpath(path)):
        raise ConfigError(f"the Llama's model_path {path!r} is not a file: the adapter reads it")
    return str(path)


def _settings(llm: Any) -> str:
    """The context settings that change a state's bytes, as ``name=value`` words: RoPE, and a
    LoRA adapter (its file's digest and its scale)."""
    params = llm.context_params
    settings = {name: getattr(params, name) for name in _ROPE_FIELDS}
    lora = getattr(llm, "lora_path", None)
    if lora:  # an adapter changes every K/V: its file and its scale are the model too
        settings["lora"] = gguf_digest(lora).hex() if files.is_file(lora) else lora
        settings["lora_scale"] = getattr(llm, "lora_scale", None)
    return " ".join(f"{k}={v!r}" for k, v in sorted(settings.items()))


def state_fingerprint(llm: Any, *, page_tokens: int = 16) -> ModelFingerprint:
    """The fingerprint of a store of ``llm``'s sequence states kept whole at checkpoints (a
    model :func:`memory_kind` names): the GGUF's digest as for :func:`fingerprint`, and as the
    further identity the state's format (llama-cpp-python's version, which vendors llama.cpp),
    the K/V cache types, flash attention, the full-size sliding-window cache setting and the
    RoPE and adapter settings. A token's page entry is its id (:data:`STATE_TOKEN_BYTES`: one
    layer, one head of two ``int8`` items for K and two for V), so the chain's pages hold the
    tokens and the running states hold the model's memory (spec F-KEY-5)."""
    import llama_cpp

    path = _model_path(llm)
    params = llm.context_params
    version = str(getattr(llama_cpp, "__version__", "?"))
    extra = (
        f"llama.cpp sequence state (llama-cpp-python {version}) k={int(params.type_k)} "
        f"v={int(params.type_v)} flash_attn={int(params.flash_attn_type)} "
        f"swa_full={bool(getattr(params, 'swa_full', False))} " + _settings(llm)
    ).encode()
    return ModelFingerprint.create(
        "gguf-file:" + gguf_digest(path).hex(),
        n_layers=1,
        n_kv_heads=1,
        head_dim=STATE_TOKEN_BYTES // 2,
        page_tokens=page_tokens,
        dtype=DType.INT8,
        extra=extra,
    )


def fingerprint(llm: Any, layout: Layout, *, page_tokens: int = 16) -> ModelFingerprint:
    """The store's fingerprint for ``llm`` (see the module). A token's rows are stored as bytes
    (``int8`` items): per layer one "K" half and one "V" half of the token's K row followed by
    its V row, so every K/V type llama.cpp keeps has one page layout."""
    path = _model_path(llm)
    row = layout.k_row + layout.v_row
    if row % 2:
        raise ConfigError(f"a token's K and V rows are {row} bytes, an odd number")
    extra = (
        f"llama.cpp k={layout.k_type}/{layout.k_row} v={layout.v_type}/{layout.v_row} "
        + _settings(llm)
    ).encode()
    return ModelFingerprint.create(
        "gguf-file:" + gguf_digest(path).hex(),
        n_layers=layout.n_layer,
        n_kv_heads=1,
        head_dim=row // 2,
        page_tokens=page_tokens,
        dtype=DType.INT8,
        extra=extra,
    )
