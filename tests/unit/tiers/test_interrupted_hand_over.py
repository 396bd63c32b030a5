"""An acknowledged write is never dropped on its way to the writer: a park interrupted (Ctrl-C)
while it hands its writes over, blocked on a full queue, gives back what it did not queue; the
next flush writes it, and a restart finds every park."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def test_a_park_interrupted_while_handing_over_loses_no_acknowledged_write(
    tmp_path: Path,
) -> None:
    cfg = {
        "ram_mib": 4,
        "slots": 2,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
    }
    store = Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda m: None, spill_queue=1)
    entered, release = threading.Event(), threading.Event()
    write = store._writes.write

    def held(snap: Any) -> None:  # the writer lags: the queue (one deep) fills up
        entered.set()
        release.wait(60)
        write(snap)

    store._writes.write = held  # type: ignore[method-assign]
    kvs: dict[str, np.ndarray[Any, Any]] = {}

    def park(cid: str, base: int) -> str:
        conv, kv = conversation_kv(cid, 32, base)
        kvs[cid] = kv.copy()
        return store.park(conv, kv).where

    try:
        assert park("a", 0) == park("b", 100) == "ram"
        assert park("c", 200) == "ram"  # evicts a: its write is queued, the writer holds it
        assert entered.wait(30)
        assert park("d", 300) == "ram"  # evicts b: the queue is full now
        queue = store._writes._queue
        assert queue is not None and queue.full()
        put = queue.put

        def interrupted(item: Any, *a: Any, **kw: Any) -> None:  # Ctrl-C while it waits
            if queue.full():
                raise KeyboardInterrupt
            put(item, *a, **kw)

        queue.put = interrupted  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            park("e", 400)  # evicts c (a park acknowledged in RAM): its hand-over is cut short
        queue.put = put  # type: ignore[method-assign]
        release.set()
        store.flush()  # writes what the interrupted hand-over gave back
        assert store.describe().pending == ()
    finally:
        release.set()
        store.close()
    with Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda m: None) as again:
        for cid, base in (("a", 0), ("b", 100), ("c", 200), ("d", 300)):
            out = np.zeros(32 * FP.token_bytes, np.uint8)
            got = again.restore(np.arange(base, base + 32), out)
            assert (got.source, got.tokens) == ("disk", 32), cid
            assert np.array_equal(out, kvs[cid]), cid
