"""The continuous agenda: restores from several threads join one read agenda (a bounded set of
reader threads for the store, kept across calls, read-ahead running from one call into the
next), and each call gets what it gets alone: the same bytes, the same outcome, damage
laddering that call only; a call interrupted before its turn is taken off the agenda and
delivers nothing."""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import stratastore.restore.agenda as agenda_module
from stratastore import Store
from stratastore.levels.local import SegmentStore
from stratastore.restore import SHARED_READER, FlatKV, Job, SharedAgenda, restore_batch
from tests.conftest import conversation_kv, tiny_fp
from tests.unit.restore.test_agenda import flip, image, page_floor, summary

FP = tiny_fp()
TB = FP.token_bytes


def _readers() -> set[threading.Thread]:
    """The continuous agendas' reader threads alive now (of every agenda of the process)."""
    return {t for t in threading.enumerate() if t.name == SHARED_READER}


def test_calls_from_threads_get_what_they_get_alone(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 12, 40, 64]) for seed in range(8)]
        flip(store, imgs[3][0][1].key, 9)  # one damaged image: that call ladders, alone

        def job(n: int, out: np.ndarray) -> Job:
            return Job(imgs[n][0], 64, FlatKV(FP, out), FP, page_floor, True, chunk_bytes=512)

        alone = []
        for n in range(8):
            out = np.zeros(64 * TB, np.uint8)
            alone.append((summary(restore_batch([job(n, out)])[0]), out))
        agenda = SharedAgenda()
        got: dict[int, tuple[object, np.ndarray]] = {}
        barrier = threading.Barrier(4)

        def call(t: int) -> None:
            barrier.wait()
            for n in (t, t + 4):  # two calls a thread, each of one image
                out = np.zeros(64 * TB, np.uint8)
                got[n] = (summary(agenda.run([job(n, out)])[0]), out)

        threads = [threading.Thread(target=call, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert 1 <= agenda.reading <= agenda.readers  # kept across every thread's calls
        agenda.close()
        assert agenda.reading == 0
    for n in range(8):
        assert got[n][0] == alone[n][0]
        assert np.array_equal(got[n][1], alone[n][1])
    assert alone[3][0][0] < 64 and all(alone[n][0][0] == 64 for n in range(8) if n != 3)


def test_a_call_no_reader_takes_runs_alone_and_an_interrupt_delivers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one reader is held by a first call whose applies wait; a second call, which no
    reader takes, runs on its own pipeline and is interrupted (Ctrl-C) while it waits for its
    first chunk: it raises at once and delivers nothing (what a direct read placed is zeroed);
    the first call completes, and the agenda serves the next one."""
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 40, 64]) for seed in range(3)]
        agenda = SharedAgenda(readers=1)
        release, applying = threading.Event(), threading.Event()

        class Slow(FlatKV):
            def write_pages(self, *a: Any, **kw: Any) -> None:
                applying.set()
                release.wait(30)
                super().write_pages(*a, **kw)

        def job(n: int, dest: FlatKV) -> Job:
            return Job(imgs[n][0], 64, dest, FP, page_floor, True, chunk_bytes=512)

        first = np.zeros(64 * TB, np.uint8)
        results: list[object] = []
        holder = threading.Thread(
            target=lambda: results.extend(agenda.run([job(0, Slow(FP, first, read_direct=False))]))
        )
        holder.start()
        # the first call holds the reader and waits in its first apply (its hand-off made)
        # before the second call's hand-off is made interruptible: never the first's
        assert applying.wait(30), "the first call never reached its first apply"
        interrupt = threading.Event()

        class Interrupting(queue.Queue):  # type: ignore[type-arg]
            """The hand-off of a call whose thread gets Ctrl-C while it waits."""

            def get(self, block: bool = True, timeout: float | None = None) -> Any:
                if block and interrupt.is_set() and self.empty():
                    raise KeyboardInterrupt
                return super().get(block, timeout)

        monkeypatch.setattr(
            agenda_module,
            "queue",
            SimpleNamespace(Queue=Interrupting, Empty=queue.Empty, Full=queue.Full),
        )
        out = np.full(64 * TB, 7, np.uint8)
        interrupt.set()
        with pytest.raises(KeyboardInterrupt):
            agenda.run([job(1, FlatKV(FP, out))])
        parked = imgs[1][1]
        assert not ((out == parked) & (parked != 7) & (parked != 0)).any()  # nothing delivered
        interrupt.clear()
        release.set()
        holder.join(30)
        assert summary(results[0])[0] == 64 and np.array_equal(first, imgs[0][1])  # type: ignore[arg-type]
        again = np.zeros(64 * TB, np.uint8)
        assert summary(agenda.run([job(2, FlatKV(FP, again))])[0])[0] == 64
        assert np.array_equal(again, imgs[2][1])
        agenda.close()
        assert agenda.reading == 0


def test_restores_of_a_store_from_threads_share_the_reader(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 0,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
        "park": "disk",
        "restore_chunk_mib": 1,
    }
    convs = [conversation_kv(f"c{i}", 40_000, 100_000 * i, step=8000) for i in range(6)]
    before = _readers()
    with Store.open(FP, cfg) as store:
        for conv, kv in convs:
            store.park(conv, kv.copy())
        store.flush()
        seen: list[int] = []
        ok: list[bool] = []

        def restore(i: int) -> None:
            conv, kv = convs[i]
            out = np.zeros_like(kv)
            r = store.restore(conv.tokens, out)
            seen.append(len(_readers() - before))
            ok.append(r.tokens == 40_000 and np.array_equal(out, kv))

        threads = [threading.Thread(target=restore, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert ok == [True] * 6 and min(seen) >= 1  # the readers outlive each call
    assert not _readers() - before  # close ends them


def test_calls_that_wait_on_each_other_never_deadlock(tmp_path: Path) -> None:
    """Five threads: B holds a lock while it restores; four A calls restore into destinations
    whose writes take that lock (their applies wait on B). Each A pins a reader; B, which no
    reader takes, runs on its own pipeline instead of waiting for one, so everything ends."""
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 12, 40, 64]) for seed in range(5)]
        agenda = SharedAgenda()
        lock = threading.Lock()

        class NeedsLock(FlatKV):
            def write_pages(self, *a: Any, **kw: Any) -> None:
                with lock:
                    super().write_pages(*a, **kw)

        def job(n: int, dest: FlatKV) -> Job:
            return Job(imgs[n][0], 64, dest, FP, page_floor, True, chunk_bytes=256)

        done: list[str] = []

        def a(n: int) -> None:
            out = np.zeros(64 * TB, np.uint8)
            agenda.run([job(n, NeedsLock(FP, out, read_direct=False))])
            done.append(f"A{n}" if np.array_equal(out, imgs[n][1]) else f"A{n} wrong")

        def b() -> None:
            out = np.zeros(64 * TB, np.uint8)
            agenda.run([job(4, FlatKV(FP, out))])
            done.append("B" if np.array_equal(out, imgs[4][1]) else "B wrong")
            lock.release()

        lock.acquire()
        threads = [threading.Thread(target=a, args=(n,), daemon=True) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # every reader holds an A call whose apply waits on the lock
        threads.append(threading.Thread(target=b, daemon=True))
        threads[-1].start()
        for t in threads:
            t.join(20)
        agenda.close()
    assert sorted(done) == ["A0", "A1", "A2", "A3", "B"]


def test_idle_readers_end_and_a_forked_child_starts_afresh(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 12, 40, 64]) for seed in range(2)]
        agenda = SharedAgenda()

        def restore(n: int) -> bool:
            out = np.zeros(64 * TB, np.uint8)
            job = Job(imgs[n][0], 64, FlatKV(FP, out), FP, page_floor, True, chunk_bytes=512)
            agenda.run([job])
            return np.array_equal(out, imgs[n][1])

        assert restore(0) and agenda.reading >= 1
        pid = os.fork()
        if pid == 0:  # the child: no reader of the parent's is here
            ok = threading.Thread(target=lambda: os._exit(0 if restore(1) else 1), daemon=True)
            ok.start()
            ok.join(30)
            os._exit(2)  # hung
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        deadline = time.monotonic() + 10
        while agenda.reading and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agenda.reading == 0  # idle readers end by themselves
        assert restore(1)  # and come again with the next call
        agenda.close()
