"""What the vLLM connector decides, apart from vLLM itself (no vLLM or torch import here).

* **The model** (spec F-FP): what determines the K/V, never where the files lie: the weights'
  identity and a digest of the config (:mod:`.identity`), the revision, layers, kv heads, head
  size, the K/V dtype, the tensor-parallel size and the attention backend, with the store's
  page (:func:`page_tokens`, 16 tokens by default) as the page size. A store directory written
  for another model refuses the connector at start-up.
* **The page** (:func:`page_tokens`): the connector's choice, independent of vLLM's block (128
  tokens on vLLM's CPU backend): a block holds whole pages, and a request loads and parks whole
  pages, so a prompt resumes at its deepest stored page, not its deepest block.
* **The store** (:func:`store_config`): ``kv_connector_extra_config["strata"]`` holds the
  Store's own settings, or ``"strata_config"`` names a TOML file of them; with neither, one
  cold disk level under the user's cache directory. Parks go to disk (a restart keeps them)
  and pages are resume points (``page_resume``), unless the settings say otherwise.
* **How much a request loads** (:func:`loadable`): the deepest stored prefix of its prompt, in
  whole pages, never the whole prompt (vLLM computes at least its last token); in whole vLLM
  blocks with ``"load_whole_blocks": true`` (:func:`load_unit`): the prefix vLLM's own prefix
  cache would hold, so the tokens left are computed in the same split as with vLLM keeping
  the conversation (bit for bit its tokens, where the model's greedy choice turns on the last
  bits of how a prefill is split).
* **What a request parks** (:func:`saved_tokens`, :func:`save_cuts`): the whole pages of its
  prompt once vLLM has computed them, then every whole page whose K/V vLLM computed when it
  finishes, cut into chunks and where it resumed from the store, so that a shared prefix and
  the next turn of the conversation share those segments (content keys)."""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.adapters.vllm.identity import config_digest
from stratastore.config import MAX_CONFIG_BYTES, StoreConfig
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint
from stratastore.io import files, pathnames
from stratastore.io.system import env_var

