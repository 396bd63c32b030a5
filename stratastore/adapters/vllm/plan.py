"""What the vLLM connector decides, apart from vLLM itself (no vLLM or torch import here).

* **The model** (spec F-FP): vLLM's own description of it (the model's name or path and
  revision, its config, layers, kv heads, head size, the K/V dtype) with vLLM's block size as
  the page size, so a page of the store is a block of vLLM's pool and a restore lands whole
  blocks. A store directory written for another model refuses the connector at start-up.
* **The store** (:func:`store_config`): ``kv_connector_extra_config["strata"]`` holds the
  Store's own settings, or ``"strata_config"`` names a TOML file of them; with neither, one
  cold disk level under the user's cache directory. Parks go to disk (a restart keeps them)
  and pages are resume points (``page_resume``), unless the settings say otherwise.
* **How much a request loads** (:func:`loadable`): the deepest stored prefix of its prompt, in
  whole vLLM blocks, never the whole prompt (vLLM computes at least its last token).
* **What a finished request parks** (:func:`saved_tokens`, :func:`save_cuts`): every whole
  block whose K/V vLLM computed, cut into chunks and where it resumed from the store, so that
  a shared prefix and the next turn of the conversation share those segments (content keys)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint
from stratastore.io import pathnames
from stratastore.io.system import env_var

__all__ = [
    "LoadJob",
    "SaveJob",
    "default_store_dir",
    "fingerprint",
    "loadable",
    "save_cuts",
    "saved_tokens",
    "store_config",
]

#: vLLM's K/V dtype names (torch's, without the prefix) -> the fingerprint's
_DTYPES = {
    "bfloat16": DType.BFLOAT16,
    "float16": DType.FLOAT16,
    "half": DType.FLOAT16,
    "float32": DType.FLOAT32,
    "float": DType.FLOAT32,
    "float8_e4m3fn": DType.FLOAT8_E4M3,
    "float8_e5m2": DType.FLOAT8_E5M2,
}
DEFAULT_COLD_MIB = 16384  #: the default level's budget


@dataclass(frozen=True)
class LoadJob:
    """Load ``tokens`` (the prompt's first ``len(tokens)`` ids, whole blocks) into the
    request's ``block_ids`` (one a block, from block 0), skipping the first ``skip`` tokens
    (vLLM's own prefix cache computed them: its blocks may be shared, never written)."""

    req_id: str
    tokens: npt.NDArray[np.uint32]
    block_ids: tuple[int, ...]
    skip: int


@dataclass(frozen=True)
class SaveJob:
    """Park ``tokens`` (every token of a finished request whose K/V vLLM computed) from the
    request's ``block_ids``, cut at ``cuts``; the blocks are vLLM's until the worker reports
    the job done (:meth:`get_finished`)."""

    req_id: str
    tokens: npt.NDArray[np.uint32]
    block_ids: tuple[int, ...]
    cuts: tuple[int, ...] = field(default=(0,))


def _dtype(name: object) -> DType:
    text = str(name).removeprefix("torch.")
    if text not in _DTYPES:
        raise ConfigError(
            f"StrataConnector: vLLM's K/V dtype {text!r} is not one the store "
            f"keeps ({', '.join(sorted(_DTYPES))})"
        )
    return _DTYPES[text]


def fingerprint(
    model: str,
    revision: str | None,
    hf_config: Mapping[str, Any],
    *,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: object,
    tp_size: int = 1,
    backend: str = "",
) -> ModelFingerprint:
    """The model fingerprint of a vLLM engine's K/V (see the module): its id the model's
    name or path at ``revision``, its ``extra`` a digest of the config (canonical JSON), the
    tensor-parallel size (each rank keeps its own heads) and the attention ``backend`` (on the
    CPU its ISA: how a block's rows are kept)."""
    canon = json.dumps(dict(hf_config), sort_keys=True, default=str).encode()
    extra = (
        f"vllm;tp={tp_size};backend={backend};config=".encode()
        + hashlib.blake2b(canon, digest_size=16).digest()
    )
    return ModelFingerprint.create(
        f"{model}@{revision or ''}",
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        page_tokens=block_size,
        dtype=_dtype(dtype),
        extra=extra,
    )


def default_store_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/stratastore/vllm``, else ``~/.cache/stratastore/vllm``; ``env``
    stands for this process's environment when given."""
    cache = env_var("XDG_CACHE_HOME") if env is None else env.get("XDG_CACHE_HOME")
    base = cache or pathnames.join(pathnames.expanduser("~"), ".cache")
    return pathnames.join(base, "stratastore", "vllm")


def store_config(extra: Mapping[str, Any] | None) -> tuple[StoreConfig, str]:
    """The Store's settings from vLLM's ``kv_connector_extra_config`` (see the module), and a
    line that says where the store is. A mistake is a :class:`ConfigError` naming it."""
    extra = dict(extra or {})
    inline, path = extra.get("strata"), extra.get("strata_config")
    if inline is not None and path is not None:
        raise ConfigError(
            'kv_connector_extra_config: give "strata" (the store\'s settings) '
            'or "strata_config" (a TOML file of them), not both'
        )
    if path is not None:
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f'kv_connector_extra_config: "strata_config" must name a TOML file, not {path!r}'
            )
        cfg = StoreConfig.from_toml(path)
        return cfg, f"the store of {path}"
    if inline is not None and not isinstance(inline, Mapping):
        raise ConfigError(
            f'kv_connector_extra_config: "strata" must be a mapping of the '
            f"store's settings, not {type(inline).__name__}"
        )
    settings: dict[str, Any] = {"ram_mib": 0, "park": "disk", "page_resume": True}
    said = "the store"
    if not inline or not any(k in inline for k in ("cold_dir", "warm_dir", "levels")):
        settings.update(cold_dir=default_store_dir(), cold_mib=DEFAULT_COLD_MIB, create_dirs=True)
        said = (
            f"the default store: one cold level in {settings['cold_dir']} "
            f"({DEFAULT_COLD_MIB} MiB); set kv_connector_extra_config.strata to choose"
        )
    settings.update(inline or {})
    return StoreConfig.from_mapping(settings), said


def loadable(matched: int, prompt_len: int, block_size: int) -> int:
    """Tokens a request loads from the store: the stored prefix ``matched``, at most all but
    the prompt's last token, floored to whole blocks."""
    n = min(matched, prompt_len - 1)
    return max(0, n - n % block_size)


def saved_tokens(computed: int, n_blocks: int, block_size: int) -> int:
    """Tokens a finished request parks: those vLLM computed, in whole blocks (a page of the
    store is a block; the last, partial block is recomputed by the next turn)."""
    n = min(computed, n_blocks * block_size)
    return n - n % block_size


CHUNK_TOKENS = 256  #: a park is cut at least this often (rounded up to whole blocks)


def save_cuts(n_tokens: int, loaded: int, block_size: int) -> tuple[int, ...]:
    """Segment cuts of a park of ``n_tokens``: every chunk of :data:`CHUNK_TOKENS` (rounded up
    to whole blocks), so that requests sharing a prefix of whole chunks (a system prompt)
    store it once (content keys, spec F-KEY), and where the request resumed from the store
    (``loaded``: its first segments are the stored ones). The next turn of the conversation,
    which extends it, resumes at its end: a segment bound."""
    chunk = block_size * max(1, -(-CHUNK_TOKENS // block_size))
    return tuple(sorted({*range(0, n_tokens, chunk), *(c for c in (loaded,) if 0 < c < n_tokens)}))
