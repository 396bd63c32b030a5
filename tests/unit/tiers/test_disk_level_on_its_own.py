"""A disk level used on its own, without manifests (a cache whose entries are independent, such
as the LMCache plugin's chunks): its budget counts what its user says (the puts in flight
beside the store's bytes), and making room lets go of the oldest entries one at a time through
the user's hook, which may hold one back (a pin) so that the next oldest goes instead. And the
bytes a RAW segment will take in a directory level, known before it is written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stratastore.format import Level
from stratastore.levels.cascade import DiskLevel, LevelRefused
from stratastore.levels.local import SegmentStore
from stratastore.levels.local.sizes import raw_segment_bytes
from stratastore.levels.sealing import STATE_PAGE_BYTES
from tests.conftest import tiny_fp

PAYLOAD = 1000
SIZE = raw_segment_bytes(PAYLOAD, STATE_PAGE_BYTES)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SegmentStore]:
    with SegmentStore.open(tmp_path / "d", tiny_fp(), level=Level.COLD) as s:
        yield s


def put(level: DiskLevel, i: int) -> bytes:
    """Make room for and store the running state ``i`` (its own key); its stored key."""
    level.make_room(SIZE)
    return level.store.put_state(bytes([i]) * 32, bytes([i]) * PAYLOAD, token_pos=0).key


@pytest.mark.parametrize("payload", [1, 1000, STATE_PAGE_BYTES, STATE_PAGE_BYTES + 1])
def test_a_raw_segment_takes_what_its_index_record_counts(
    store: SegmentStore, payload: int
) -> None:
    before = store.used()
    key = store.put_state(b"\x07" * 32, b"\x01" * payload, token_pos=0).key
    assert raw_segment_bytes(payload, STATE_PAGE_BYTES) == store.record(key).total_bytes
    assert store.used() - before == raw_segment_bytes(payload, STATE_PAGE_BYTES)


def test_making_room_lets_go_of_the_oldest_passing_over_what_is_held(
    store: SegmentStore,
) -> None:
    level = DiskLevel("chunks", store, 3 * SIZE)
    held: set[bytes] = set()
    let_go: list[bytes] = []

    def hold_or_delete(key: bytes) -> bool | None:
        if key in held:
            return None
        let_go.append(key)
        return store.delete(key)

    level.let_go = hold_or_delete
    keys = [put(level, i) for i in range(3)]
    assert store.used() == level.budget  # full, exactly
    held.add(keys[0])
    keys.append(put(level, 3))  # the oldest is held: the next oldest goes
    assert let_go == [keys[1]] and level.counters.disk_evictions == 1
    assert [k in store for k in keys] == [True, False, True, True]
    held.update(keys)
    with pytest.raises(LevelRefused, match="cannot free"):
        level.make_room(SIZE)  # everything is held: refused, nothing deleted
    assert len(store) == 3 and let_go == [keys[1]]
    with pytest.raises(LevelRefused, match="larger than its whole budget"):
        level.make_room(4 * SIZE)


def test_the_budget_counts_what_the_user_reserved(store: SegmentStore) -> None:
    level = DiskLevel("chunks", store, 3 * SIZE)
    reserved = [0]
    level.usage = lambda: store.used() + reserved[0]
    keys = [put(level, i) for i in range(2)]
    reserved[0] = SIZE  # a put in flight on another thread made room for itself
    assert level.used() == 3 * SIZE
    keys.append(put(level, 2))  # the oldest goes: the reservation counts
    assert [k in store for k in keys] == [False, True, True]


def test_an_entry_another_process_deleted_first_is_taken_as_room_made(
    store: SegmentStore,
) -> None:
    level = DiskLevel("chunks", store, 2 * SIZE)
    keys = [put(level, i) for i in range(2)]

    def raced(key: bytes) -> bool:
        store.delete(key)  # another process got there first
        return False

    level.let_go = raced
    keys.append(put(level, 2))  # looks at the budget again: one went, so it fits
    assert [k in store for k in keys] == [False, True, True]


def test_age_limit_passes_over_what_is_held(store: SegmentStore) -> None:
    now = [0]
    level = DiskLevel("chunks", store, 10 * SIZE, max_age_s=1, clock=lambda: now[0])
    keys = [put(level, i) for i in range(3)]
    level.let_go = lambda key: None if key == keys[0] else store.delete(key)
    now[0] = max(store.record(k).sealed_at_ns for k in keys) + 2_000_000_000
    level.enforce_age()
    assert [k in store for k in keys] == [True, False, False]
    assert level.counters.age_evictions == 2
