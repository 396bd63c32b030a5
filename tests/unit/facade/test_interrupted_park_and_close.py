"""A Ctrl-C (``KeyboardInterrupt``, delivered to the engine's thread wherever it runs) in a park
or in ``close()`` never loses a park acknowledged before it.

- A park that evicts an older RAM entry (``spill_on = evict``) takes that entry's disk write with
  it: interrupted between its placement and the hand-over to the write queue, the eviction must
  stay waiting for the next flush or close (and its reservation with it), not vanish with the
  interrupted call.
- An interrupted ``close()`` (waiting for the spill writer) must leave the store closable: the
  next ``close()`` finishes the writes and closes the levels, never closing them under the
  running writer nor returning as if all were written."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.restore import LayerKV
from stratastore.tiers.tiered import Tiers
from tests.conftest import run_with_timeout, tiny_fp

FP = tiny_fp()


def conversation(cid: str, start: int, n: int = 64) -> tuple[Conversation, np.ndarray]:
    lengths = [*range(16, n, 16), n]
    conv = Conversation(
        cid,
        as_tokens(np.arange(start, start + n)),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *lengths[:-1]],
    )
    kv = np.random.default_rng(start).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return conv, kv


def restored(store: Store, start: int, n: int = 64) -> int:
    out = np.zeros((n + 1) * FP.token_bytes, np.uint8)
    return store.restore(np.arange(start, start + n + 1), out).tokens


def ram_cfg(tmp_path: Path) -> dict[str, Any]:
    return {
        "ram_mib": 4,
        "slots": 2,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }


def test_an_interrupted_park_keeps_the_eviction_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ram_cfg(tmp_path)
    store = Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda m: None)
    try:
        assert store.park(*conversation("a", 0)).where == "ram"
        assert store.park(*conversation("b", 1000)).where == "ram"
        real = Tiers.place

        def place(self: Tiers, *a: Any, **k: Any) -> Any:
            real(self, *a, **k)
            raise KeyboardInterrupt  # the signal lands right after the placement returned

        monkeypatch.setattr(Tiers, "place", place)
        with pytest.raises(KeyboardInterrupt):
            store.park(*conversation("c", 2000))  # evicts a (2 slots): a's write rides along
        monkeypatch.undo()
        store.flush()
    finally:
        store.close()
    with Store.open(FP, cfg, warn=lambda m: None) as again:
        assert restored(again, 0) == 64, "the acknowledged park of a was lost"
        assert restored(again, 1000) == 64


def test_an_interrupted_park_gives_its_reservation_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A park streamed from the engine's layout reserves its bytes and marks its id in flight
    when it is placed: interrupted before its write starts, both are given back (a later park of
    the id would wait for it forever)."""
    cfg = {"park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    real = Tiers.place
    with Store.open(FP, cfg, warn=lambda m: None) as store:

        def place(self: Tiers, *a: Any, **k: Any) -> Any:
            placement = real(self, *a, **k)
            assert placement.stream is not None  # (the case under test)
            raise KeyboardInterrupt

        monkeypatch.setattr(Tiers, "place", place)
        conv, _ = conversation("a", 0)
        rng = np.random.default_rng(0)
        k, v = ([rng.random((64, 2, 4)).astype(np.float16) for _ in range(2)] for _ in "kv")
        with pytest.raises(KeyboardInterrupt):
            store.park(conv, LayerKV(FP, k, v))
        monkeypatch.undo()
        assert store._tiers.writes.outbox.reserved == 0
        done = threading.Event()

        def again() -> None:
            store.park(*conversation("a", 0))
            done.set()

        t = threading.Thread(target=again, daemon=True)
        t.start()
        t.join(60)
        assert done.is_set(), "a park of the id waits for an interrupted one forever"
        assert restored(store, 0) == 64


def test_an_interrupted_close_is_finished_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = {"park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    store = Store.open(FP, cfg, warn=lambda m: None)
    gate = threading.Event()
    real = store._tiers.write_disk_now

    def slow(snap: Any) -> None:  # the writer is behind: every write waits for the gate
        assert gate.wait(60)
        real(snap)

    monkeypatch.setattr(store._tiers, "write_disk_now", slow)
    for i in range(5):
        assert store.park(*conversation(f"c{i}", 1000 * i)).where == "disk"
    real_settle = store._writes.settle

    def interrupted() -> None:  # Ctrl-C while close waits for the writer
        monkeypatch.setattr(store._writes, "settle", real_settle)
        raise KeyboardInterrupt

    monkeypatch.setattr(store._writes, "settle", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.close()
    gate.set()
    store.close()  # finishes what the first began
    with Store.open(FP, cfg, warn=lambda m: None) as again:
        for i in range(5):
            assert restored(again, 1000 * i) == 64, f"the acknowledged park c{i} was lost"


def _once(real: Any, *, after: bool) -> Any:
    """``real`` raising ``KeyboardInterrupt`` at its first call: before it runs, or after."""
    fired: list[bool] = []

    def call(*a: Any, **k: Any) -> Any:
        if fired:
            return real(*a, **k)
        fired.append(True)
        if not after:
            raise KeyboardInterrupt
        real(*a, **k)
        raise KeyboardInterrupt

    return call


@pytest.mark.parametrize(
    "where",
    ["the outbox indexing an eviction", "the RAM level writing its arena", "a queued token"],
)
def test_a_park_interrupted_inside_the_flow_loses_no_earlier_park(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A Ctrl-C deeper in a park (offering its eviction, writing RAM's arena, after a token is
    queued) never costs a park acknowledged before it, and flush and close still end."""
    cfg = ram_cfg(tmp_path)
    store = Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda m: None)
    try:
        assert store.park(*conversation("a", 0)).where == "ram"
        assert store.park(*conversation("b", 1000)).where == "ram"
        tiers = store._tiers
        if where == "the outbox indexing an eviction":
            index = tiers.writes.outbox._index
            monkeypatch.setattr(index, "add", _once(index.add, after=False))
        elif where == "the RAM level writing its arena":
            arena = tiers.ram.arena
            assert arena is not None
            monkeypatch.setattr(arena, "write", _once(arena.write, after=False))
        else:
            q = tiers.writes._queue
            assert q is not None
            monkeypatch.setattr(q, "put", _once(q.put, after=True))
        with pytest.raises(KeyboardInterrupt):
            store.park(*conversation("c", 2000))  # evicts a (2 slots)
        monkeypatch.undo()
    finally:
        run_with_timeout(store.close, 120)
    with Store.open(FP, cfg, warn=lambda m: None) as again:
        assert restored(again, 0) == 64, "the acknowledged park of a was lost"
        assert restored(again, 1000) == 64, "the acknowledged park of b was lost"
