"""The LMCache plugin's chunk directory is a disk level used on its own: its budget and
oldest-first eviction are the level's (``DiskLevel.make_room``), with the plugin's puts in
flight counted and its pins and layout record held back. What only the plugin counts stays
its own: ``evictions`` are the chunks this process's evictions deleted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stratastore.adapters.lmcache.chunks import LAYOUT_ID
from stratastore.format.keys import state_key
from stratastore.levels.cascade import DiskLevel
from tests.unit.adapters.test_lmcache_chunks import cid, open_store, payload


def test_the_chunk_budget_is_the_disk_levels(tmp_path: Path) -> None:
    store = open_store(tmp_path / "d", 2)
    try:
        level = store.pages.room.level
        assert isinstance(level, DiskLevel) and level.store is store.pages.backends[0]
        assert level.budget == store.budget_bytes and level.used() == store.pages.backends[0].used()
        for i in range(3):
            assert store.put(cid(i), payload(i)) == "stored"
        assert level.counters.disk_evictions == 1 == store.stats()["evictions"]
        assert not store.contains(cid(0)) and store.entries() == 2
    finally:
        store.close()


def test_a_chunk_another_process_evicted_first_is_room_but_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "d", 2)
    try:
        for i in range(2):
            assert store.put(cid(i), payload(i)) == "stored"
        real = store.pages.backends[0].delete

        def raced(key: bytes) -> Any:
            real(key)  # another process deleted the oldest chunk first
            return real(key)

        monkeypatch.setattr(store.pages.backends[0], "delete", raced)
        assert store.put(cid(2), payload(2)) == "stored"
        assert [store.contains(cid(i)) for i in range(3)] == [False, True, True]
        assert store.stats()["evictions"] == 0  # this process deleted nothing
        assert store.pages.backends[0].used() <= store.budget_bytes
    finally:
        store.close()


def test_the_layout_record_is_passed_over_and_a_put_fits_beside_one_in_flight(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "d", 2)
    try:
        assert store.put(cid(0), payload(0)) == "stored"
        token = store.pages.room.reserve(
            state_key(cid(9)), store.budget_bytes - store.pages.backends[0].used()
        )
        assert token is not None and store.stats()["in_flight_bytes"] > 0
        assert store.put(cid(1), payload(1)) == "stored"  # the oldest chunk made room
        assert not store.contains(cid(0)) and store.pages.backends[0].contains(state_key(LAYOUT_ID))
        assert store.put(cid(2), payload(2)) == "stored"
        assert not store.contains(cid(1))
        store.pages.room.release(token)
        assert store.stats()["in_flight_bytes"] == 0 and store.stats()["evictions"] == 2
    finally:
        store.close()
