"""What the vLLM secondary tier (:mod:`.tier`) keys its chunks by, and the model they belong to
(no vLLM import here: the tier hands in plain values).

* **The model** (spec F-FP): a chunk is one row of vLLM's CPU primary tier: the K/V of
  ``blocks_per_chunk`` blocks of every layer of a KV-cache group, for every worker, in vLLM's
  layout. Its bytes depend on the weights (:func:`~.identity.weights_identity`: every byte of
  the weight files, not their path), the model's config (:func:`~.identity.config_digest`), the
  K/V dtype and layout, the groups' block sizes and layers, the chunk geometry and the
  parallel layout (unless vLLM calls the bytes parallelism-agnostic). All of it goes into the
  fingerprint's ``extra``: a level written for anything else refuses the tier at start
  (:class:`~stratastore.format.IncompatibleFingerprint`), so no chunk of another model or
  layout can reach a primary slot.
* **The key**: vLLM's ``OffloadKey`` (the block hash of the chunk's last block, then the
  4-byte group index) under the namespace ``vllm-offload-v1;hash=<algo>``, through
  :func:`~stratastore.chunks.chunk_key`. A block hash chains over every token before it, so
  equal keys mean equal prefixes.
* **Stable block hashes** (:func:`hash_problem`): vLLM seeds its block-hash chain (``NONE_HASH``,
  ``vllm/v1/core/kv_cache_utils.py``) from ``PYTHONHASHSEED`` when it is set, else from a fixed
  seed for ``sha256`` / ``sha256_cbor`` and from fresh random bytes in each process for
  ``xxhash`` / ``xxhash_cbor``: with those and no ``PYTHONHASHSEED``, no chunk stored by one
  process would ever be found by the next."""

from __future__ import annotations

from dataclasses import dataclass

from stratastore.adapters.vllm.identity import config_digest, weights_identity
from stratastore.chunks import chunk_key
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint

__all__ = ["TierModel", "hash_problem", "offload_chunk_key", "unstable_seed_problem"]

#: vLLM's hash algorithms whose seed is random per process unless PYTHONHASHSEED is set
_RANDOM_SEEDED = ("xxhash", "xxhash_cbor")
_DTYPES = {
    "float16": DType.FLOAT16,
    "half": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16,
    "float32": DType.FLOAT32,
    "float": DType.FLOAT32,
    "fp8": DType.FLOAT8_E4M3,
    "fp8_e4m3": DType.FLOAT8_E4M3,
    "fp8_e5m2": DType.FLOAT8_E5M2,
    "int8": DType.INT8,
}


def hash_problem(algo: str, pythonhashseed: str | None) -> ConfigError | None:
    """The :class:`ConfigError` (returned, not raised) for vLLM's prefix-caching hash ``algo``
    when its block hashes would differ from one process to the next (see the module); None
    when they are stable."""
    if algo in _RANDOM_SEEDED and pythonhashseed is None:
        return ConfigError(
            f"StrataTier: vLLM's prefix_caching_hash_algo is {algo!r} and PYTHONHASHSEED is not "
            "set, so vLLM seeds its block hashes with random bytes in each process and no chunk "
            "this tier stores would be found after a restart or by another instance: use "
            "--prefix-caching-hash-algo sha256 (the default) or sha256_cbor, or set "
            "PYTHONHASHSEED to one value for every vLLM process sharing the tier"
        )
    return None


def unstable_seed_problem(
    seed: str, default_seed: str, pythonhashseed: str | None
) -> ConfigError | None:
    """The :class:`ConfigError` (returned) when the seed vLLM resolved for its block hashes
    (``get_none_hash_seed()``) is neither ``PYTHONHASHSEED`` nor vLLM's fixed default: a
    random one (see :func:`hash_problem`)."""
    if seed == (pythonhashseed if pythonhashseed is not None else default_seed):
        return None
    return ConfigError(
        "StrataTier: vLLM seeded its block hashes with random bytes (a non-cryptographic "
        "prefix_caching_hash_algo without PYTHONHASHSEED), so no chunk would be found after a "
        "restart: the tier stores and serves nothing. Use --prefix-caching-hash-algo sha256 "
        "(or sha256_cbor), or set PYTHONHASHSEED for every vLLM process sharing the tier"
    )


def offload_chunk_key(offload_key: bytes, algo: str) -> bytes:
    """The chunk key of vLLM's ``OffloadKey`` (block hash + group index) under the hash
    algorithm ``algo`` (see the module)."""
    return chunk_key(offload_key, namespace=f"vllm-offload-v1;hash={algo}")


@dataclass(frozen=True, slots=True)
class TierModel:
    """What determines a chunk's bytes (see the module), from vLLM's ``OffloadingConfig`` and,
    where the tier sees it, the model's Hugging Face config."""

    model: str  #: vLLM's model: a directory, a file or a hub id
    revision: str | None
    hf_config: dict[str, object] | None
    dtype: str
    kv_cache_layout: str
    groups: tuple[tuple[int, int], ...]  #: (tokens per block, layers) of each group
    tokens_per_hash: int
    blocks_per_chunk: int
    worker_kv_bytes_per_block: int
    row_bytes: int  #: one chunk: a row of the primary tier
    parallel: str  #: the parallel layout, or "agnostic"
    canonical_layout: bool
    replicated_layout: bool

    def fingerprint(self) -> ModelFingerprint:
        """The model fingerprint the tier's levels are opened for (spec F-FP)."""
        weights = weights_identity(self.model, self.revision)
        config = config_digest(self.hf_config).hex() if self.hf_config is not None else ""
        groups = ",".join(f"{t}x{n}" for t, n in self.groups)
        extra = (
            f"vllm-offload-tier-v1;config={config};dtype={self.dtype};"
            f"layout={self.kv_cache_layout};groups={groups};tokens_per_hash="
            f"{self.tokens_per_hash};blocks_per_chunk={self.blocks_per_chunk};"
            f"worker_kv_bytes_per_block={self.worker_kv_bytes_per_block};row_bytes="
            f"{self.row_bytes};parallel={self.parallel};canonical={int(self.canonical_layout)};"
            f"replicated={int(self.replicated_layout)}"
        ).encode()
        tokens = self.groups[0][0] * self.blocks_per_chunk if self.groups else 1
        return ModelFingerprint.create(
            f"{weights}@{self.revision or ''}",
            n_layers=max(1, min(4096, sum(n for _, n in self.groups))),
            n_kv_heads=1,
            head_dim=1,
            page_tokens=max(1, min(1 << 20, tokens)),
            dtype=_DTYPES.get(self.dtype.lower().removeprefix("torch."), DType.INT8),
            extra=extra,
        )
