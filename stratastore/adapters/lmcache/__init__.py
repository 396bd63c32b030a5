"""stratastore as a storage plugin of LMCache 0.5.6: LMCache's chunks kept durable, validated
and within byte budgets on the levels of a stratastore chunk store (a directory, or several
levels: directories, ``memory://``, a Redis level several engines share).

Configuration (LMCache's ``storage_plugins`` and ``extra_config``; docs/engine.md has the
snippet)::

    storage_plugins: ["stratastore"]
    extra_config:
      storage_plugin.stratastore.module_path: stratastore.adapters.lmcache
      storage_plugin.stratastore.class_name: StrataStoragePlugin
      storage_plugin.stratastore.dir: /nvme/strata-lmcache     # one directory per model
      storage_plugin.stratastore.budget_mib: 102400
      storage_plugin.stratastore.put_threads: 4                # optional
      storage_plugin.stratastore.read_threads: 4               # optional

or, instead of ``dir`` + ``budget_mib``, the chunk store's levels, first to last (each a table
of :func:`~stratastore.adapters.chunk_levels.chunk_levels`; chunks are put on the first, a full
level moves its oldest down, only the last deletes)::

      storage_plugin.stratastore.levels:
        - {spec: /nvme/strata-lmcache, budget_gib: 100}
        - {spec: "redis://kv-cache:6379/0", budget_gib: 64, settings: {name: lmcache}}
      storage_plugin.stratastore.when_full: evict              # optional: or reject
      storage_plugin.stratastore.name: LMCache chunk           # optional: in log lines

or ``storage_plugin.stratastore.strata_config: /etc/strata/lmcache.toml``, a TOML file holding
these settings (without the prefix). Exactly one of ``dir`` and ``levels``; a key the plugin
does not take, or one given both inline and in the file, is a
:class:`~stratastore.errors.ConfigError` naming it (:class:`.config.PluginSettings`).

- **Keys**: each LMCache chunk key is stored under a key derived from its fields
  (:func:`~stratastore.adapters.lmcache.chunks.chunk_id`: model, world size, worker, chunk
  hash, dtype, layer, tags), never from Python's ``hash()``: a new process finds what an
  earlier one stored. (The chunk hashes are LMCache's: under vLLM its ``sha256_cbor``; without
  vLLM Python's ``hash()`` of the tokens, so set one ``PYTHONHASHSEED`` for every process.)
- **Durable**: ``batched_submit_put_task`` returns at once with one ``Future`` a chunk; the
  chunk is written on the plugin's writer threads. **A put is durable when its Future is done
  with the result True** (then ``on_complete_callback(key)`` has been called and ``contains``
  finds the chunk): on a directory first level its data file was fsynced and renamed in, the
  directory fsynced, its sidecar written durably (fsync, rename, directory fsync) and indexed
  (spec F-DUR); a put is as durable as the first level is (``memory://`` is not). Before
  that a crash loses the chunk whole, never part of it. False: not stored (no room beside
  pinned chunks, or another layout; counted in ``puts_refused``); an exception: the write
  failed. :meth:`StrataStoragePlugin.flush` waits for every put submitted so far and raises
  :class:`PutsFailed` for those that failed (:class:`FlushTimeout` when its timeout passed
  first); ``close`` waits for them too, and puts submitted once it stopped accepting them are
  not started (their Futures are done with False; no reference is taken on the memory object).
- **Validated**: a get delivers a memory object only after every page of the chunk was
  BLAKE3-hashed in that memory; a chunk whose files fail validation is a miss (LMCache then
  stops the retrieve there, so its successors are not used either), counted in ``damaged``,
  logged, and removed (only if its files are still the ones that failed). A read that fails
  otherwise (an I/O error) is a miss counted in ``read_errors``; the chunk is kept.
- **Budget**: puts make room on the first level within its budget: with one level the oldest
  chunks (by seal time) are evicted; with several, a full level moves its oldest chunks down
  to the next and only the last evicts. Pinned chunks (``contains(pin=True)``, ``pin``) are
  never evicted until unpinned (they may move down a level); a chunk that cannot fit is not
  stored (``puts_refused``). ``remove`` keeps the accounting exact: a directory's bytes come
  from its index, updated in the same transaction as the delete.
- **Event loop**: ``batched_get_non_blocking`` runs its reads on a thread, never on LMCache's
  loop; ``get_non_blocking`` returns a ``Future`` of the plugin's reader threads;
  ``batched_async_contains`` answers from the levels' indexes on the loop (no chunk or
  sidecar file is read there, but a directory's LMDB index is, which may touch the disk, and
  a chunk no level above holds is looked up on a Redis level: a round trip). ``close``
  waits for the reads in flight; gets after it began are misses.
- **Memory**: a get allocates LMCache memory objects for a prefix one chunk at a time and
  returns the longest prefix it could allocate (only the first chunk of a blocking get waits
  for memory): it never waits for memory it holds itself.
- **Stats**: :meth:`StrataStoragePlugin.stats` (``PluginCounters`` plus what the levels
  hold), :meth:`StrataStoragePlugin.prometheus`.

Chunks carrying ``cached_positions`` (CacheBlend) are not stored (``puts_refused``).

What the plugin reads from LMCache (its settings, the levels' fingerprint, a chunk key's
fields) is in :mod:`.config`; the chunks in :mod:`.store`: a chunk store
(:mod:`stratastore.chunks`) on the levels, whose budgets, cascade, eviction, pins and validated
reads are the chunk layer's, and the layout record it keeps for the plugin.

Only :mod:`.plugin` (and :mod:`.cpu`, the test connector) import LMCache: the plugin is imported
when it is first named, so :mod:`.chunks`, :mod:`.config` and :mod:`.store` need no extra."""

from typing import Any

__all__ = [
    "FlushTimeout",
    "PluginSettings",
    "PutsFailed",
    "StrataStoragePlugin",
    "fingerprint_of",
    "key_fields",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stratastore.adapters.lmcache import plugin

        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