__all__ = [
    "CONNECTOR_DEFAULTS",
    "DEFAULT_PAGE_TOKENS",
    "LoadJob",
    "SaveJob",
    "conversation_id",
    "default_store_dir",
    "fingerprint",
    "keyable",
    "load_unit",
    "loadable",
    "page_tokens",
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
DEFAULT_PAGE_TOKENS = 16  #: the store's page when vLLM's block holds a whole number of them
#: (else their greatest common divisor: :func:`page_tokens`)
#: the connector's settings where the store's (inline or in a TOML file) say nothing: parks go
#: to disk (a restart keeps them), no RAM level, every page a resume point
CONNECTOR_DEFAULTS: dict[str, Any] = {"ram_mib": 0, "park": "disk", "page_resume": True}


@dataclass(frozen=True)
class LoadJob:
    """Load ``tokens`` (the prompt's first ``len(tokens)`` ids, whole pages) into the request's
    ``block_ids`` (from block 0, as many as the tokens need), skipping the first ``skip``
    tokens (vLLM's own prefix cache computed them: its blocks may be shared, never written)."""

    req_id: str
    tokens: npt.NDArray[np.uint32]
    block_ids: tuple[int, ...]
    skip: int


@dataclass(frozen=True)
class SaveJob:
    """Park ``tokens`` (whole pages whose K/V vLLM computed) of conversation ``conv_id`` from
    the request's ``block_ids``, cut at ``cuts``. ``held``: the request finished and vLLM
    keeps its blocks until the worker reports the job done (:meth:`get_finished`), so they
    are copied on the worker's saver thread; otherwise (a prompt just computed, the request
    still running) they are copied within the step, before vLLM may reuse them."""

    req_id: str
    conv_id: str
    tokens: npt.NDArray[np.uint32]
    block_ids: tuple[int, ...]
    cuts: tuple[int, ...] = field(default=(0,))
    held: bool = True


def conversation_id(prompt: npt.NDArray[np.uint32], req_id: str) -> str:
    """A request's conversation id: a digest of its prompt and vLLM's request id (vLLM
    requests carry no conversation id). The park of its computed prompt and the park when it
    finishes share it, so the second extends the first; another request with the same prompt
    (a retry, ``n > 1``) parks a conversation of its own, never cutting this one's reply off
    (their equal pages are stored once all the same: content keys)."""
    digest = hashlib.blake2b(prompt.tobytes(), digest_size=16)
    digest.update(req_id.encode())
    return "vllm-" + digest.hexdigest()


def keyable(request: object) -> bool:
    """Whether a request's K/V is a function of its token ids alone, which is what the store
    keys it by: not with a LoRA adapter, pictures or other media, prompt embeddings in place of
    tokens, or a ``cache_salt`` (vLLM keeps salted prefixes from other tenants; so does the
    connector, by not storing or loading them). Works on vLLM's ``Request`` and
    ``NewRequestData`` alike."""
    return bool(
        getattr(request, "prompt_token_ids", None) is not None
        and getattr(request, "lora_request", None) is None
        and not getattr(request, "mm_features", None)
        and getattr(request, "prompt_embeds", None) is None
        and not getattr(request, "cache_salt", None)
    )


def _dtype(name: object) -> DType:
    text = str(name).removeprefix("torch.")
    if text not in _DTYPES:
        raise ConfigError(
            f"StrataConnector: vLLM's K/V dtype {text!r} is not one the store "
            f"keeps ({', '.join(sorted(_DTYPES))})"
        )
    return _DTYPES[text]


def fingerprint(
    weights: str,
    revision: str | None,
    hf_config: Mapping[str, Any],
    *,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    page_tokens: int,
    dtype: object,
    tp_size: int = 1,
    backend: str = "",
) -> ModelFingerprint:
    """The model fingerprint of a vLLM engine's K/V (see the module): its id the ``weights``'
    identity (:func:`.identity.weights_identity`) at ``revision``, its ``extra`` the config's
    digest (:func:`.identity.config_digest`: a :class:`ConfigError` for a config it cannot
    digest), the tensor-parallel size (each rank keeps its own heads) and the attention
    ``backend`` (on the CPU its ISA). Nothing in it depends on the model's path or served
    name, nor on vLLM's block size (a page's bytes do not)."""
    extra = f"vllm;tp={tp_size};backend={backend};config=".encode() + config_digest(hf_config)
    return ModelFingerprint.create(
        f"{weights}@{revision or ''}",
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        page_tokens=page_tokens,
        dtype=_dtype(dtype),
        extra=extra,
    )


def page_tokens(extra: Mapping[str, Any] | None, block_size: int) -> int:
    """The store's page size in tokens: ``kv_connector_extra_config["page_tokens"]`` when
    given, else the greatest common divisor of :data:`DEFAULT_PAGE_TOKENS` and vLLM's block:
    16 for every block that is a multiple of 16 (vLLM's are), else a power of two that divides
    the block (8 for a block of 24, not 12, its largest divisor up to 16). That default stays
    as it is: the page is part of the model's fingerprint (spec F-FP), so a store written with
    it would refuse the connector if it changed. A page must divide vLLM's block (a block
    holds whole pages): anything else is a :class:`ConfigError` naming the fix."""
    given = dict(extra or {}).get("page_tokens")
    if given is None:
        return math.gcd(DEFAULT_PAGE_TOKENS, block_size)
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise ConfigError(
            f'kv_connector_extra_config: "page_tokens" must be a positive integer, not {given!r}'
        )
    if block_size % given:
        raise ConfigError(
            f'kv_connector_extra_config: "page_tokens" = {given} does not divide vLLM\'s '
            f"block of {block_size} tokens; choose a divisor of it (16 by default)"
        )
    return given


def load_unit(extra: Mapping[str, Any] | None, block_size: int, page: int) -> int:
    """The tokens a load is a whole number of: the store's ``page`` (the default: a request
    resumes at its deepest stored page), or vLLM's ``block_size`` with
    ``kv_connector_extra_config["load_whole_blocks"] = true`` (it resumes where vLLM's own
    prefix cache would: see the module). Anything but a boolean is a :class:`ConfigError`."""
    given = dict(extra or {}).get("load_whole_blocks", False)
    if not isinstance(given, bool):
        raise ConfigError(
            f'kv_connector_extra_config: "load_whole_blocks" must be true or false, not {given!r}'
        )
    return block_size if given else page


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
        StoreConfig.from_toml(path)  # the file's own mistakes, named as the CLI names them
        doc = tomllib.loads(files.read_file(files.realpath(path), MAX_CONFIG_BYTES).decode())
        cfg = StoreConfig.from_mapping({**CONNECTOR_DEFAULTS, **doc}, path)
        return cfg, f"the store of {path}"
    if inline is not None and not isinstance(inline, Mapping):
        raise ConfigError(
            f'kv_connector_extra_config: "strata" must be a mapping of the '
            f"store's settings, not {type(inline).__name__}"
        )
    settings: dict[str, Any] = dict(CONNECTOR_DEFAULTS)
    said = "the store"
    if not inline or not any(k in inline for k in ("cold_dir", "warm_dir", "levels")):
        settings.update(cold_dir=default_store_dir(), cold_mib=DEFAULT_COLD_MIB, create_dirs=True)
        said = (
            f"the default store: one cold level in {settings['cold_dir']} "
            f"({DEFAULT_COLD_MIB} MiB); set kv_connector_extra_config.strata to choose"
        )
    settings.update(inline or {})
    return StoreConfig.from_mapping(settings), said


def loadable(matched: int, prompt_len: int, page: int) -> int:
    """Tokens a request loads from the store: the stored prefix ``matched``, at most all but
    the prompt's last token, floored to whole pages."""
    n = min(matched, prompt_len - 1)
    return max(0, n - n % page)


def saved_tokens(computed: int, capacity: int, page: int) -> int:
    """Tokens a request parks: those vLLM computed that its blocks hold (``capacity``), in
    whole pages (the last, partial page is recomputed by the next turn)."""
    n = min(computed, capacity)
    return max(0, n - n % page)


CHUNK_TOKENS = 256  #: a park is cut at least this often (rounded up to whole pages)


def save_cuts(n_tokens: int, page: int, *resumed: int) -> tuple[int, ...]:
    """Segment cuts of a park of ``n_tokens``: every chunk of :data:`CHUNK_TOKENS` (rounded up
    to whole pages), so that requests sharing a prefix of whole chunks (a system prompt)
    store it once (content keys, spec F-KEY), and each point in ``resumed`` inside the park
    (where the request resumed from the store, where its prompt's park ended): those first
    segments are the stored ones. The next turn of the conversation, which extends it,
    resumes at its end: a segment bound."""
    chunk = page * max(1, -(-CHUNK_TOKENS // page))
    inside = (c for c in resumed if 0 < c < n_tokens)
    return tuple(sorted({*range(0, n_tokens, chunk), *inside}))
