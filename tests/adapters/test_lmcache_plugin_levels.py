"""The LMCache plugin on several levels (``storage_plugin.stratastore.levels``), driven through
LMCache's own engine and storage manager on the CPU: chunks put on a small first disk level
cascade to the second and are retrieved bit-identically, by this engine and by one started
afterwards; the layout record moves down with them and is never evicted by the last level, so a
restarted engine still reads what is left; a Redis level shared by two plugin instances serves
one what the other stored, the layout included. Needs the ``lmcache`` extra (and redis-server
and the ``redis`` extra for the shared level)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402

from stratastore.adapters.lmcache.chunks import LAYOUT_ID  # noqa: E402
from stratastore.adapters.lmcache.store import stored_bytes  # noqa: E402
from stratastore.chunks import stored_key  # noqa: E402
from tests import redis_servers  # noqa: E402
from tests.adapters.lmcache_worker import (  # noqa: E402
    CHUNK,
    PROMPT,
    engine,
    kv,
    plugin,
    prompt,
    retrieve,
)
from tests.remote.conftest import import_or_skip, redis_binaries_or_skip  # noqa: E402

CHUNK_BYTES = stored_bytes(CHUNK * 1024)  #: what one chunk takes on a directory level
RECORD = stored_bytes(4096)  #: at least what the layout record takes (its JSON is shorter)
CHUNKS = PROMPT // CHUNK  #: chunks a prompt
#: the smallest first level: room for a chunk on each of the plugin's 4 put threads (each put
#: in flight reserves its chunk there before it is written) and the layout record
FIRST = RECORD + 4 * CHUNK_BYTES

Engines = Callable[..., Any]


@pytest.fixture
def engines() -> Iterator[Engines]:
    """``engines(levels)``: a new LMCache engine with the plugin on ``levels``;
    ``engines.close(eng)`` destroys one (closing the plugin), the rest go at the end."""
    made: dict[str, Any] = {}

    def make(levels: list[dict[str, Any]]) -> Any:
        name = f"test-levels-{len(made)}-{os.getpid()}"
        made[name] = engine(None, name, levels=levels)
        return made[name]

    def close(eng: Any) -> None:
        name = next(n for n, e in made.items() if e is eng)
        LMCacheEngineBuilder.destroy(name)
        del made[name]

    make.close = close  # type: ignore[attr-defined]
    yield make
    for name in made:
        LMCacheEngineBuilder.destroy(name)


def store(eng: Any, *prompts: int) -> None:
    """Store each prompt whole, durably (flushed before the next)."""
    for i in prompts:
        eng.store(prompt(i), kvcaches=kv(i))
        plugin(eng).flush()


def layout_on(eng: Any) -> list[bool]:
    """Which of the plugin's levels hold the layout record, first to last."""
    return [stored_key(LAYOUT_ID) in b for b in plugin(eng).chunks.pages.backends]


def test_chunks_cascade_to_the_second_disk_level_and_read_back_bit_identically(
    engines: Engines, tmp_path: Path
) -> None:
    levels = [
        {"spec": str(tmp_path / "fast"), "budget_bytes": FIRST},
        {"spec": str(tmp_path / "slow"), "budget_bytes": 64 << 20},
    ]
    eng = engines(levels)
    store(eng, 0, 1)
    s = plugin(eng).stats()
    fast, slow = plugin(eng).chunks.pages.describe()
    assert (s["puts"], s["entries"], s["evictions"]) == (2 * CHUNKS, 2 * CHUNKS, 0)
    assert fast["entries"] <= 4 and fast["entries"] + slow["entries"] == 2 * CHUNKS + 1
    assert s["degradations"] >= 2 * CHUNKS - 4 + 1  # moved down (the record too), not lost
    assert layout_on(eng) == [False, True]  # the oldest: moved down first
    for i in range(2):
        assert retrieve(eng, i) == (PROMPT, True)
    assert plugin(eng).stats()["hits"] == 2 * CHUNKS and plugin(eng).stats()["damaged"] == 0
    engines.close(eng)  # type: ignore[attr-defined]
    again = engines(levels)  # a restart: the layout is read from the second level
    assert plugin(again).chunks.layout is not None
    for i in range(2):
        assert retrieve(again, i) == (PROMPT, True)


def test_the_last_level_evicts_chunks_but_never_the_layout_record(
    engines: Engines, tmp_path: Path
) -> None:
    levels = [
        {"spec": str(tmp_path / "fast"), "budget_bytes": FIRST},
        {"spec": str(tmp_path / "slow"), "budget_bytes": RECORD + 6 * CHUNK_BYTES},
    ]
    eng = engines(levels)
    store(eng, 0, 1, 2)  # 24 chunks into room for 10: the oldest are evicted
    assert plugin(eng).stats()["evictions"] >= 3 * CHUNKS - 10
    assert layout_on(eng) == [False, True]
    engines.close(eng)  # type: ignore[attr-defined]
    again = engines(levels)
    assert layout_on(again) == [False, True]
    assert retrieve(again, 2) == (PROMPT, True)  # the newest prompt, whole
    assert retrieve(again, 0) == (0, True)  # evicted: a miss, never wrong bytes


def test_two_plugins_share_a_redis_level(engines: Engines, tmp_path: Path) -> None:
    found = redis_binaries_or_skip()  # fails instead with STRATA_REQUIRE_REDIS=1
    import_or_skip("redis")
    with redis_servers.RedisServer(tmp_path / "redis", binaries=found) as server:
        shared = {"spec": server.url, "budget_bytes": 64 << 20, "settings": {"name": "lmcache"}}
        one = engines([{"spec": str(tmp_path / "a"), "budget_bytes": FIRST}, shared])
        other = engines([{"spec": str(tmp_path / "b"), "budget_bytes": 64 << 20}, shared])
        assert plugin(other).chunks.layout is None  # opened before anything was recorded
        store(one, 0, 1)  # prompt 0 and the layout record go down to Redis
        assert layout_on(one) == [False, True]
        store(other, 2)  # finds the layout recorded on the shared level, the same as its own
        assert layout_on(other) == [True, True] and plugin(other).stats()["puts"] == CHUNKS
        assert plugin(other).chunks.layout == plugin(one).chunks.layout
        assert retrieve(other, 0) == (PROMPT, True)  # what the first stored, from Redis
        assert retrieve(other, 2) == (PROMPT, True)
        assert plugin(other).stats()["hits"] == 2 * CHUNKS
        engines.close(one)  # type: ignore[attr-defined]
        engines.close(other)  # type: ignore[attr-defined]
