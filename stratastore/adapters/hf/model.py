"""What the transformers adapter (:mod:`.hf`) reads from a model: the fingerprint of its
config, whether its cache keeps a sliding window, its dtype, its token ids, and where each
message ends by its tokenizer's chat template.

The fingerprint (spec F-FP) is the model id and the architecture fields of the config that
shape or produce K/V, so a different config never matches (a store directory written for one
fingerprint refuses another, spec F-DIR-6). Only caches that hold the whole prefix are
supported: :func:`refuse_sliding` names the window of a config whose cache slides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.adapters.chat_cuts import message_ends
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint

__all__ = [
    "Messages",
    "config_dtype",
    "cuts_from_chat_template",
    "fingerprint_for",
    "geometry",
    "ids_of",
    "refuse_sliding",
    "sliding_window_of",
]

_ARCH_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
    "rms_norm_eps",
    "attention_bias",
    "sliding_window",
    "partial_rotary_factor",
    "tie_word_embeddings",
)

_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}

Messages = Sequence[Mapping[str, Any]]


def geometry(config: Any) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return layers, heads, int(head_dim)


def fingerprint_for(
    config: Any, model_id: str, dtype: Any, *, page_tokens: int = 16
) -> ModelFingerprint:
    """The fingerprint of ``model_id`` (name and revision: the weights) with ``config``'s K/V
    geometry and architecture, for caches of torch ``dtype``."""
    if str(dtype) not in _DTYPES:
        raise ConfigError(f"K/V dtype {dtype} is not supported; use float16, bfloat16 or float32")
    layers, heads, head_dim = geometry(config)
    arch = {f: getattr(config, f, None) for f in _ARCH_FIELDS}
    extra = json.dumps(arch, sort_keys=True, default=str).encode()
    return ModelFingerprint.create(
        model_id,
        n_layers=layers,
        n_kv_heads=heads,
        head_dim=head_dim,
        page_tokens=page_tokens,
        dtype=_DTYPES[str(dtype)],
        extra=extra,
    )


def sliding_window_of(config: Any) -> int | None:
    """The window of a config whose cache keeps only its last tokens, or ``None`` when every
    layer's cache keeps the whole prefix.

    A window is in use when ``layer_types`` names sliding (or chunked) attention, when
    ``use_sliding_window`` is set, when ``sliding_window`` (or ``attention_chunk_size``) is
    set and smaller than ``max_position_embeddings``, or when transformers itself builds a
    sliding layer for the config's ``DynamicCache``."""
    window = getattr(config, "sliding_window", None) or getattr(
        config, "attention_chunk_size", None
    )
    types = [str(t) for t in getattr(config, "layer_types", None) or ()]
    longest = getattr(config, "max_position_embeddings", None)
    use = getattr(config, "use_sliding_window", None)  # Qwen2: False turns the field off
    in_use = (
        any("sliding" in t or "chunked" in t for t in types)
        or use is True
        or (
            use is not False
            and window is not None
            and (longest is None or int(window) < int(longest))
        )
        or _builds_sliding_layers(config)
    )
    if not in_use:
        return None
    return int(window) if window else -1  # -1: sliding layers whose window the config omits


def _builds_sliding_layers(config: Any) -> bool:
    """Whether ``DynamicCache(config=config)`` keeps a sliding window in some layer."""
    from transformers import DynamicCache

    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot build a cache for: the fields decide
        return False
    return any(getattr(layer, "is_sliding", False) for layer in layers)


def refuse_sliding(config: Any) -> None:
    """Raise :class:`ConfigError` naming the window when ``config``'s cache keeps one."""
    window = sliding_window_of(config)
    if window is None:
        return
    fields = [
        f"{f}={getattr(config, f)}"
        for f in ("sliding_window", "attention_chunk_size", "use_sliding_window")
        if getattr(config, f, None) not in (None, False)
    ]
    types = [str(t) for t in getattr(config, "layer_types", None) or ()]
    layers = [i for i, t in enumerate(types) if "sliding" in t or "chunked" in t]
    if layers:
        fields.append(f"layers {layers} of layer_types slide")
    size = f"a sliding window of {window} tokens" if window > 0 else "a sliding window"
    last = f"its last {window} tokens" if window > 0 else "its last tokens"
    raise ConfigError(
        f"{getattr(config, 'model_type', None) or 'this model'} keeps {size} in its K/V cache "
        f"({', '.join(fields) or 'its cache layers slide'}): such a cache holds only {last}, so "
        "its K/V are not the whole prefix the store keys them by and could not be continued "
        "after a restore; this adapter stores full-attention caches only (a model trained "
        "without a window: set sliding_window=None)"
    )


def config_dtype(config: Any) -> Any:
    """The config's dtype without touching transformers 5's deprecated ``torch_dtype``
    property (whose read logs a warning): ``config.dtype``, else a ``torch_dtype`` stored as a
    plain attribute (transformers 4 configs)."""
    found = getattr(config, "dtype", None)
    if found is None:
        found = getattr(config, "__dict__", {}).get("torch_dtype")
    return found


def ids_of(token_ids: Any) -> npt.NDArray[np.int64]:
    """Token ids from a list, a numpy array or a (1, n) / (n,) tensor."""
    if hasattr(token_ids, "detach"):
        token_ids = token_ids.detach().to("cpu").numpy()
    a = np.asarray(token_ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ConfigError(f"token ids must be one sequence, got shape {a.shape}")
    return a.astype(np.int64)


def _render(tokenizer: Any, messages: Messages) -> list[int]:
    """The token ids of ``messages`` rendered by the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=False)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(t) for t in out]


def cuts_from_chat_template(tokenizer: Any, messages: Messages, token_ids: Any = None) -> list[int]:
    """Where each message ends (the next one's opener starts), in tokens: the lengths of the
    chat template rendered on ``messages[:i]`` for ``i = 1 .. len(messages)``, ascending.

    The first is the end of the system prompt when ``messages[0]`` is one (the length to pin).
    With ``token_ids`` (the conversation as parked), a length counts only where its rendering is
    a prefix of ``token_ids``: a template that rewrites earlier messages once later ones exist
    (one that drops past reasoning), or a tokenizer that merges across the boundary, gives no
    cut there, never a wrong one. Raises :class:`ConfigError` for a tokenizer without a chat
    template."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            "the tokenizer has no chat_template: message openers come from it; "
            "pass checkpoints= instead"
        )
    ids = None if token_ids is None else ids_of(token_ids)
    return message_ends(lambda i: _render(tokenizer, messages[:i]), len(messages), ids)
