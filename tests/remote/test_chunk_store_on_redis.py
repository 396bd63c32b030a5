"""The chunk store on the Redis level, against a real ``redis-server``: pages put there are
delivered validated into the caller's buffer; the level's budget evicts oldest first, never a
pinned page; a directory level above it degrades into it; a server that cannot be reached is a
typed error when the store opens, naming no credential."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import blake3
import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore, LevelUnavailable
from stratastore.chunks import chunk_key, stored_bytes, stored_key
from tests.conftest import tiny_fp
from tests.remote.conftest import import_or_skip

import_or_skip("redis")

PAGE = 20_000
ROOM = stored_bytes(PAGE)


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def redis_level(server: Any, tmp_path: Path, pages: int) -> ChunkLevel:
    """A namespace of this test's own on the session's server."""
    name = "chunks" + blake3.blake3(str(tmp_path).encode()).hexdigest()[:16]
    return ChunkLevel(f"{server.url}/0", pages * ROOM, settings={"name": name})


def test_pages_round_trip_and_the_budget_evicts_oldest_never_a_pin(
    redis_session_server: Any, tmp_path: Path
) -> None:
    with ChunkStore.open([redis_level(redis_session_server, tmp_path, 2)], tiny_fp()) as s:
        assert s.put(key(0), page(0)) == "stored" and s.put(key(0), page(0)) == "present"
        assert s.batch_exists([key(0), key(9), key(0)]) == 1  # one round trip: a prefix of 1
        out = np.zeros(PAGE, np.uint8)
        assert s.get_into(key(0), out) == PAGE and np.array_equal(out, page(0))
        assert s.pin(key(0))
        for i in range(1, 4):
            assert s.put(key(i), page(i)) == "stored"
        # room for two: the pinned page and the newest
        assert [s.exists(key(i)) for i in range(4)] == [True, False, False, True]
        assert s.get(key(3)) == page(3).tobytes() and s.stats()["evictions"] == 2
        assert s.remove(key(0)) and not s.exists(key(0))


def test_a_directory_level_degrades_into_the_redis_level(
    redis_session_server: Any, tmp_path: Path
) -> None:
    levels = [
        ChunkLevel(str(tmp_path / "d"), 1 * ROOM),
        redis_level(redis_session_server, tmp_path, 4),
    ]
    with ChunkStore.open(levels, tiny_fp()) as s:
        for i in range(3):
            s.put(key(i), page(i))
        local, remote = s.backends
        assert stored_key(key(2)) in local
        assert all(stored_key(key(i)) in remote for i in range(2))
        assert all(s.get(key(i)) == page(i).tobytes() for i in range(3))
        assert s.stats()["degradations"] == 2


def test_a_server_that_cannot_be_reached_fails_the_open_without_a_credential(
    tmp_path: Path,
) -> None:
    secret = "s3cret-pw"
    level = ChunkLevel(f"redis://alice:{secret}@127.0.0.1:1/0", ROOM, settings={"timeout_s": 0.5})
    with pytest.raises(LevelUnavailable) as e:
        ChunkStore.open([level], tiny_fp())
    assert secret not in str(e.value)
