"""How often the engine's thread takes the flow's lock: a park at most twice, a restore at most
three times, and a restore takes none for a remote level that is not configured.

The flow's lock is the one lock every call plans and accounts under (``Tiers.lock``); each time
the engine's thread takes it, it may wait for the spill writer's bookkeeping or another slot's
restore. The lock is swapped for a counting one as the store's flow context is made (every
re-entry counts too), and only acquisitions on the calling thread are counted: the spill
writer's are its own.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pytest

import stratastore.tiers.tiered as tiered
from stratastore import Store
from stratastore.chain import Checkpoint, Conversation
from stratastore.format import ModelFingerprint
from stratastore.restore import PagedKV
from stratastore.tiers.context import FlowContext
from tests.conftest import conversation_kv, tiny_fp
from tests.unit.tiers.test_prompt_cache import cache_cfg, capture, chat

FP = tiny_fp()
PARK_MOST, RESTORE_MOST = 2, 3


class CountingLock:
    """An RLock that counts the acquisitions made on one thread (``on``), and where from."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.on: int | None = None
        self.taken = 0

    def _count(self) -> None:
        if self.on == threading.get_ident():
            self.taken += 1

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self._count()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> CountingLock:
        self.acquire()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # what threading.Condition uses of an RLock it is given (the park flow waits on one)
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined,no-any-return]

    def _release_save(self) -> Any:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> CountingLock:
    """The flow's lock of the next store opened, counting."""
    lock = CountingLock()

    def context(cfg: Any, fp: Any, _lock: Any, admission: Any, warn: Any) -> FlowContext:
        return FlowContext(cfg, fp, lock, admission, warn)  # type: ignore[arg-type]

    monkeypatch.setattr(tiered, "FlowContext", context)
    return lock


@contextmanager
def on_this_thread(lock: CountingLock) -> Iterator[Counter[str]]:
    """Count the acquisitions this thread makes in the block (yields the tally, filled after)."""
    tally: Counter[str] = Counter()
    lock.on, lock.taken = threading.get_ident(), 0
    try:
        yield tally
    finally:
        tally["taken"] = lock.taken
        lock.on = None


CONFIGS: dict[str, dict[str, Any]] = {
    "ram": {"ram_mib": 4},
    "disk": {"ram_mib": 0, "cold_mib": 64},
    "ram and disk": {"ram_mib": 4, "cold_mib": 64, "spill_on": "park"},
}


def _open(tmp_path: Path, name: str) -> Store:
    cfg = dict(CONFIGS[name])
    if "cold_mib" in cfg:
        cfg["cold_dir"] = str(tmp_path / "cold")
    return Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda m: None)


@pytest.mark.parametrize("name", ["ram", "disk", "ram and disk"])
def test_a_park_and_a_restore_take_the_flow_lock_a_few_times(
    tmp_path: Path, counted: CountingLock, name: str
) -> None:
    with _open(tmp_path, name) as store:
        assert store._tiers.lock is counted
        warm, kv_warm = conversation_kv("warm", 100, 5)  # first calls set up what they use
        store.park(warm, kv_warm)
        store.flush()
        conv, kv = conversation_kv("a", 100, 0)
        prompt = np.concatenate([conv.tokens, [7, 7]])
        with on_this_thread(counted) as park:
            where = store.park(conv, kv.copy()).where
        out = np.zeros(len(prompt) * FP.token_bytes, np.uint8)
        with on_this_thread(counted) as pending:  # the park in flight, or a part of RAM's
            first = store.restore(prompt, out, max_tokens=64)  # (RAM keeps a part restored)
        assert first.tokens == 64 and first.source in ("pending", "ram")
        store.flush()
        with on_this_thread(counted) as restore:
            got = store.restore(prompt, out)
        with on_this_thread(counted) as lookup:
            store.lookup(prompt)
        with on_this_thread(counted) as miss:
            store.restore(np.arange(500, 600), out)
    assert np.array_equal(out[: kv.size], kv) and got.tokens == 100
    print(f"{name}: park ({where}) {park['taken']}, restore ({got.source}) {restore['taken']}")
    assert 1 <= park["taken"] <= PARK_MOST
    for tally in (pending, restore, miss):
        assert 1 <= tally["taken"] <= RESTORE_MOST
    assert lookup["taken"] == 1


def test_a_streamed_park_takes_it_once_to_place_and_once_per_segment_landing(
    tmp_path: Path, counted: CountingLock
) -> None:
    """A park written from the engine's blocks within its call takes the lock to place it, as
    each of its segments lands (its reservation given back as the level counts the bytes), and
    once as it ends: never over the write. (It also publishes the monitor's snapshot, at most
    once a second, which takes it once more: held off here, so the count does not depend on
    how long the park took.)"""
    fp = ModelFingerprint.create(
        "engine-layout", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=4
    )
    bs = fp.page_tokens
    rng = np.random.default_rng(1)
    pools = [rng.integers(0, 2**16, (2, 16, bs, 2, 8), dtype=np.uint16) for _ in range(fp.n_layers)]
    n = 8 * bs
    conv = Conversation("c", np.arange(n, dtype=np.uint32), [Checkpoint(n)], cuts=[0, 4 * bs])
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
    with Store.open(fp, cfg) as store:
        store._snapshots.due = lambda force: False  # type: ignore[method-assign]
        with on_this_thread(counted) as park:
            report = store.park(conv, PagedKV(fp, pools, np.arange(8)))
        assert report.where == "disk"
    segments = 2
    assert park["taken"] == 1 + segments + 1


def test_a_restore_takes_no_lock_for_a_remote_level_that_is_not_there(
    tmp_path: Path, counted: CountingLock
) -> None:
    """Without a remote level the restore flow neither asks one (no lock to decide whether to)
    nor keeps a copy of one's read (no lock to hand it to the writer)."""
    with _open(tmp_path, "disk") as store:
        assert store._tiers.restorer.remote is None
        conv, kv = conversation_kv("a", 64, 0)
        store.park(conv, kv)
        store.flush()
        out = np.zeros(64 * FP.token_bytes, np.uint8)
        with on_this_thread(counted) as restore:
            assert store.restore(conv.tokens, out).source == "disk"
    assert restore["taken"] == 2  # plan, account


def test_a_park_with_a_system_prompt_cache_takes_it_once_after_its_prefix_is_filled(
    tmp_path: Path, counted: CountingLock
) -> None:
    """The system-prompt cache is filled once per distinct pinned prefix (that park takes the
    lock more to write it down); every later park of the same prefix takes it once."""
    with Store.open(FP, cache_cfg(tmp_path), probe=lambda: 1 << 40) as store:
        first = chat("a", 40, 1)
        store.park(first, capture(first, 1))  # fills the cache with the system prompt
        assert store.stats()["prompt_cache_fills"] == 1
        later = chat("b", 40, 2)
        with on_this_thread(counted) as park:
            assert store.park(later, capture(later, 2)).where == "ram"
        assert store.stats()["prompt_cache_fills"] == 1
    assert park["taken"] == 1
