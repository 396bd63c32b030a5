"""The settings of the SGLang HiCache storage backend (:mod:`.backend`), from SGLang's
``--hicache-storage-backend-extra-config`` (no SGLang import here).

SGLang hands a dynamic backend its whole extra config: its own keys (``backend_name``,
``module_path``, ``class_name``, ``interface_v1``, the prefetch settings...) beside the
backend's. This backend reads these and leaves every other key to SGLang::

    {"backend_name": "strata", "module_path": "stratastore.adapters.sglang",
     "class_name": "StrataHiCacheStorage", "interface_v1": 1,
     "levels": [{"spec": "/nvme/strata-hicache", "budget_gib": 200},
                {"spec": "redis://kv-cache:6379/0", "budget_gib": 64}]}

- ``levels``: the chunk store's levels, first to last (:mod:`~stratastore.adapters.chunk_levels`:
  a directory, ``memory://NAME``, a Redis level shared by several SGLang instances), with their
  budgets and the cascade;
- ``strata_config``: a TOML file holding these settings instead (a setting in both is
  refused);
- ``when_full`` (``evict``, the default, or ``reject``) and ``name`` (the store's name in its
  log lines) as a :class:`~stratastore.chunks.ChunkConfig` takes them;
- ``model``: the weights the K/V comes from, a directory, a file or a hub id (default: SGLang's
  storage model name, its served model name), read for the identity
  (:func:`~stratastore.adapters.vllm.identity.weights_identity`; a name without weight files
  found is the identity by itself, and the backend warns), ``revision`` the hub revision;
- ``kv_cache_dtype``: SGLang's ``--kv-cache-dtype`` where the host pool holds bytes (every fp8
  format is kept as ``uint8``), so that pages of another format are other keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stratastore.adapters.chunk_levels import chunk_levels, read_toml
from stratastore.chunks import ChunkConfig
from stratastore.errors import ConfigError

__all__ = ["BackendSettings", "OURS"]

_WHERE = "the stratastore HiCache backend's extra config"
#: the extra config's keys this backend reads (every other key is SGLang's)
OURS = frozenset(
    {"levels", "strata_config", "when_full", "name", "model", "revision", "kv_cache_dtype"}
)


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """What the backend is configured with (see the module)."""

    chunks: ChunkConfig
    model: str | None = None
    revision: str | None = None
    kv_cache_dtype: str | None = None
    source: str = _WHERE

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> BackendSettings:
        """The settings from SGLang's extra config: :class:`ConfigError` naming the key and
        the fix for a value this backend cannot use, or for no levels at all."""
        given = {k: v for k, v in (extra or {}).items() if k in OURS}
        path = given.pop("strata_config", None)
        where = _WHERE
        if path is not None:
            if not isinstance(path, str) or not path:
                raise ConfigError(f"{_WHERE}: strata_config must name a TOML file, not {path!r}")
            from_file = read_toml(path, _WHERE)
            unknown = sorted(set(from_file) - (OURS - {"strata_config"}))
            if unknown:
                raise ConfigError(
                    f"{path}: unknown setting(s) {', '.join(unknown)}; the backend takes "
                    f"{', '.join(sorted(OURS - {'strata_config'}))}"
                )
            both = sorted(set(from_file) & set(given))
            if both:
                raise ConfigError(f"{_WHERE}: {', '.join(both)} given both inline and in {path}")
            given.update(from_file)
            where = f"{path} (the stratastore HiCache backend's config)"
        levels = chunk_levels(given.get("levels"), where)
        try:
            chunks = ChunkConfig(
                levels,
                when_full=given.get("when_full", "evict"),
                name=given.get("name", "SGLang HiCache"),
            )
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        text = {}
        for key in ("model", "revision", "kv_cache_dtype"):
            value = given.get(key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{where}: {key} = {value!r}; give a non-empty string")
            text[key] = value
        return cls(chunks=chunks, source=where, **text)
