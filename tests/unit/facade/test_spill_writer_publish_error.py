"""The spill writer: after each write it publishes the counters (``_publish`` -> ``stats()``: a
catalog read, the memory probe). An error there (a StoreError from the LMDB read, say) escapes
``_drain`` and ends the writer thread: every later park's write is never made, ``flush()`` then
waits forever and ``park`` blocks for good once the queue is full. A failed publish must be counted
(``monitor_errors``), never stop the writer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Conversation, Store
from stratastore.levels.errors import StoreError
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def conversation(cid: str, n: int, base: int) -> tuple[Conversation, np.ndarray]:
    return conversation_kv(cid, n, base, step=0)


def test_a_failed_publish_does_not_stop_the_spill_writer(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    store = Store.open(FP, cfg)
    real = store._tiers.stats
    failed: list[bool] = []

    def stats_once() -> dict[str, Any]:  # the first publish's catalog read fails
        if not failed:
            failed.append(True)
            raise StoreError("index read failed (injected)")
        return real()

    store._tiers.stats = stats_once  # type: ignore[method-assign]
    a, kva = conversation("a", 32, 0)
    store.park(a, kva)
    done = threading.Event()

    def flush_twice() -> None:
        store.flush()
        b, kvb = conversation("b", 32, 1000)
        store.park(b, kvb)
        store.flush()
        done.set()

    t = threading.Thread(target=flush_twice, daemon=True)
    t.start()
    t.join(5)  # liveness
    assert done.is_set(), "flush() hangs: the spill writer thread died on a failed publish"
    assert store.lookup(np.arange(1000, 1033)) == ("disk", 32)
    store.close()
