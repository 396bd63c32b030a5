"""A pin taken while a put is making room can be evicted at once.

``ChunkStore._evict_oldest`` checks ``_pins`` under its lock, drops the lock, then deletes; ``pin``
checks the index and counts the pin, outside the room lock. A lookup with ``pin=True`` that lands
between the check and the delete gets True for a chunk that is then evicted ("a chunk pinned through
LMCache ... is never evicted")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from tests.unit.adapters.test_lmcache_chunks import cid, open_store, payload  # noqa: E402


def test_a_pin_that_succeeded_holds_against_a_concurrent_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "d", 2)
    try:
        for i in range(2):
            assert store.put(cid(i), payload(i)) == "stored"
        real = store.pages.backends[0].delete
        pinned: list[bool] = []

        def delete(key: bytes) -> Any:  # the lookup thread runs between check and delete
            if not pinned:
                pinned.append(store.pin(cid(0)))
            return real(key)

        monkeypatch.setattr(store.pages.backends[0], "delete", delete)
        assert store.put(cid(2), payload(2)) == "stored"  # makes room: evicts the oldest
        assert len(pinned) == 1  # the lookup ran between the eviction's check and its delete
        # a pin landing while its chunk is being evicted may fail (the chunk is going), but a
        # pin that succeeded (LMCache told the chunk is there and held) must hold
        assert pinned == [False] or store.contains(cid(0)), (
            "a chunk whose pin succeeded was evicted"
        )
    finally:
        store.close()
