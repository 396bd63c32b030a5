"""A chunk store's levels keep their budgets the way a Store's disk levels do (tiers' DiskLevel):
a full first level degrades its oldest page into the next level instead of deleting it, only the
last level deletes, oldest first, never a pinned page or a kept key; a pin that succeeded holds
until unpinned; a full last level with when_full = reject refuses the put; GC moves pages past
their level's age down and deletes them from the last level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from stratastore import ChunkConfig, ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_bytes, stored_key
from tests.conftest import tiny_fp

PAGE = 20_000
ROOM = stored_bytes(PAGE)  #: what one page takes on a directory level (at most, elsewhere)


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def where(s: ChunkStore, i: int) -> list[bool]:
    """Which levels hold page ``i``, first to last (its stored key is the same on each)."""
    return [stored_key(key(i)) in b for b in s.backends]


def two_levels(tmp_path: Path, first: int, second: int) -> ChunkStore:
    """A directory of room for ``first`` pages above a memory level of ``second``."""
    return ChunkStore.open(
        [
            ChunkLevel(str(tmp_path / "fast"), first * ROOM),
            ChunkLevel(f"memory://cascade-{tmp_path.name[-24:]}", second * ROOM),
        ],
        tiny_fp(),
    )


def test_a_full_first_level_degrades_its_oldest_page_and_only_the_last_deletes(
    tmp_path: Path,
) -> None:
    with two_levels(tmp_path, 2, 2) as s:
        for i in range(3):
            assert s.put(key(i), page(i)) == "stored"
        assert [where(s, i) for i in range(3)] == [[False, True], [True, False], [True, False]]
        assert s.get(key(0)) == page(0).tobytes()  # found below, validated
        for i in range(3, 5):
            assert s.put(key(i), page(i)) == "stored"
        # 0 was the last level's oldest: deleted; 1 and 2 went down; 3 and 4 are on top
        assert not s.exists(key(0))
        assert [where(s, i) for i in range(1, 5)] == [
            [False, True],
            [False, True],
            [True, False],
            [True, False],
        ]
        st = s.stats()
        assert (st["degradations"], st["evictions"], st["entries"]) == (3, 1, 4)
        assert st["budget_bytes"] == 4 * ROOM and st["used_bytes"] <= 4 * ROOM
        assert [d["entries"] for d in s.describe()] == [2, 2]


def test_a_pinned_page_survives_eviction_until_unpinned(tmp_path: Path) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 2 * ROOM)], tiny_fp()) as s:
        for i in range(2):
            s.put(key(i), page(i))
        assert s.pin(key(0)) and s.pinned(key(0))
        assert not s.pin(key(9))  # not held: no pin
        for i in range(2, 5):
            assert s.put(key(i), page(i)) == "stored"  # each evicts the oldest unpinned
        assert s.get(key(0)) == page(0).tobytes()
        assert [s.exists(key(i)) for i in range(5)] == [True, False, False, False, True]
        assert not s.remove(key(0), force=False)  # pinned: kept
        assert s.unpin(key(0)) and not s.pinned(key(0))
        assert s.put(key(5), page(5)) == "stored"  # now 0 goes
        assert not s.exists(key(0)) and s.stats()["evictions"] == 4


def test_a_pinned_page_moves_down_a_level_but_is_never_deleted(tmp_path: Path) -> None:
    with two_levels(tmp_path, 1, 2) as s:
        s.put(key(0), page(0))
        assert s.pin(key(0))
        for i in range(1, 6):
            assert s.put(key(i), page(i)) == "stored"
        assert where(s, 0) == [False, True] and s.get(key(0)) == page(0).tobytes()
        assert s.stats()["pinned"] == 1


def test_only_pinned_pages_left_refuse_the_put_and_so_does_when_full_reject(
    tmp_path: Path,
) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 2 * ROOM)], tiny_fp()) as s:
        for i in range(2):
            s.put(key(i), page(i))
            assert s.pin(key(i))
        assert s.put(key(2), page(2)) == "refused"
        big = np.zeros(3 * PAGE, np.uint8)
        assert s.put(key(3), big) == "refused"  # larger than the whole first level
        assert s.stats()["puts_refused"] == 2 and s.stats()["in_flight_bytes"] == 0
        assert s.remove(key(0)) and not s.pinned(key(0))  # force: pins and all
        assert s.put(key(2), page(2)) == "stored"
    cfg = ChunkConfig((ChunkLevel(str(tmp_path / "r"), 2 * ROOM),), when_full="reject")
    with ChunkStore.open(cfg, tiny_fp()) as s:
        for i in range(2):
            s.put(key(i), page(i))
        assert s.put(key(2), page(2)) == "refused" and s.exists(key(0))


def test_a_kept_key_is_never_evicted(tmp_path: Path) -> None:
    with ChunkStore.open(
        [ChunkLevel(str(tmp_path / "d"), 2 * ROOM)], tiny_fp(), keep=[key(100)]
    ) as s:
        s.put(key(100), page(100))  # the oldest
        for i in range(3):
            s.put(key(i), page(i))
        assert s.exists(key(100)) and s.entries() == 1


def test_gc_moves_pages_past_their_age_down_and_the_last_level_deletes_them(
    tmp_path: Path,
) -> None:
    levels = [
        ChunkLevel(str(tmp_path / "fast"), 8 * ROOM, max_age_s=60),
        ChunkLevel(str(tmp_path / "slow"), 8 * ROOM, max_age_s=3600),
    ]
    with ChunkStore.open(levels, tiny_fp()) as s:
        for i in range(3):
            s.put(key(i), page(i))
        assert s.pin(key(2))
        s.gc()  # nothing is a minute old yet
        assert all(where(s, i) == [True, False] for i in range(3))
        later = s.levels[0].clock() + 120 * 10**9
        for lvl in s.levels:
            lvl.clock = lambda: later
        s.gc()
        assert all(where(s, i) == [False, True] for i in range(3))
        much_later = later + 7200 * 10**9
        for lvl in s.levels:
            lvl.clock = lambda: much_later
        s.gc()
        assert [s.exists(key(i)) for i in range(3)] == [False, False, True]  # the pin holds
        assert s.stats()["evictions"] == 2
