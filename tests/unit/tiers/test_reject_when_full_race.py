"""With ``when_full = reject`` a park is checked against what the disk levels have free beside the
bytes reserved for the writes still waiting (``Outbox.offer`` -> ``DiskWriter.refusal``). The spill
writer now writes without the Store's lock and releases its reservation (``outbox.done``) only after
the write: in between, its bytes are counted twice -- in ``used()`` and as reserved -- so a park
that fits is refused and reported ``discard`` ("the disk levels are full"). Once, the write
and its release were one step under the lock, and the offer could not see the middle."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Conversation, Store
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def conversation(cid: str, n: int, base: int) -> tuple[Conversation, np.ndarray]:
    return conversation_kv(cid, n, base, step=1000, fp=FP)


def test_a_park_that_fits_is_not_refused_while_another_write_finishes(tmp_path: Path) -> None:
    warnings: list[str] = []
    cfg: dict[str, Any] = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 1,
        "when_full": "reject",
    }
    a, kva = conversation("a", 9000, 0)  # ~650 KB of the 1 MiB level
    b, kvb = conversation("b", 4000, 100_000)  # ~290 KB: a and b fit together
    with Store.open(FP, cfg, warn=warnings.append) as store:
        real = store._tiers.parking.write
        written, release = threading.Event(), threading.Event()

        def held(snap: Any, *rest: Any) -> bool:
            done = real(snap, *rest)
            if snap.conv.conv_id == "a":  # a is on disk; its reservation not yet released
                written.set()
                assert release.wait(30)
            return done

        store._tiers.parking.write = held  # type: ignore[method-assign]
        try:
            assert store.park(a, kva).where == "disk"
            assert written.wait(30)
            rb = store.park(b, kvb)
        finally:
            release.set()
        store.flush()
        assert rb.where == "disk", (
            f"b was refused while a's finished write was still reserved: {warnings[-1:]}"
        )
        assert store.lookup(np.arange(100_000, 104_001)) == ("disk", 4000)
