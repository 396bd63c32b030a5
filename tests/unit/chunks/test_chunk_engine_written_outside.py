"""An engine that keys its cache by page hash, written here from the package's public API alone
(no package file changed for it): a small SGLang-HiCache-like storage (``set``/``get``/``exists``
by page hash, ``batch_exists`` as a prefix count, ``batch_set``/``batch_get`` into the engine's
host buffers) over :class:`stratastore.ChunkStore`. On a directory level and on ``memory://``
it round-trips pages bit for bit; a damaged page is refused (a miss, never wrong bytes); a full
first level degrades into a second; a pinned page survives eviction."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import stratastore
from stratastore.chunks import chunk_key, stored_bytes, stored_key
from stratastore.format import data_name

PAGE_TOKENS, TOKEN_BYTES = 16, 1024  #: a page of 16 tokens of 1 KiB (16 KiB)
PAGE = PAGE_TOKENS * TOKEN_BYTES
FP = stratastore.ModelFingerprint.create(
    "outside/hicache", n_layers=2, n_kv_heads=2, head_dim=64, page_tokens=PAGE_TOKENS
)


class HiCachePages:
    """SGLang HiCache's storage interface over a chunk store: pages named by the engine's
    page hash (a hex string), held at ``chunk_key(hash, namespace=...)``."""

    def __init__(self, store: stratastore.ChunkStore, namespace: str = "hicache") -> None:
        self.store = store
        self.namespace = namespace

    def _key(self, page_hash: str) -> bytes:
        return chunk_key(page_hash, namespace=self.namespace)

    def set(self, page_hash: str, value: npt.NDArray[np.uint8]) -> bool:
        return self.store.put(self._key(page_hash), value) != "refused"

    def get(self, page_hash: str, target: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8] | None:
        n = self.store.get_into(self._key(page_hash), target)
        return None if n is None else target[:n]

    def exists(self, page_hash: str) -> bool:
        return self.store.exists(self._key(page_hash))

    def batch_exists(self, page_hashes: Sequence[str]) -> int:
        return self.store.batch_exists([self._key(h) for h in page_hashes])

    def batch_set(
        self, page_hashes: Sequence[str], values: Sequence[npt.NDArray[np.uint8]]
    ) -> bool:
        keys = [self._key(h) for h in page_hashes]
        return all(r != "refused" for r in self.store.batch_put(keys, values))

    def batch_get(
        self, page_hashes: Sequence[str], targets: Sequence[npt.NDArray[np.uint8]]
    ) -> list[bool]:
        got = self.store.batch_get_into([self._key(h) for h in page_hashes], targets)
        return [n is not None for n in got]

    def pin(self, page_hash: str) -> bool:
        return self.store.pin(self._key(page_hash))


def page_hashes(prompt: int, pages: int) -> list[str]:
    """The engine's page hashes of a prompt: a SHA-256 chain over its pages' token ids."""
    out, prior = [], b""
    for p in range(pages):
        tokens = np.arange(p * PAGE_TOKENS, (p + 1) * PAGE_TOKENS, dtype=np.int64) + prompt << 20
        prior = hashlib.sha256(prior + tokens.tobytes()).digest()
        out.append(prior.hex())
    return out


def kv(page_hash: str) -> npt.NDArray[np.uint8]:
    seed = int(page_hash[:8], 16)
    return np.random.default_rng(seed).integers(0, 256, PAGE, np.uint8)


def level_spec(where: str, tmp_path: Path, name: str = "a") -> str:
    return str(tmp_path / name) if where == "dir" else f"memory://{name}-{tmp_path.name[-24:]}"


def open_cache(*levels: stratastore.ChunkLevel) -> HiCachePages:
    cfg = stratastore.ChunkConfig(tuple(levels), name="HiCache page")
    return HiCachePages(stratastore.ChunkStore.open(cfg, FP))


def damage(cache: HiCachePages, where: str, tmp_path: Path, page_hash: str) -> None:
    """One bit flipped in a stored page: in its data file, or in the memory level's bytes."""
    skey = stored_key(chunk_key(page_hash, namespace=cache.namespace))
    if where == "dir":
        path = tmp_path / "a" / data_name(skey)
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 7)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 4]))
    else:
        level = cache.store.backends[0]
        level.raw[skey][2][123] ^= 4  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["dir", "memory"])
def test_pages_round_trip_by_hash_and_a_damaged_one_is_refused(where: str, tmp_path: Path) -> None:
    cache = open_cache(stratastore.ChunkLevel(level_spec(where, tmp_path), 64 * PAGE))
    try:
        hashes = page_hashes(0, 4)
        assert cache.batch_set(hashes, [kv(h) for h in hashes])
        assert cache.batch_exists(hashes + page_hashes(1, 1)) == 4
        targets = [np.zeros(PAGE, np.uint8) for _ in hashes]
        assert cache.batch_get(hashes, targets) == [True] * 4
        assert all(np.array_equal(t, kv(h)) for t, h in zip(targets, hashes, strict=True))
        damage(cache, where, tmp_path, hashes[2])
        target = np.full(PAGE, 0xAB, np.uint8)
        assert cache.get(hashes[2], target) is None  # refused: a miss
        assert cache.batch_exists(hashes) == 2  # gone: lookups stop before it now
        assert cache.set(hashes[2], kv(hashes[2])) and cache.batch_exists(hashes) == 4
        got = cache.get(hashes[2], np.zeros(PAGE, np.uint8))
        assert got is not None and np.array_equal(got, kv(hashes[2]))
    finally:
        cache.store.close()


@pytest.mark.parametrize("where", ["dir", "memory"])
def test_a_full_first_level_degrades_into_the_second_and_pins_survive(
    where: str, tmp_path: Path
) -> None:
    room = stored_bytes(PAGE)
    cache = open_cache(
        stratastore.ChunkLevel(level_spec(where, tmp_path), 2 * room),
        stratastore.ChunkLevel(level_spec("memory", tmp_path, "b"), 3 * room),
    )
    try:
        hashes = page_hashes(7, 8)
        assert cache.set(hashes[0], kv(hashes[0])) and cache.pin(hashes[0])
        for h in hashes[1:]:
            assert cache.set(h, kv(h))
        # 8 pages, room for 5: three went, never the pinned one; the rest moved down
        held = [cache.exists(h) for h in hashes]
        assert held[0] and sum(held) == 5
        for h, there in zip(hashes, held, strict=True):
            got = cache.get(h, np.zeros(PAGE, np.uint8))
            assert (got is not None and np.array_equal(got, kv(h))) == there
        stats = cache.store.stats()
        assert stats["degradations"] >= 3 and stats["evictions"] == 3
    finally:
        cache.store.close()
