"""What a chunk store counts, one definition: :meth:`ChunkCounters.as_dict` (and the adapters'
stats built on it) come from these fields."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ChunkCounters"]


@dataclass
class ChunkCounters:
    """A chunk store's counts since it was opened (this process's calls only)."""

    puts: int = 0  #: pages committed (durable where the first level is)
    put_bytes: int = 0  #: their payload bytes
    puts_deduped: int = 0  #: puts of a page already held (nothing written)
    puts_refused: int = 0  #: puts not stored: no room beside pinned pages, or refused by a caller
    hits: int = 0  #: pages delivered (validated)
    hit_bytes: int = 0
    misses: int = 0  #: gets of a page not held (or removed meanwhile)
    #: pages whose stored copy failed validation, or whose data file is gone (met by a get or
    #: a put): a miss, logged, removed (a sidecar without its data: set aside, F-DUR-7)
    damaged: int = 0
    read_errors: int = 0  #: gets that failed otherwise (I/O error, closing): a miss, kept
    removes: int = 0  #: pages removed by the engine
    evictions: int = 0  #: pages the last level let go of, oldest first, to keep its budget

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
