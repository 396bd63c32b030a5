"""What the LMCache storage plugin (:mod:`.lmcache`) reads from LMCache: its settings
(``extra_config``, or a TOML file it names), the levels' model fingerprint and a full chunk's
bytes (LMCache's metadata), and the fields of a chunk key.

The fingerprint (spec F-FP) is the model and the K/V shape and dtype, so a level written for
another model refuses to open (spec F-DIR-6). None of this imports LMCache: it reads the
objects LMCache hands the plugin by their attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratastore.adapters.chunk_levels import chunk_levels, read_toml
from stratastore.adapters.lmcache.chunks import KeyFields
from stratastore.chunks import ChunkConfig, ChunkLevel
from stratastore.errors import ConfigError
from stratastore.format import DType, ModelFingerprint
from stratastore.io.modes import DEFAULT_FILE_MODE

__all__ = [
    "CHUNK_NAME",
    "PLUGIN_KEYS",
    "PLUGIN_MODULE",
    "PluginSettings",
    "chunk_bytes_of",
    "fingerprint_of",
    "key_fields",
]

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


#: LMCache's own keys of a storage plugin (``storage_plugin.<name>.*``): how it loads one
_LMCACHE_KEYS = frozenset({"module_path", "class_name"})
#: the settings the plugin reads: ``storage_plugin.<name>.<key>`` in ``extra_config``, or
#: ``<key>`` in the TOML file ``strata_config`` names (all but ``strata_config`` itself)
PLUGIN_KEYS = frozenset(
    {
        "dir",
        "budget_mib",
        "levels",
        "strata_config",
        "when_full",
        "name",
        "put_threads",
        "read_threads",
    }
)
#: how log lines name a chunk unless ``name`` says otherwise (``ChunkConfig.name``)
CHUNK_NAME = "LMCache chunk"


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """The plugin's settings (``storage_plugin.<name>.*`` of ``extra_config``, or the TOML
    file its ``strata_config`` names): the ``name`` whose ``module_path`` is
    :data:`PLUGIN_MODULE`, the chunk store's levels and what a full one does (``chunks``), the
    thread counts, and how messages name them (``source``; ``budget_key``: the ``budget_mib``
    of the one-directory shorthand, "" for ``levels``).

    The levels are either the shorthand ``dir`` (made absolute, as read) + ``budget_mib``: one
    directory level; or ``levels``: a list of level tables, first (where chunks are put) to
    last (the only one that deletes), each a directory, ``memory://NAME`` or a Redis URL with
    its budget (:func:`~stratastore.adapters.chunk_levels.chunk_levels`); ``when_full`` and
    ``name`` go to the :class:`~stratastore.chunks.ChunkConfig` either way."""

    name: str
    chunks: ChunkConfig
    put_threads: int = 4
    read_threads: int = 4
    source: str = "extra_config storage_plugin.stratastore"
    budget_key: str = "extra_config storage_plugin.stratastore.budget_mib"

    @classmethod
    def from_config(
        cls, extra: Mapping[str, Any] | None, plugins: Sequence[str] | None
    ) -> PluginSettings:
        """Read them; :class:`~stratastore.errors.ConfigError` naming the entry and the fix (a
        key the plugin does not take, ``dir`` and ``levels`` both or neither, a setting given
        both inline and in the ``strata_config`` file, a bad value)."""
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
        given = {k.removeprefix(p): v for k, v in extra.items() if k.startswith(p)}
        unknown = sorted(set(given) - PLUGIN_KEYS - _LMCACHE_KEYS)
        if unknown:
            raise ConfigError(
                f"extra_config {', '.join(p + k for k in unknown)}: not a setting of the "
                f"stratastore plugin; it takes {', '.join(p + k for k in sorted(PLUGIN_KEYS))}"
            )
        source, prefix = f"extra_config {p[:-1]}", f"extra_config {p}"
        toml = given.pop("strata_config", None)
        if toml is not None:
            if not isinstance(toml, str) or not toml:
                raise ConfigError(
                    f"extra_config {p}strata_config = {toml!r}: name a TOML file of the "
                    "plugin's settings"
                )
            from_file = read_toml(toml, f"extra_config {p}strata_config")
            takes = sorted(PLUGIN_KEYS - {"strata_config"})
            unknown = sorted(set(from_file) - set(takes))
            if unknown:
                raise ConfigError(
                    f"{toml}: unknown setting(s) {', '.join(unknown)}; the stratastore plugin "
                    f"takes {', '.join(takes)}"
                )
            both = sorted(set(from_file) & (set(given) - _LMCACHE_KEYS))
            if both:
                raise ConfigError(
                    f"{', '.join(p + k for k in both)} given both in extra_config and in "
                    f"{toml}: keep one"
                )
            split = [
                (a, b)
                for a, b in (("dir", "levels"), ("budget_mib", "levels"))
                if (a in given and b in from_file) or (b in given and a in from_file)
            ]
            if split:
                a, b = split[0]
                inline, filed = (a, b) if a in given else (b, a)
                raise ConfigError(
                    f"extra_config {p}{inline} and {filed} in {toml} are both set: give levels "
                    "(each level with its budget_gib or budget_bytes) or the one-directory "
                    "shorthand dir + budget_mib, in one place"
                )
            given.update(from_file)
            source, prefix = f"{toml} (extra_config {p}strata_config)", f"{toml}: "
        return cls._read(name, given, source, prefix, p if toml is None else "")

    @classmethod
    def _read(
        cls, name: str, given: dict[str, Any], source: str, prefix: str, short: str
    ) -> PluginSettings:
        """The settings from ``given`` (the keys without ``storage_plugin.<name>.``); ``source``
        names where they are in messages, ``prefix + key`` one of them, ``short + key`` another
        one beside it."""

        def number(key: str, default: int | None) -> int:
            v = given.get(key, default)
            if v is None:
                raise ConfigError(
                    f"{prefix}{key} is not set: give the most MiB the plugin's directory may hold"
                )
            try:
                n = int(v)
            except (TypeError, ValueError):
                n = 0
            if n < 1 or isinstance(v, bool) or (isinstance(v, float) and v != n):
                raise ConfigError(f"{prefix}{key} = {v!r}: use a whole number >= 1")
            return n

        if "levels" in given:
            for key in ("dir", "budget_mib"):
                if key in given:
                    raise ConfigError(
                        f"{prefix}{key} and {short}levels are both set: give levels (each "
                        "level with its budget_gib or budget_bytes) or the one-directory "
                        "shorthand dir + budget_mib, not both"
                    )
            levels = chunk_levels(given["levels"], source)
            budget_key = ""
        else:
            path = given.get("dir")
            if not isinstance(path, str) or not path:
                raise ConfigError(
                    f"{prefix}dir is not set: name the directory (on a local disk) where the "
                    f"plugin keeps its chunks, or give {short}levels (its levels, first to "
                    "last) or a strata_config file of them"
                )
            budget = number("budget_mib", None) << 20
            file_mode = {"file_mode": DEFAULT_FILE_MODE}
            levels = (ChunkLevel(str(Path(path).absolute()), budget, settings=file_mode),)
            budget_key = f"{prefix}budget_mib"
        chunk_name = given.get("name", CHUNK_NAME)
        if not isinstance(chunk_name, str) or not chunk_name:
            raise ConfigError(f"{prefix}name = {chunk_name!r}: give a non-empty string")
        try:
            chunks = ChunkConfig(levels, when_full=given.get("when_full", "evict"), name=chunk_name)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        return cls(
            name,
            chunks,
            number("put_threads", 4),
            number("read_threads", 4),
            source,
            budget_key,
        )

    def check_room(self, need: int, chunk: str) -> None:
        """A :class:`~stratastore.errors.ConfigError` naming the budget of the first level
        smaller than ``need`` bytes (one full chunk as stored; ``chunk`` says what makes it
        that size): nothing could be put on it, or moved down into it."""
        for i, lv in enumerate(self.chunks.levels):
            if lv.budget_bytes >= need:
                continue
            if self.budget_key:
                raise ConfigError(
                    f"{self.budget_key} = {lv.budget_bytes >> 20} is smaller than one chunk "
                    f"({need:,} bytes stored, {chunk}): nothing could be stored; use at least "
                    f"{-(-need >> 20) + 1} MiB"
                )
            raise ConfigError(
                f"{self.source}: levels[{i}] ({lv.shown}) has a budget of {lv.budget_bytes:,} "
                f"bytes, smaller than one chunk ({need:,} bytes stored, {chunk}): nothing could "
                f"be stored there; give it a budget_bytes of at least {need:,}"
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
