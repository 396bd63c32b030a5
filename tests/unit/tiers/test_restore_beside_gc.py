"""A restore reads outside the Store's lock while the spill writer's capacity GC runs. When the GC
removes the conversation a restore is reading (its oldest), the restore meets a segment that is
gone: that is a removal (a miss past what it validated), not damage. Today it is reported as damage:
the restore ladders, the segment's key lands in ``damaged_segments`` (what fsck and held_tokens
read) and ``ladder_restores`` counts it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Conversation, Store
from stratastore.levels.reader import SegmentReader
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def conversation(cid: str, n: int, base: int, seg: int) -> tuple[Conversation, np.ndarray]:
    return conversation_kv(cid, n, base, step=seg, fp=FP)


def test_a_restore_racing_the_writers_gc_reports_no_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warnings: list[str] = []
    cfg: dict[str, Any] = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 1,
    }
    with Store.open(FP, cfg, warn=warnings.append) as store:
        x, kvx = conversation("x", 2048, 0, 512)  # the oldest: capacity GC removes it first
        store.park(x, kvx.copy())
        store.flush()

        real = SegmentReader._read_at
        entered, release = threading.Event(), threading.Event()

        def held(*args: Any, **kw: Any) -> Any:
            if not entered.is_set():  # x's first segment is open and being read
                entered.set()
                assert release.wait(30)
            return real(*args, **kw)

        monkeypatch.setattr(SegmentReader, "_read_at", held)
        out = np.zeros(kvx.size, np.uint8)
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(store.restore(x.tokens, out)), daemon=True)
        t.start()
        assert entered.wait(30)
        # meanwhile a park fills the level: the writer's make_room removes x (the oldest)
        y, kvy = conversation("y", 13000, 100_000, 1000)
        assert store.park(y, kvy.copy()).where == "disk"
        store.flush()
        assert store.lookup(x.tokens) is None, "x was not removed: the test did not race"
        release.set()
        t.join(30)
        assert not t.is_alive()
        r = got[0]
        assert r.tokens % 16 == 0 and np.array_equal(
            out[: r.tokens * FP.token_bytes], kvx[: r.tokens * FP.token_bytes]
        )
        s = store.stats()
        assert s["damaged_segments"] == [], (
            f"a segment the writer's GC removed during a restore is reported damaged: "
            f"{s['damaged_segments']} (ladder_restores={s['ladder_restores']}; "
            f"warnings={[w for w in warnings if 'restored' in w]})"
        )
        assert s["ladder_restores"] == 0
