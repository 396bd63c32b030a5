"""Work in flight left by an earlier process that had *this* process's pid (a container restarted
after SIGKILL: its main process is pid 1 again) is never finished: the open skips tickets of its own
pid, and ``Catalog.begin`` takes the blocker for live work of this very process, so every park of
that conversation waits WAIT_S (60 s, holding the Store's lock) and fails with CatalogBusy. A ticket
names its process by pid *and* start time (F-CAT-1), so the earlier incarnation is simulated by a
ticket of this pid with another start time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.catalog import Catalog, tables
from stratastore.facade import SpillError
from stratastore.levels.local import SegmentStore
from tests.conftest import tiny_fp

FP = tiny_fp()


def _cfg(tmp_path: Path) -> dict[str, object]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 4}


def _conv(n: int = 16) -> tuple[Conversation, np.ndarray]:
    toks = np.arange(500, 500 + n, dtype=np.uint32)
    kv = ((np.arange(n * FP.token_bytes) * 13 + 1) & 0xFF).astype(np.uint8)
    return Conversation("c", toks, [Checkpoint(8), Checkpoint(n)], cuts=[0, 8]), kv


def test_a_ticket_of_an_earlier_incarnation_with_the_same_pid_is_finished_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tables, "WAIT_S", 1.0)  # only so the failure shows in 1 s, not 60
    # "incarnation 1": a park of "c" registered, then the process is SIGKILLed (simulated: the
    # park's first step on the store's catalog, without its commit or abort; the next process
    # has the same pid)
    Store.open(FP, _cfg(tmp_path), probe=lambda: 1 << 40, warn=lambda _m: None).close()
    with SegmentStore.open(tmp_path / "cold", FP, create=False) as level:
        cat = Catalog(level.index)
        cat.start -= 1  # an earlier process with this pid: it started at another time
        cat.begin("c", {b"\x11" * 32}, session=False)
    # "incarnation 2", same pid: the open must finish what the dead incarnation left
    Store.open(FP, _cfg(tmp_path), probe=lambda: 1 << 40, warn=lambda _m: None).close()
    with SegmentStore.open(tmp_path / "cold", FP, create=False) as level:
        assert Catalog(level.index).in_flight() == [], (
            "the dead incarnation's park is still in flight after open"
        )
    with Store.open(FP, _cfg(tmp_path), probe=lambda: 1 << 40, warn=lambda _m: None) as s2:
        conv, kv = _conv()
        s2.park(conv, kv)
        try:
            s2.flush()
        except SpillError as e:
            pytest.fail(f"the park after restart was not written: {e.failures}")
