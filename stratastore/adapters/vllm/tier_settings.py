"""The settings of the vLLM secondary tier (:mod:`.tier`), from its entry in
``kv_connector_extra_config["secondary_tiers"]`` or a TOML file it names (no vLLM import here).

vLLM hands a tier every key of its entry but ``type``, ``module_path`` and ``backpressure`` as
keyword arguments (``tiering/factory.py``); this module turns them into a
:class:`~stratastore.chunks.ChunkConfig` and the tier's own knobs, refusing anything it does not
know with a :class:`~stratastore.errors.ConfigError` that names the key and the fix::

    {"type": "StrataTier", "module_path": "stratastore.adapters.vllm.tier",
     "levels": [{"spec": "/nvme/strata-kv", "budget_gib": 200},
                {"spec": "redis://kv-cache:6379/0", "budget_gib": 64}]}

or ``{"type": "StrataTier", "module_path": ..., "config": "/etc/strata/tier.toml"}`` with the
same keys in the file (``[[levels]]`` tables). A setting given both inline and in the file is
refused (two values for one setting). A level is a :class:`~stratastore.chunks.ChunkLevel`:
``spec`` (a directory, ``file://PATH``, ``memory://NAME``, ``redis://``, ``rediss://``,
``redis+cluster://``), exactly one of ``budget_bytes`` / ``budget_gib``, ``max_age_s``,
``settings`` (the backend's own: a Redis level's ``name``, ``password``...)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stratastore.adapters.chunk_levels import chunk_levels, read_toml
from stratastore.chunks import ChunkConfig
from stratastore.errors import ConfigError

__all__ = ["HASH_ALGOS", "LOAD_THREADS", "STORE_THREADS", "TierSettings"]

#: vLLM's ``--prefix-caching-hash-algo`` values (``vllm/utils/hashing.py``)
HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

_WHERE = "the StrataTier entry of secondary_tiers"


def _positive_int(name: str, value: object, where: str, *, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where}: {name} = {value!r}; give a whole number >= {least}")
    return value


STORE_THREADS = 4  #: threads storing chunks (each group-commits its own: spec F-DUR-2)
LOAD_THREADS = 16  #: threads loading chunks: the reads in flight at once on a cold load


@dataclass(frozen=True, slots=True)
class TierSettings:
    """What the tier is configured with (see the module). ``store_threads`` / ``load_threads``:
    the threads that write chunks into the levels and read them into primary slots (the
    scheduler's thread never does I/O). Loads default to :data:`LOAD_THREADS`: each thread has
    one read at a time in flight, and a cold load is as fast as the reads the device is given at
    once (vLLM's ``fs`` tier defaults to 16 too); ``max_pending_stores``: chunks a store may queue
    behind those in progress before a new store job is dropped (counted in
    ``stores_dropped``; vLLM recomputes nothing for it, the chunk is just not in this tier);
    ``shutdown_timeout_s``: how long ``shutdown`` waits for the stores in progress;
    ``enable_kv_events``: ``BlockStored`` / ``BlockRemoved`` events (medium STORAGE) when vLLM
    publishes KV events; ``hash_algo``: vLLM's prefix-caching hash when the tier is built
    without a vLLM config (a test, a benchmark); with one, vLLM's setting is used and a
    different value here is a :class:`ConfigError`."""

    chunks: ChunkConfig
    store_threads: int = STORE_THREADS
    load_threads: int = LOAD_THREADS
    max_pending_stores: int = 1024
    shutdown_timeout_s: float = 60.0
    enable_kv_events: bool = False
    locality: str | None = None
    hash_algo: str | None = None
    source: str = _WHERE

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> TierSettings:
        """The settings from the tier entry's keyword arguments (``config`` names a TOML file
        of them); a key not listed in the module is a :class:`ConfigError` naming it."""
        given = dict(kwargs)
        path = given.pop("config", None)
        where = _WHERE
        if path is not None:
            if not isinstance(path, str) or not path:
                raise ConfigError(f"{_WHERE}: config must name a TOML file, not {path!r}")
            from_file = read_toml(path, _WHERE)
            both = sorted(set(from_file) & set(given))
            if both:
                raise ConfigError(
                    f"{_WHERE}: {', '.join(both)} given both inline and in {path}: keep one"
                )
            given.update(from_file)
            where = f"{path} (the StrataTier config)"
        return cls._from_mapping(given, where)

    @classmethod
    def _from_mapping(cls, doc: dict[str, Any], where: str) -> TierSettings:
        known = {
            "levels",
            "when_full",
            "name",
            "store_threads",
            "load_threads",
            "max_pending_stores",
            "shutdown_timeout_s",
            "enable_kv_events",
            "locality",
            "hash_algo",
        }
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; the tier takes "
                f"{', '.join(sorted(known | {'config'}))}"
            )
        levels = chunk_levels(doc.get("levels"), where)
        when_full = doc.get("when_full", "evict")
        try:
            chunks = ChunkConfig(levels, when_full=when_full, name=doc.get("name", "vLLM chunk"))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        timeout = doc.get("shutdown_timeout_s", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"{where}: shutdown_timeout_s = {timeout!r}; give seconds > 0")
        events = doc.get("enable_kv_events", False)
        if not isinstance(events, bool):
            raise ConfigError(f"{where}: enable_kv_events = {events!r}; give true or false")
        locality = doc.get("locality")
        if locality not in (None, "LOCAL", "REMOTE"):
            raise ConfigError(f"{where}: locality = {locality!r}; give LOCAL or REMOTE")
        algo = doc.get("hash_algo")
        if algo is not None and algo not in HASH_ALGOS:
            raise ConfigError(
                f"{where}: hash_algo = {algo!r}; give vLLM's prefix_caching_hash_algo, one of "
                f"{', '.join(HASH_ALGOS)}"
            )
        return cls(
            chunks=chunks,
            store_threads=_positive_int(
                "store_threads", doc.get("store_threads", STORE_THREADS), where
            ),
            load_threads=_positive_int(
                "load_threads", doc.get("load_threads", LOAD_THREADS), where
            ),
            max_pending_stores=_positive_int(
                "max_pending_stores", doc.get("max_pending_stores", 1024), where
            ),
            shutdown_timeout_s=float(timeout),
            enable_kv_events=events,
            locality=locality,
            hash_algo=algo,
            source=where,
        )
