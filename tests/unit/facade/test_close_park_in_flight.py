"""close() writes down what only RAM holds, but skips a RAM conversation whose id has a park
*waiting for its disk write* (``cid in self.outbox``), taking that write for the RAM entry's. The
write in flight can be an *older* park of the id: it went to disk (the parking floor failed), then
the conversation came back, grew, and its newer park stayed in RAM (``spill_on = evict``). close()
skips the newer one; the older one lands; after a graceful restart the newer, acknowledged park is
gone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from tests.conftest import tiny_fp

FP = tiny_fp()
MIB = 1 << 20


def conversation(cid: str, n: int, seed: int) -> tuple[Conversation, np.ndarray]:
    lengths = [*range(16, n, 16), n]
    conv = Conversation(
        cid, as_tokens(np.arange(n)), [Checkpoint(x) for x in lengths], cuts=[0, *lengths[:-1]]
    )
    kv = np.random.default_rng(seed).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return conv, kv


def test_close_writes_a_newer_ram_park_while_an_older_disk_write_is_in_flight(
    tmp_path: Path,
) -> None:
    free = [50 * MIB]  # below the parking floor: the first park goes to disk
    cfg: dict[str, Any] = {
        "ram_mib": 4,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
        "min_free_mib": 100,
        "park_min_free_mib": 0,
    }
    v1, kv1 = conversation("a", 64, 1)
    v2, kv2 = conversation("a", 128, 1)  # the same conversation, a turn later
    kv2[: kv1.size] = kv1
    store = Store.open(FP, cfg, probe=lambda: free[0], warn=lambda m: None)
    real = store._tiers.write_disk_now
    entered, release = threading.Event(), threading.Event()

    def held(snap: Any, *lock: Any) -> None:
        if not entered.is_set():
            entered.set()
            assert release.wait(30)
        real(snap, *lock)

    store._tiers.write_disk_now = held  # type: ignore[method-assign]
    real_join = store._writes.join

    def join() -> None:  # close() flushes the writer: the held write goes on from here
        release.set()
        real_join()

    store._writes.join = join  # type: ignore[method-assign]
    try:
        assert store.park(v1, kv1).where == "disk"  # its write is in flight (held)
        assert entered.wait(30)
        free[0] = 1 << 40
        assert store.park(v2, kv2.copy()).where == "ram"  # the newer park: RAM only (evict)
        assert store.lookup(np.arange(129)) == ("ram", 128)
    finally:
        store.close()
    with Store.open(FP, cfg, warn=lambda m: None) as again:
        assert again.lookup(np.arange(129)) == ("disk", 128), (
            "close() skipped the newer RAM park because an older park of the id was in flight"
        )
