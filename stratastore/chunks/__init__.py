"""The chunk layer: pages keyed by content, for engines that key their cache by hash (LMCache's
chunks, SGLang HiCache's ``get/set/exists`` by page hash), on the same levels, budgets, cascade
and remote level as :class:`~stratastore.Store` (docs/chunks.md).

* :mod:`~stratastore.chunks.store`: :class:`ChunkStore` (put, get into the engine's buffer,
  exists, batches, pins, removal, GC, stats);
* :mod:`~stratastore.chunks.puts`: puts, committed together on a directory level;
* :mod:`~stratastore.chunks.config`: :class:`ChunkConfig`, :class:`ChunkLevel` (its levels);
* :mod:`~stratastore.chunks.keys`: chunk keys and the segment a page is stored as;
* :mod:`~stratastore.chunks.room`: the budgets and the cascade (the disk levels of
  :mod:`stratastore.levels.cascade`), puts in flight, pins;
* :mod:`~stratastore.chunks.reads`: the validated read into the caller's memory;
* :mod:`~stratastore.chunks.kept`: records an adapter keeps beside its pages (never evicted);
* :mod:`~stratastore.chunks.counters`: what it counts.
"""

from stratastore.chunks.config import ChunkConfig, ChunkLevel
from stratastore.chunks.counters import ChunkCounters
from stratastore.chunks.kept import KeptRecordConflict
from stratastore.chunks.keys import ChunkKeyError, chunk_key, stored_key
from stratastore.chunks.puts import BatchMismatch
from stratastore.chunks.reads import OpenChunk
from stratastore.chunks.room import stored_bytes
from stratastore.chunks.store import ChunkStore, ChunkStoreClosed, PutOutcome

__all__ = [
    "BatchMismatch",
    "ChunkConfig",
    "ChunkCounters",
    "ChunkKeyError",
    "ChunkLevel",
    "ChunkStore",
    "ChunkStoreClosed",
    "KeptRecordConflict",
    "OpenChunk",
    "PutOutcome",
    "chunk_key",
    "stored_bytes",
    "stored_key",
]
