"""Nothing of a parked snapshot survives ``flush()`` (the spill writer held the last capture until
the next park: 1 GiB of RSS after a 1 GiB park)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()


def test_flush_leaves_no_reference_to_the_capture(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        kv = kv_bytes(FP, 64, seed=3)
        conv = Conversation("c", np.arange(64, dtype=np.uint32), [Checkpoint(64)])
        alive = weakref.ref(kv)
        assert store.park(conv, kv).where == "disk"
        store.flush()
        del kv, conv
        gc.collect()
        assert alive() is None, [type(r).__name__ for r in gc.get_referrers(alive())]
