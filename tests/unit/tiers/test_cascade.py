"""The cascade: degrade instead of delete, all or nothing, only the last level deletes, degradations
are not evictions; the adopt protocol under injected failures and across a real second volume."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stratastore.format import Level, data_name, sidecar_name
from stratastore.io import faults
from stratastore.io.errors import StrataIOError
from stratastore.io.faults import Fault
from stratastore.levels.local import SegmentStore
from stratastore.tiers import DiskLevel, LevelRefused
from tests.conftest import kv_bytes, run_on_private_tmpfs, tiny_fp

FP = tiny_fp()
SEG = 4096 + 40 * FP.token_bytes  # data file of a 40-token segment (sidecar on top)


def put(level: DiskLevel, seed: int, n: int = 40) -> tuple[bytes, np.ndarray]:
    data = kv_bytes(FP, n, seed)
    level.make_room(SEG + 1000)
    r = level.store.put_kv(level.store.root_key, np.arange(n) + 1000 * seed, data, token_start=0)
    return r.key, data


def reads_back(store: SegmentStore, key: bytes, data: np.ndarray) -> bool:
    out = np.zeros_like(data)
    store.get_into(key, out)
    return bool(np.array_equal(out, data))


@pytest.fixture
def levels(tmp_path: Path) -> Iterator[tuple[DiskLevel, DiskLevel]]:
    with (
        SegmentStore.open(tmp_path / "warm", FP, level=Level.WARM) as w,
        SegmentStore.open(tmp_path / "cold", FP, level=Level.COLD) as c,
    ):
        cold = DiskLevel("cold", c, 4 * (SEG + 1000))
        warm = DiskLevel("warm", w, 2 * (SEG + 1000), next_level=cold)
        yield warm, cold


def test_budget_degrades_the_oldest_to_the_next_level(levels: tuple[DiskLevel, DiskLevel]) -> None:
    warm, cold = levels
    written = [put(warm, i) for i in range(3)]  # the third makes the first degrade
    first_key, first_data = written[0]
    assert first_key not in warm.store and first_key in cold.store
    assert warm.counters.degradations == 1 and cold.counters.adopted == 1
    assert warm.counters.disk_evictions == 0 and warm.counters.age_evictions == 0
    sc = cold.store.sidecar(first_key)
    assert sc.level is Level.COLD  # the cold level wrote its own sidecar
    assert reads_back(cold.store, first_key, first_data)
    for key, data in written[1:]:
        assert reads_back(warm.store, key, data)


def test_only_the_last_level_deletes(levels: tuple[DiskLevel, DiskLevel]) -> None:
    warm, cold = levels
    keys = [put(warm, i)[0] for i in range(8)]
    assert cold.counters.disk_evictions == 2  # 8 written, 2 in warm, 4 in cold
    assert warm.counters.disk_evictions == 0
    assert len(warm.store) == 2 and len(cold.store) == 4
    assert [k in cold.store for k in keys[:2]] == [False, False]  # FIFO: the oldest went


def test_reject_when_full_keeps_the_entry_where_it_is(tmp_path: Path) -> None:
    with (
        SegmentStore.open(tmp_path / "w", FP, level=Level.WARM) as w,
        SegmentStore.open(tmp_path / "c", FP) as c,
    ):
        cold = DiskLevel("cold", c, 1 * (SEG + 1000), when_full="reject")
        warm = DiskLevel("warm", w, 2 * (SEG + 1000), next_level=cold)
        put(warm, 0)
        put(warm, 1)
        put(warm, 2)  # degrades #0 into the empty cold level
        with pytest.raises(LevelRefused, match="when_full=reject"):
            put(warm, 3)  # cold is full and rejects: warm cannot make room
        assert warm.counters.refusals == 1 and len(warm.store) == 2 and len(cold.store) == 1


def test_oversized_entry_is_refused(tmp_path: Path) -> None:
    with (
        SegmentStore.open(tmp_path / "w", FP, level=Level.WARM) as w,
        SegmentStore.open(tmp_path / "c", FP) as c,
    ):
        cold = DiskLevel("cold", c, 1000)
        warm = DiskLevel("warm", w, 10 * SEG, next_level=cold)
        key, data = put(warm, 0)
        assert not warm.degrade_to_next(key)
        assert key in warm.store and reads_back(warm.store, key, data)


def test_age_degrades_then_deletes_at_the_last_level(levels: tuple[DiskLevel, DiskLevel]) -> None:
    warm, cold = levels
    key, _ = put(warm, 0)
    now = [warm.store.record(key).sealed_at_ns]
    warm.max_age_ns = cold.max_age_ns = 10
    warm.clock = cold.clock = lambda: now[0]
    warm.enforce_age()
    assert key in warm.store  # not old yet
    now[0] += 11
    warm.enforce_age()
    assert key in cold.store and warm.counters.degradations == 1
    assert warm.counters.age_evictions == 0
    cold.enforce_age()  # re-sealed on adoption: young again in cold
    assert key in cold.store
    now[0] = cold.store.record(key).sealed_at_ns + 11
    cold.enforce_age()
    assert key not in cold.store and cold.counters.age_evictions == 1


def test_unreadable_image_is_discarded_not_degraded(levels: tuple[DiskLevel, DiskLevel]) -> None:
    warm, cold = levels
    key, _ = put(warm, 0)
    path = Path(warm.store.path) / sidecar_name(key)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    assert warm.degrade_to_next(key)
    assert key not in warm.store and key not in cold.store and warm.counters.discards == 1


@pytest.mark.parametrize("op", ["link", "open", "write", "fsync", "rename", "fsync_dir", "unlink"])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_failure_at_every_step_leaves_the_entry_whole_in_one_level(
    levels: tuple[DiskLevel, DiskLevel], op: str, nth: int
) -> None:
    warm, cold = levels
    key, data = put(warm, 0)
    exdev = [Fault(op="link", errno=errno.EXDEV)] if op != "link" else []  # exercise the copy
    with faults.inject(*exdev, Fault(op=op, nth=nth, errno=errno.EIO)) as inj:
        try:  # an I/O error is raised to the caller (never a quiet refusal)...
            moved = warm.degrade_to_next(key)
        except StrataIOError:
            moved = False
    fired = inj.faults[-1].fired
    in_warm, in_cold = key in warm.store, key in cold.store
    assert in_warm != in_cold, "the entry must be in exactly one level"
    assert moved == in_cold
    if fired == 0:
        assert moved  # the fault never triggered: a clean move
    store = cold.store if in_cold else warm.store
    assert reads_back(store, key, data)
    for d in (warm.store.path, cold.store.path):
        assert not [n for n in os.listdir(d) if n.startswith("strata-tmp-")]
    # reopening agrees: exactly one level has it
    for lvl in (warm, cold):
        with SegmentStore.open(lvl.store.path, FP, level=lvl.store.level) as s:
            assert (key in s) == (key in lvl.store)


def test_move_uses_a_hard_link_on_one_volume(levels: tuple[DiskLevel, DiskLevel]) -> None:
    warm, cold = levels
    key, _ = put(warm, 0)
    ino = os.stat(Path(warm.store.path) / data_name(key)).st_ino
    assert cold.store.adopt(warm.store, key) == "link"
    assert os.stat(Path(cold.store.path) / data_name(key)).st_ino == ino


_CROSS = """
import sys, numpy as np
from stratastore.format import Level
from stratastore.levels.local import SegmentStore
from stratastore.tiers import DiskLevel
from tests.conftest import kv_bytes, run_on_private_tmpfs, tiny_fp
fp = tiny_fp()
w = SegmentStore.open(sys.argv[1], fp, level=Level.WARM)
with w, SegmentStore.open(sys.argv[2], fp) as c:
    cold = DiskLevel("cold", c, 1 << 20)
    warm = DiskLevel("warm", w, 1 << 20, next_level=cold)
    data = kv_bytes(fp, 40)
    key = w.put_kv(w.root_key, np.arange(40), data, token_start=0).key
    how = c.adopt(w, key)
    out = np.zeros_like(data)
    c.get_into(key, out)
    assert how == "copy" and np.array_equal(out, data) and key not in w, how
print("OK", how)
"""


@pytest.mark.root
def test_degrade_across_a_real_second_volume(tmp_path: Path) -> None:
    out = run_on_private_tmpfs(tmp_path, _CROSS, str(tmp_path / "warm"), "{vol}/cold")
    assert "OK copy" in out
