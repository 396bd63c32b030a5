"""The continuous agenda: restores from several threads join one read agenda (a bounded set of
reader threads for the store, kept across calls, read-ahead running from one call into the
next), and each call gets what it gets alone: the same bytes, the same outcome, damage
laddering that call only; a call interrupted before its turn is taken off the agenda and
delivers nothing."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import stratastore.restore.agenda as agenda_module
from stratastore import Store
from stratastore.levels.local import SegmentStore
from stratastore.restore import FlatKV, Job, SharedAgenda, restore_batch
from tests.conftest import conversation_kv, tiny_fp
from tests.unit.test_agenda import flip, image, page_floor, summary

FP = tiny_fp()
TB = FP.token_bytes


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "strata-agenda-read"]


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
        assert 1 <= len(_readers()) <= agenda.readers  # kept for every thread's calls
        agenda.close()
        assert not _readers()
    for n in range(8):
        assert got[n][0] == alone[n][0]
        assert np.array_equal(got[n][1], alone[n][1])
    assert alone[3][0][0] < 64 and all(alone[n][0][0] == 64 for n in range(8) if n != 3)


def test_a_call_interrupted_before_its_turn_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader is held by a first call whose applies wait; a second call is interrupted
    (Ctrl-C) while it waits for its turn: it raises at once, delivers nothing, and the reader
    never reads it; the first call completes, and the agenda serves the next one."""
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 40, 64]) for seed in range(3)]
        agenda = SharedAgenda()
        release = threading.Event()

        class Slow(FlatKV):
            def write_pages(self, *a: Any, **kw: Any) -> None:
                release.wait(30)
                super().write_pages(*a, **kw)

        def job(n: int, dest: FlatKV) -> Job:
            return Job(imgs[n][0], 64, dest, FP, page_floor, True, chunk_bytes=512)

        first = np.zeros(64 * TB, np.uint8)
        results: list[object] = []
        holder = threading.Thread(
            target=lambda: results.extend(agenda.run([job(0, Slow(FP, first))]))
        )
        holder.start()
        interrupt = threading.Event()

        class Interrupting(queue.Queue):  # type: ignore[type-arg]
            """The hand-off of a call whose thread gets Ctrl-C while it waits."""

            def get(self, block: bool = True, timeout: float | None = None) -> Any:
                if block and interrupt.is_set() and self.empty():
                    raise KeyboardInterrupt
                return super().get(block, timeout)

        monkeypatch.setattr(
            agenda_module, "queue", SimpleNamespace(Queue=Interrupting, Empty=queue.Empty)
        )
        out = np.full(64 * TB, 7, np.uint8)
        interrupt.set()
        with pytest.raises(KeyboardInterrupt):
            agenda.run([job(1, FlatKV(FP, out))])
        assert (out == 7).all()  # nothing delivered
        interrupt.clear()
        release.set()
        holder.join(30)
        assert summary(results[0])[0] == 64 and np.array_equal(first, imgs[0][1])  # type: ignore[arg-type]
        again = np.zeros(64 * TB, np.uint8)
        assert summary(agenda.run([job(2, FlatKV(FP, again))])[0])[0] == 64
        assert np.array_equal(again, imgs[2][1])
        agenda.close()
        assert not _readers()


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
            seen.append(len(_readers()))
            ok.append(r.tokens == 40_000 and np.array_equal(out, kv))

        threads = [threading.Thread(target=restore, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert ok == [True] * 6 and min(seen) >= 1  # the readers outlive each call
    assert not _readers()  # close stops it
