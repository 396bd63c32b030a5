"""A put evicts a durable chunk that fitted within the budget.

``ChunkStore.put`` drops its reservation only after ``store.put_state`` returned, so between the
commit (``used()`` counts the chunk) and that ``finally`` the chunk is counted twice; another writer
thread making room in that window (``_make_room``) sees ``used + reserved`` one chunk too high and
evicts the oldest chunk although everything fitted ("exact after any number of removes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from tests.unit.adapters.test_lmcache_chunks import cid, open_store, payload  # noqa: E402


def test_a_chunk_that_fits_evicts_nothing_while_another_put_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "d", 3)  # room for 3 chunks
    try:
        assert store.put(cid(0), payload(0)) == "stored"
        real = store.pages.backends[0].put_state
        outcomes: list[str] = []
        armed = [True]

        def put_state(key: bytes, data: Any, **kw: Any) -> Any:
            res = real(key, data, **kw)
            if armed.pop() if armed else False:  # the next writer makes room right after this
                outcomes.append(store.put(cid(2), payload(2)))
            return res

        monkeypatch.setattr(store.pages.backends[0], "put_state", put_state)
        assert store.put(cid(1), payload(1)) == "stored"
        assert outcomes == ["stored"]
        assert store.stats()["evictions"] == 0 and store.contains(cid(0)), (
            "3 chunks fit the budget, yet chunk 0 was evicted"
        )
    finally:
        store.close()
