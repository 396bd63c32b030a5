"""A chunk store's ``room.on_evicted``: the stored key of every page this process's eviction deletes
from the last level is handed to the callback (the vLLM tier's ``BlockRemoved`` events), and
nothing else is (a page moved down a level is not deleted)."""

from __future__ import annotations

from pathlib import Path

from stratastore import ChunkConfig, ChunkLevel, ChunkStore, ModelFingerprint
from stratastore.chunks import chunk_key, stored_bytes, stored_key

FP = ModelFingerprint.create("m@r", n_layers=1, n_kv_heads=1, head_dim=8, page_tokens=4)
PAGE = b"x" * 4096


def test_evictions_from_the_last_level_are_seen(tmp_path: Path) -> None:
    two = stored_bytes(len(PAGE)) * 2
    config = ChunkConfig(
        (ChunkLevel(str(tmp_path / "a"), two), ChunkLevel(str(tmp_path / "b"), two))
    )
    seen: list[bytes] = []
    with ChunkStore.open(config, FP) as store:
        store.room.on_evicted = seen.append
        keys = [chunk_key(f"page {i}") for i in range(6)]
        for k in keys:
            assert store.put(k, PAGE) == "stored"
        # 6 pages, 4 fit: the two oldest were degraded, then deleted from the last level
        assert seen == [stored_key(k) for k in keys[:2]]
        assert store.stats()["degradations"] >= 2
        store.room.on_evicted = None
        store.put(chunk_key("page 6"), PAGE)
        assert len(seen) == 2
