"""A record a chunk store keeps beside its pages (``keep`` at open; the LMCache plugin's chunk
layout) is put and read through the store: written once on the first level (a second put is
"present", never a replacement), not counted as a page, refused when it cannot fit; the cascade
moves it down like the oldest page, but no eviction (by budget or by age) deletes it, and it is
read back validated from whichever level holds it, after a reopen too; a damaged copy raises and
is neither counted nor removed, and `remove` refuses it; a key the store does not keep is
refused."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import ChunkKeyError, ChunkStoreClosed, chunk_key, stored_bytes, stored_key
from stratastore.errors import StrataError
from stratastore.format import DATA_OFFSET, ChecksumMismatch, data_name
from tests.conftest import tiny_fp

PAGE = 20_000
ROOM = stored_bytes(PAGE)
RECORD = chunk_key("the adapter's record")
BODY = b'{"layout": "KV_2LTD", "shapes": [[2, 2, 0, 32]]}'
RECORD_ROOM = stored_bytes(len(BODY))


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def held(s: ChunkStore, k: bytes) -> list[bool]:
    """Which levels hold ``k``, first to last."""
    return [stored_key(k) in b for b in s.backends]


def levels(tmp_path: Path, first_pages: int, last_pages: int, **last: int) -> list[ChunkLevel]:
    """Two directories: room for the record and ``first_pages`` pages above room for the record
    and ``last_pages`` pages (``last``: the last level's ``max_age_s``)."""
    return [
        ChunkLevel(str(tmp_path / "fast"), RECORD_ROOM + first_pages * ROOM),
        ChunkLevel(str(tmp_path / "slow"), RECORD_ROOM + last_pages * ROOM, **last),
    ]


def test_a_kept_record_is_put_once_and_read_back_not_counted_as_a_page(tmp_path: Path) -> None:
    with ChunkStore.open(levels(tmp_path, 1, 1), tiny_fp(), keep=[RECORD]) as s:
        assert s.get_kept(RECORD, max_bytes=1 << 16) is None  # not put yet
        assert s.put_kept(RECORD, BODY) == "stored"
        assert s.put_kept(RECORD, b"another body") == "present"  # never replaced
        assert s.get_kept(RECORD, max_bytes=1 << 16) == BODY
        assert held(s, RECORD) == [True, True]  # every level, the last first
        st = s.stats()
        assert (st["puts"], st["put_bytes"], st["entries"]) == (0, 0, 0)
        with pytest.raises(StrataError, match="over the"):
            s.get_kept(RECORD, max_bytes=len(BODY) - 1)
        for call in (lambda: s.put_kept(key(0), BODY), lambda: s.get_kept(key(0), max_bytes=9)):
            with pytest.raises(ChunkKeyError, match="not kept"):
                call()
    assert s.get_kept(RECORD, max_bytes=1 << 16) is None  # closed: nothing read
    with pytest.raises(ChunkStoreClosed):
        s.put_kept(RECORD, BODY)


def test_a_kept_record_that_cannot_fit_beside_pinned_pages_is_refused(tmp_path: Path) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), ROOM)], tiny_fp(), keep=[RECORD]) as s:
        assert s.put(key(0), page(0)) == "stored" and s.pin(key(0))
        assert s.put_kept(RECORD, BODY) == "refused"
        assert held(s, RECORD) == [False] and s.exists(key(0))


def test_the_cascade_moves_a_kept_record_down_but_no_eviction_deletes_it(tmp_path: Path) -> None:
    config = levels(tmp_path, 1, 2, max_age_s=1)
    with ChunkStore.open(config, tiny_fp(), keep=[RECORD]) as s:
        assert s.put_kept(RECORD, BODY) == "stored"
        for i in range(6):  # the first level moves its oldest down; the last evicts
            assert s.put(key(i), page(i)) == "stored"
        assert held(s, RECORD) == [False, True]  # moved down with the oldest pages
        st = s.stats()
        assert st["evictions"] >= 3 and st["degradations"] >= 5 and st["entries"] == 3
        assert s.get_kept(RECORD, max_bytes=1 << 16) == BODY  # read where it is
        time.sleep(1.1)
        s.gc()  # every page of the last level is past its age: they go, the record stays
        assert held(s, RECORD) == [False, True]
        assert not any(s.exists(key(i)) for i in range(5))
    with ChunkStore.open(config, tiny_fp(), keep=[RECORD]) as again:  # a restart
        assert again.get_kept(RECORD, max_bytes=1 << 16) == BODY
        assert again.put_kept(RECORD, b"another body") == "present"


