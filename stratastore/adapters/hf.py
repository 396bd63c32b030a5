"""The transformers adapter (issue 7): park a ``DynamicCache`` with its token ids and
checkpoints, look up a prompt, restore the matched prefix into a new ``DynamicCache``.

Install with the ``transformers`` extra (``torch==2.13.0`` and transformers). The worked example
of docs/ENGINE.md::

    with TransformersCache.open(model.config, "my-org/my-model@rev", store_config) as kv:
        kv.park("chat-1", ids, out.past_key_values, checkpoints=[len_system, len_turn1])
        cache, n = kv.restore(prompt_ids)          # n tokens are in `cache`
        model(prompt_ids[:, n:], past_key_values=cache)

The model fingerprint (spec F-FP) is the model id and the architecture fields of the config
that shape or produce K/V, so a different config never matches (a store directory written for
one fingerprint refuses another, spec F-DIR-6). K/V are moved as raw bytes, so fp32, fp16 and
bfloat16 round-trip bit-exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..chain import Checkpoint, Conversation, as_tokens
from ..config import StoreConfig
from ..errors import ConfigError
from ..facade import Store
from ..format import ModelFingerprint
from ..restore import LayerKV
from ..restore.destinations import pack_pages
from ..tiers.tiered import ParkReport

__all__ = ["TransformersCache", "fingerprint_for"]

#: config fields that change what a model's K/V are (hashed into the fingerprint's extra)
_ARCH_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rope_theta",
    "rope_scaling", "rope_parameters", "max_position_embeddings", "rms_norm_eps",
    "attention_bias", "sliding_window", "partial_rotary_factor", "tie_word_embeddings",
)  # fmt: skip

_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}


def _geometry(config: Any) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return layers, heads, int(head_dim)


def fingerprint_for(config: Any, model_id: str, dtype: Any, *, page_tokens: int = 16
                    ) -> ModelFingerprint:  # fmt: skip
    """The fingerprint of ``model_id`` (name and revision: the weights) with ``config``'s K/V
    geometry and architecture, for caches of torch ``dtype``."""
    if str(dtype) not in _DTYPES:
        raise ConfigError(f"K/V dtype {dtype} is not supported; use float16, bfloat16 or float32")
    layers, heads, head_dim = _geometry(config)
    arch = {f: getattr(config, f, None) for f in _ARCH_FIELDS}
    extra = json.dumps(arch, sort_keys=True, default=str).encode()
    return ModelFingerprint.create(model_id, n_layers=layers, n_kv_heads=heads,
                                   head_dim=head_dim, page_tokens=page_tokens,
                                   dtype=_DTYPES[str(dtype)], extra=extra)  # fmt: skip


def _bytes(t: Any) -> npt.NDArray[np.uint8]:
    """A contiguous CPU tensor's bytes as a numpy array (no copy), whatever its dtype."""
    import torch

    t = t.detach().to("cpu").contiguous()
    out: npt.NDArray[np.uint8] = (t if t.dim() else t.reshape(1)).view(torch.uint8).numpy()
    return out


