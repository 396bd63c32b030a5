"""Group commit of a directory level: the puts that wait for the write lock are committed together
by whichever takes it, each in the order of F-DUR-2 (data file renamed in and the directory
fsynced, then the sidecar renamed in and the directory fsynced, then the index record). A put
that fails is undone and gets its own error while the rest of its group commits; a failed
directory fsync undoes every put it covered; a power cut at any point of a batch leaves each
page committed whole (byte-identical when acknowledged) or invisible, and fsck clean."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_key
from stratastore.errors import StrataError
from stratastore.format import data_name, sidecar_name
from stratastore.format.naming import TEMP_PREFIX
from stratastore.io import faults
from stratastore.io.faults import Fault, FaultInjector
from stratastore.levels.errors import StoreError
from stratastore.levels.local.group_commit import GroupCommit
from stratastore.ops.fsck import fsck
from tests.conftest import tiny_fp
from tests.reliability.powerloss import Recorder, crash_states, digest, materialize

PAGE = 3000


def key(i: int) -> bytes:
    return chunk_key(f"group-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def errors(d: Path) -> list[str]:
    return [f"{f.code} {f.path}" for f in fsck([str(d)]) if f.severity == "error"]


def temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(TEMP_PREFIX)]


def queued(gc: GroupCommit[object, object], n: int) -> None:
    """Wait until ``n`` puts are queued (their threads' own signal: the queue), failing rather
    than hanging when a thread died before it queued."""
    deadline = time.monotonic() + 120
    while True:
        with gc._mu:
            if len(gc._queue) >= n:
                return
        assert time.monotonic() < deadline, f"{n} puts never queued"
        time.sleep(0.001)


# -- the queue ----------------------------------------------------------------------------------
def test_puts_queued_behind_the_lock_are_committed_by_one_holder_in_one_group() -> None:
    lock = threading.Lock()
    groups: list[list[int]] = []

    def run(items: list[int]) -> list[int | StrataError]:
        groups.append(list(items))
        return [i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(lambda: lock, run, "test")  # type: ignore[arg-type,return-value]
    results: dict[int, int] = {}
    lock.acquire()  # another holder: every put queues behind it
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, gc.commit(i))) for i in range(6)
    ]
    for t in threads:
        t.start()
    queued(gc, 6)
    lock.release()
    for t in threads:
        t.join(10)
    assert results == {i: i * 10 for i in range(6)}
    assert len(groups) == 1 and sorted(groups[0]) == list(range(6))


def test_each_put_gets_its_own_error_and_an_interrupted_group_fails_every_put_in_it() -> None:
    def run(items: list[int]) -> list[int | StrataError]:
        return [StoreError(f"no {i}") if i % 2 else i for i in items]

    gc: GroupCommit[int, int] = GroupCommit(threading.Lock, run, "test")  # type: ignore[arg-type]
    out = gc.commit_many([0, 1, 2])
    assert out[0] == 0 and out[2] == 2 and isinstance(out[1], StoreError)
    with pytest.raises(StoreError, match="no 1"):
        gc.commit(1)

    def interrupted(items: list[int]) -> list[int | StrataError]:
        raise KeyboardInterrupt

    gc.run = interrupted
    with pytest.raises(KeyboardInterrupt):
        gc.commit_many([4, 5])
    assert gc._queue == []


def test_a_put_interrupted_while_it_waits_leaves_the_queue() -> None:
    calls: list[list[int]] = []

    class Interrupting:
        def __enter__(self) -> None:
            raise KeyboardInterrupt

        def __exit__(self, *a: object) -> None:
            return None

    gc: GroupCommit[int, int] = GroupCommit(Interrupting, lambda xs: calls.append(xs) or xs, "t")  # type: ignore[arg-type,func-returns-value]
    with pytest.raises(KeyboardInterrupt):
        gc.commit(7)
    assert gc._queue == [] and calls == []


# -- the directory ------------------------------------------------------------------------------
def test_a_batch_from_many_threads_is_whole_and_counted(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 24)], tiny_fp()) as s:

        def put(t: int) -> None:
            assert (
                s.put_many([key(i) for i in range(t, 48, 4)], [page(i) for i in range(t, 48, 4)])
                == ["stored"] * 12
            )

        threads = [threading.Thread(target=put, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert s.put_many([key(0), key(0), key(99)], [page(0), page(0), page(99)]) == [
            "present",
            "present",
            "stored",
        ]
        assert s.counters.puts == 49
        for i in [*range(48), 99]:
            assert bytes(s.get(key(i)) or b"") == page(i).tobytes()
    assert errors(d) == [] and temps(d) == []


def test_a_key_twice_in_one_batch_is_stored_once(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 24)], tiny_fp()) as s:
        out = s.put_many([key(1), key(1)], [page(1), page(1)])
        assert sorted(out) == ["present", "stored"]
        assert bytes(s.get(key(1)) or b"") == page(1).tobytes()
    assert errors(d) == [] and temps(d) == []


def failing(op: str, part: str) -> FaultInjector:
    """Every ``op`` on a path containing ``part`` fails (EIO)."""
    return FaultInjector(faults=[Fault(op=op, path_contains=part, persistent=True)])


def test_a_put_whose_rename_fails_is_undone_and_the_rest_of_its_group_commits(
    tmp_path: Path,
) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 24)], tiny_fp()) as s:
        bad = stored_key(key(2)).hex()
        with faults.use(failing("rename", bad)):
            out = s.put_many([key(i) for i in range(4)], [page(i) for i in range(4)])
        assert out[0] == out[1] == out[3] == "stored"
        assert isinstance(out[2], StrataError)
        assert not s.exists(key(2))
        for i in (0, 1, 3):
            assert bytes(s.get(key(i)) or b"") == page(i).tobytes()
        assert s.put(key(2), page(2)) == "stored"  # nothing of it was left to dedupe against
    assert errors(d) == [] and temps(d) == []


def test_a_failed_directory_fsync_undoes_every_put_of_its_group(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 24)], tiny_fp()) as s:
        with faults.use(failing("fsync_dir", str(d))):
            out = s.put_many([key(i) for i in range(3)], [page(i) for i in range(3)])
        assert all(isinstance(r, StrataError) for r in out), out
        for i in range(3):
            assert not s.exists(key(i))
            assert not (d / sidecar_name(stored_key(key(i)))).exists()
            assert not (d / data_name(stored_key(key(i)))).exists()
        assert s.put_many([key(i) for i in range(3)], [page(i) for i in range(3)]) == ["stored"] * 3
    assert errors(d) == [] and temps(d) == []


def test_every_power_cut_of_a_batch_leaves_each_page_whole_or_invisible(tmp_path: Path) -> None:
    root = tmp_path / "rec"
    d = root / "level"
    n = 3
    with ChunkStore.open([ChunkLevel(str(d), 1 << 24)], tiny_fp()) as s:
        rec = Recorder(root=root)
        with faults.use(rec):
            assert (
                s.put_many([key(i) for i in range(n)], [page(i) for i in range(n)])
                == ["stored"] * n
            )
            rec.ack(0)
    ((_, acked_at),) = rec.acks
    ops = [op for op, _ in rec.ops]
    assert ops.count("fsync_dir") == 2, ops  # one group: the directory fsynced twice, not 2n
    seen: set[bytes] = set()
    checked = 0
    for kind, i, tree in crash_states(rec):
        if (h := digest(tree)) in seen:
            continue
        seen.add(h)
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp)
            materialize(tree, state)
            where = f"{kind} state before op {i} ({rec.ops[i] if i < len(rec.ops) else 'end'})"
            level = state / "level"
            if not level.is_dir():
                continue
            with ChunkStore.open([ChunkLevel(str(level), 1 << 24)], tiny_fp()) as s:
                for c in range(n):
                    got = s.get(key(c))
                    if i >= acked_at:
                        assert got is not None and bytes(got) == page(c).tobytes(), where
                    else:
                        assert got is None or bytes(got) == page(c).tobytes(), where
                assert s.counters.damaged == 0, where
            assert errors(level) == [], where
            shutil.rmtree(state / "level")
            checked += 1
    assert checked > 10


def test_a_put_taken_by_a_commit_interrupted_before_it_answered_gets_a_typed_error() -> None:
    """The leader (the main thread) is interrupted after taking the queue: the put another
    thread queued gets a StoreError, never an untyped failure or a silent success."""
    lock = threading.Lock()
    ran: list[list[str]] = []

    def interrupted(items: list[str]) -> list[str | StrataError]:
        ran.append(list(items))
        raise KeyboardInterrupt

    gc: GroupCommit[str, str] = GroupCommit(lambda: lock, interrupted, "test")  # type: ignore[arg-type,return-value]
    got: dict[str, object] = {}

    def other() -> None:
        try:
            got["b"] = gc.commit("b")
        except BaseException as e:
            got["b"] = e

    with lock:  # this thread leads: the other put queues behind it
        t = threading.Thread(target=other)
        t.start()
        queued(gc, 1)
        with pytest.raises(KeyboardInterrupt):
            gc._run_queued()
    t.join(10)
    assert ran == [["b"]]
    assert isinstance(got["b"], StoreError), got


def test_a_lock_that_cannot_be_taken_is_each_puts_error_not_a_raise() -> None:
    class Refused:
        def __enter__(self) -> None:
            raise StoreError("flock refused")

        def __exit__(self, *a: object) -> None:
            return None

    gc: GroupCommit[int, int] = GroupCommit(Refused, lambda xs: list(xs), "t")  # type: ignore[arg-type]
    out = gc.commit_many([1, 2])
    assert all(isinstance(r, StoreError) for r in out) and gc._queue == []


def test_a_batch_larger_than_the_level_stores_what_single_puts_would(tmp_path: Path) -> None:
    d = tmp_path / "d"
    from stratastore.chunks import stored_bytes

    with ChunkStore.open([ChunkLevel(str(d), 3 * stored_bytes(PAGE))], tiny_fp()) as s:
        out = s.put_many([key(i) for i in range(7)], [page(i) for i in range(7)])
        assert out == ["stored"] * 7
        assert bytes(s.get(key(6)) or b"") == page(6).tobytes()
        assert s.entries() <= 3
    assert errors(d) == [] and temps(d) == []