def test_a_damaged_kept_record_raises_and_is_neither_counted_nor_removed(
    tmp_path: Path,
) -> None:
    with ChunkStore.open(levels(tmp_path, 1, 1), tiny_fp(), keep=[RECORD]) as s:
        assert s.put_kept(RECORD, BODY) == "stored"

    def damage(level: str) -> Path:
        data = tmp_path / level / data_name(stored_key(RECORD))
        raw = bytearray(data.read_bytes())
        raw[DATA_OFFSET + 3] ^= 1
        data.write_bytes(bytes(raw))
        return data

    fast = damage("fast")
    with ChunkStore.open(levels(tmp_path, 1, 1), tiny_fp(), keep=[RECORD]) as s:
        assert s.get_kept(RECORD, max_bytes=1 << 16) == BODY  # the other level's copy
        assert s.put_kept(RECORD, BODY) == "present"  # the damaged copy is not replaced
    slow = damage("slow")
    with ChunkStore.open(levels(tmp_path, 1, 1), tiny_fp(), keep=[RECORD]) as s:
        with pytest.raises(ChecksumMismatch):
            s.get_kept(RECORD, max_bytes=1 << 16)
        assert s.stats()["damaged"] == 0 and s.stats()["read_errors"] == 0
        assert held(s, RECORD) == [True, True] and fast.exists() and slow.exists()
        assert s.put_kept(RECORD, BODY) == "present"  # the operator's to repair (fsck)


def test_a_kept_record_is_never_removed(tmp_path: Path) -> None:
    with ChunkStore.open(levels(tmp_path, 1, 1), tiny_fp(), keep=[RECORD]) as s:
        assert s.put_kept(RECORD, BODY) == "stored"
        with pytest.raises(ChunkKeyError, match="never removed"):
            s.remove(RECORD)
        assert s.get_kept(RECORD, max_bytes=1 << 16) == BODY


def test_stores_sharing_a_level_keep_the_record_the_shared_level_took_first(
    tmp_path: Path,
) -> None:
    """Two stores whose first levels are their own and whose last level (Redis) is shared: the
    second keeps the first's record (nothing of its own written); a store whose own level
    kept another record before it shared the level finds the two told apart."""
    from stratastore.chunks import KeptRecordConflict
    from tests.redis_servers import RedisServer
    from tests.remote.conftest import import_or_skip, redis_binaries_or_skip

    import_or_skip("redis")
    other = b'{"layout": "KV_T2D", "shapes": [[0, 2, 2, 32]]}'
    with RedisServer(tmp_path / "redis", binaries=redis_binaries_or_skip()) as server:
        shared = ChunkLevel(server.url, 1 << 20, settings={"name": "kept"})

        def store(first: str, last: ChunkLevel) -> ChunkStore:
            return ChunkStore.open(
                [ChunkLevel(str(tmp_path / first), 1 << 20), last], tiny_fp(), keep=[RECORD]
            )

        with store("a", shared) as a, store("b", shared) as b:
            assert a.put_kept(RECORD, BODY) == "stored"
            assert b.put_kept(RECORD, other) == "present"  # the shared level took a's
            assert held(b, RECORD) == [False, True]
            assert b.get_kept(RECORD, max_bytes=1 << 16) == BODY
        with store("c", ChunkLevel(str(tmp_path / "c-own"), 1 << 20)) as c:
            assert c.put_kept(RECORD, other) == "stored"  # c's own levels keep its record
        with store("c", shared) as c:  # then c shares the level a recorded first
            with pytest.raises(KeptRecordConflict, match="share a level") as e:
                c.get_kept(RECORD, max_bytes=1 << 16)
            assert [level for level, _ in e.value.holders] == [str(tmp_path / "c"), "redis://..."]