class TransformersCache:
    """A :class:`~stratastore.Store` for one transformers model (batch size 1 caches)."""

    def __init__(self, store: Store, config: Any, fp: ModelFingerprint, dtype: Any) -> None:
        self.store, self.config, self.fp, self.dtype = store, config, fp, dtype
        self.layers, self.heads, self.head_dim = _geometry(config)

    @classmethod
    def open(
        cls,
        config: Any,
        model_id: str,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        *,
        dtype: Any = None,
        page_tokens: int = 16,
        **store_kw: Any,
    ) -> TransformersCache:
        """Open a Store for this model; ``dtype`` defaults to the config's ``torch_dtype``
        (``dtype`` in transformers 5), else float32."""
        import torch

        dtype = dtype or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        dtype = dtype or torch.float32
        fp = fingerprint_for(config, model_id, dtype, page_tokens=page_tokens)
        return cls(Store.open(fp, store_config, **store_kw), config, fp, dtype)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> TransformersCache:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    # -- the engine's calls -------------------------------------------------------------------
    def park(self, conv_id: str, token_ids: Any, cache: Any,
             checkpoints: Sequence[int] = ()) -> ParkReport:  # fmt: skip
        """Keep ``cache`` (a ``DynamicCache`` holding exactly ``token_ids``) under ``conv_id``;
        ``checkpoints`` are the token lengths a later prompt may resume at (message ends; the
        whole conversation always is one)."""
        ids = as_tokens(_ids(token_ids))
        n = len(ids)
        k_layers, v_layers = self._layers(cache, n)
        lengths = sorted({*(c for c in checkpoints if 0 < c < n), n})
        cuts = [0, *lengths[:-1]]  # a segment per message: each checkpoint ends one
        kv = pack_pages(self.fp, k_layers, v_layers, n, cuts)
        conv = Conversation(conv_id, ids, [Checkpoint(x) for x in lengths], cuts=cuts)
        return self.store.park(conv, kv)

    def lookup(self, prompt_ids: Any) -> int:
        """How many leading tokens of the prompt a restore would bring back (0: none)."""
        hit = self.store.lookup(_ids(prompt_ids))
        return hit[1] if hit else 0

    def restore(self, prompt_ids: Any) -> tuple[Any, int]:
        """``(DynamicCache, n)``: the deepest stored prefix of the prompt, ``n`` tokens, all
        validated; ``(None, 0)`` when nothing matches. Prefill ``prompt_ids[n:]`` with it."""
        import torch
        from transformers import DynamicCache

        ids = _ids(prompt_ids)
        row = self.heads * self.head_dim * self.fp.dtype.itemsize
        k = [np.zeros((len(ids), row), np.uint8) for _ in range(self.layers)]
        v = [np.zeros((len(ids), row), np.uint8) for _ in range(self.layers)]
        r = self.store.restore(ids, LayerKV(self.fp, k, v, read_direct=True))  # fresh arrays
        if r.tokens == 0:
            return None, 0
        cache = DynamicCache(config=self.config)
        for layer in range(self.layers):
            kt, vt = (torch.from_numpy(a[: r.tokens].copy()).view(self.dtype)
                      .reshape(r.tokens, self.heads, self.head_dim).transpose(0, 1)
                      .unsqueeze(0).contiguous() for a in (k[layer], v[layer]))  # fmt: skip
            cache.update(kt, vt, layer)
        return cache, r.tokens

    def _layers(self, cache: Any, n: int) -> tuple[list[npt.NDArray[np.uint8]],
                                                  list[npt.NDArray[np.uint8]]]:  # fmt: skip
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != self.layers:
            raise ConfigError(
                f"the cache has {len(layers or [])} layers; this model has {self.layers}: park "
                "the cache of the model this adapter is for"
            )
        ks: list[npt.NDArray[np.uint8]] = []
        vs: list[npt.NDArray[np.uint8]] = []
        for i, layer in enumerate(layers):
            for t, out in ((layer.keys, ks), (layer.values, vs)):
                if t.dtype != self.dtype:
                    raise ConfigError(f"layer {i} holds {t.dtype}; this adapter stores "
                                      f"{self.dtype}: open it with dtype={t.dtype}")  # fmt: skip
                if tuple(t.shape) != (1, self.heads, n, self.head_dim):
                    raise ConfigError(
                        f"layer {i} K/V shape {tuple(t.shape)} is not (1, {self.heads}, {n}, "
                        f"{self.head_dim}): one sequence whose length is the token count"
                    )
                out.append(_bytes(t[0].transpose(0, 1)).reshape(n, -1))
        return ks, vs


def _ids(token_ids: Any) -> npt.NDArray[np.int64]:
    """Token ids from a list, a numpy array or a (1, n) / (n,) tensor."""
    if hasattr(token_ids, "detach"):
        token_ids = token_ids.detach().to("cpu").numpy()
    a = np.asarray(token_ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ConfigError(f"token ids must be one sequence, got shape {a.shape}")
    return a.astype(np.int64)
