"""What the LMCache storage plugin (:mod:`.lmcache`) reads from LMCache: its settings
(``extra_config``), the directory's model fingerprint and a full chunk's bytes (LMCache's
metadata), and the fields of a chunk key.

The fingerprint (spec F-FP) is the model and the K/V shape and dtype, so a directory written
for another model refuses to open (spec F-DIR-6). None of this imports LMCache: it reads the
objects LMCache hands the plugin by their attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratastore.adapters.lmcache.chunks import KeyFields
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint

__all__ = ["PLUGIN_MODULE", "PluginSettings", "chunk_bytes_of", "fingerprint_of", "key_fields"]

#: the module LMCache loads the plugin from (``storage_plugin.<name>.module_path``)
PLUGIN_MODULE = "stratastore.adapters.lmcache"

_DTYPES = {
    "torch.float16": DType.FLOAT16,
    "torch.bfloat16": DType.BFLOAT16,
    "torch.float32": DType.FLOAT32,
    "torch.float8_e4m3fn": DType.FLOAT8_E4M3,
    "torch.float8_e5m2": DType.FLOAT8_E5M2,
    "torch.int8": DType.INT8,
    "torch.uint8": DType.INT8,
}


def chunk_bytes_of(metadata: Any) -> int:
    """The payload bytes of one full chunk of LMCache's metadata (``kv_shape`` x dtype)."""
    n = 1
    for d in metadata.kv_shape:
        n *= int(d)
    return n * int(getattr(metadata.kv_dtype, "itemsize", 1))


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The plugin's ``extra_config`` entries (``storage_plugin.<name>.*``): the ``name`` whose
    ``module_path`` is :data:`PLUGIN_MODULE`, its directory ``path`` (made absolute, as read),
    the budget and the thread counts."""

    name: str
    path: str
    budget_bytes: int
    put_threads: int = 4
    read_threads: int = 4

    @classmethod
    def from_config(
        cls, extra: Mapping[str, Any] | None, plugins: Sequence[str] | None
    ) -> PluginSettings:
        """Read them; :class:`~stratastore.errors.ConfigError` naming the entry and the fix."""
        extra = extra or {}
        mine = [
            n
            for n in plugins or ()
            if extra.get(f"storage_plugin.{n}.module_path") == PLUGIN_MODULE
        ]
        if len(mine) > 1:
            raise ConfigError(
                f"storage_plugins {mine} all load {PLUGIN_MODULE}; use one (one "
                "directory per engine)"
            )
        name = mine[0] if mine else "stratastore"
        p = f"storage_plugin.{name}."
        path = extra.get(p + "dir")
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"extra_config {p}dir is not set: name the directory (on a local "
                "disk) where the plugin keeps its chunks"
            )

        def number(key: str, default: int | None) -> int:
            v = extra.get(p + key, default)
            if v is None:
                raise ConfigError(
                    f"extra_config {p}{key} is not set: give the most MiB the "
                    "plugin's directory may hold"
                )
            try:
                n = int(v)
            except (TypeError, ValueError):
                n = 0
            if n < 1 or isinstance(v, bool) or (isinstance(v, float) and v != n):
                raise ConfigError(f"extra_config {p}{key} = {v!r}: use a whole number >= 1")
            return n

        return cls(
            name,
            str(Path(path).absolute()),
            number("budget_mib", None) << 20,
            number("put_threads", 4),
            number("read_threads", 4),
        )


def fingerprint_of(metadata: Any) -> ModelFingerprint:
    """The directory's model fingerprint, from LMCache's metadata (model, K/V shape and dtype):
    a directory written for another model refuses to open (``IncompatibleFingerprint``)."""
    if metadata is None:
        raise ConfigError(
            "the LMCache metadata is missing: the plugin must be loaded by "
            "LMCache's storage manager (storage_plugins)"
        )
    layers, kv, _, heads, head_dim = (int(d) for d in metadata.kv_shape)
    dtype = _DTYPES.get(str(metadata.kv_dtype))
    if dtype is None:
        raise ConfigError(
            f"K/V dtype {metadata.kv_dtype} is not one the plugin stores; use "
            f"one of {', '.join(sorted(_DTYPES))}"
        )
    extra = f"stratastore LMCache plugin chunks v1; kv={kv}; dtype={metadata.kv_dtype}".encode()
    return ModelFingerprint.create(
        f"lmcache:{metadata.model_name}",
        n_layers=layers,
        n_kv_heads=heads,
        head_dim=head_dim,
        page_tokens=16,
        dtype=dtype,
        extra=extra,
    )


def key_fields(key: Any) -> KeyFields:
    """The fields of an LMCache ``CacheEngineKey`` / ``LayerCacheEngineKey``."""
    return KeyFields(
        str(key.model_name),
        int(key.world_size),
        int(key.worker_id),
        key.chunk_hash if isinstance(key.chunk_hash, bytes) else int(key.chunk_hash),
        str(key.dtype),
        int(getattr(key, "layer_id", -1)),
        tuple((str(k), str(v)) for k, v in key.tags or ()),
    )
