"""A BaseException (Ctrl-C: KeyboardInterrupt is delivered to the caller's thread, which runs a
one-chunk restore inline, and the apply pass of every restore).

1. ``_Agenda.inline`` catches ``Exception`` only and never aborts the job's ``Delivery`` on a
   BaseException: the chunk it holds keeps its staging (never given back) and what it wrote or
   a direct read placed stays in the caller's buffer although the call raised (the pipeline
   path aborts every live job in its ``finally``; the inline one does not).
2. ``reads._run_groups`` waits for its read/hash tasks only on the normal path: a
   KeyboardInterrupt in ``wait(futures)`` propagates while the pool threads still ``pread`` into
   the buffer. ``_read_direct`` then zeroes the destination and raises, and the pool threads go
   on writing unvalidated bytes (never compared with their digests) into the caller's memory after
   the call returned; ``_piece`` gives a staging buffer back to the pool while it is still
   being written."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

import stratastore.restore.reads as reads
from stratastore.levels.local import SegmentStore
from stratastore.levels.reader import SegmentReader
from stratastore.levels.staging import STAGING
from stratastore.restore import FlatKV, Piece, two_pass_restore
from stratastore.restore.two_pass import Delivery
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import image

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens


@pytest.fixture
def img(tmp_path: Path) -> tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]:
    store = SegmentStore.open(tmp_path / "s", FP)
    pieces, kv = image(store, 3, [0, 40])  # one segment of 10 pages: one chunk, run inline
    yield store, pieces, kv  # type: ignore[misc]
    store.close()


def _watch_staging(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    outstanding: dict[int, int] = {}
    take, give = STAGING.take, STAGING.give

    def taking(n: int) -> npt.NDArray[np.uint8]:
        b = take(n)
        outstanding[id(b)] = n
        return b

    def giving(b: npt.NDArray[np.uint8]) -> None:
        outstanding.pop(id(b), None)
        give(b)

    monkeypatch.setattr(STAGING, "take", taking)
    monkeypatch.setattr(STAGING, "give", giving)
    return outstanding


def test_inline_ctrl_c_in_the_copy_leaks_the_staging(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pieces, _ = img
    outstanding = _watch_staging(monkeypatch)
    out = np.zeros(40 * TB, np.uint8)
    dest = FlatKV(FP, out, read_direct=False)

    def interrupted(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        raise KeyboardInterrupt

    dest.write_pages = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(pieces, 40, dest, FP, resume_at=lambda t: 0)
    assert not outstanding, "the held chunk's staging was never given back"


def test_inline_ctrl_c_after_a_direct_apply_leaves_the_bytes(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pieces, _ = img
    real = Delivery.take

    def take(self: Delivery, item: object) -> None:
        real(self, item)  # type: ignore[arg-type]
        raise KeyboardInterrupt  # Ctrl-C right after the chunk was taken

    monkeypatch.setattr(Delivery, "take", take)
    out = np.zeros(40 * TB, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(pieces, 40, FlatKV(FP, out), FP, resume_at=lambda t: 0)
    assert not out.any(), "the restore raised, yet what it placed is still in the buffer"


@pytest.mark.parametrize("direct", [True, False])
def test_ctrl_c_during_the_hashing_wait_leaves_pool_threads_writing(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
    monkeypatch: pytest.MonkeyPatch,
    direct: bool,
) -> None:
    _, pieces, _ = img
    monkeypatch.setattr(reads, "_GROUP_BYTES", PT * TB)  # one page a task: several tasks
    real_read = SegmentReader._read_at

    def slow_read(self: SegmentReader, view: memoryview, offset: int) -> None:
        """A pread in flight on a cold disk: the file is read now, the bytes land later (a
        read already in the kernel completes even when its fd is closed meanwhile)."""
        got = np.empty(view.nbytes, np.uint8)
        real_read(self, got.data, offset)
        time.sleep(0.1)
        np.frombuffer(view, np.uint8)[:] = got

    monkeypatch.setattr(SegmentReader, "_read_at", slow_read)

    def interrupted_wait(*a: object, **k: object) -> None:
        raise KeyboardInterrupt  # the signal arrives while the caller waits for the pool

    monkeypatch.setattr(reads, "wait", interrupted_wait)
    given: list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]] = []
    real_give = STAGING.give

    def giving(b: npt.NDArray[np.uint8]) -> None:
        given.append((b, b.copy()))  # what the buffer holds when it is given back
        real_give(b)

    monkeypatch.setattr(STAGING, "give", giving)
    out = np.zeros(40 * TB, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(pieces, 40, FlatKV(FP, out, read_direct=direct), FP, resume_at=lambda t: 0)
    time.sleep(0.5)  # the reads in flight land
    if direct:
        assert not out.any(), "unvalidated bytes landed in the caller's buffer after return"
    else:
        assert given, "setup: the staging was given back on the interrupt"
        for buf, then in given:
            assert np.array_equal(buf, then), (
                "a staging buffer was written after it was given back to STAGING (the next "
                "take gets memory a pool thread is still writing)"
            )


def test_ctrl_c_inside_an_inline_direct_read_leaves_nothing_it_read(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One chunk of one group is read on the calling thread: a Ctrl-C in the middle of its read
    (half the bytes landed) leaves none of them in the destination."""
    _, pieces, kv = img
    real_read = SegmentReader._read_at

    def half_then_interrupted(self: SegmentReader, view: memoryview, offset: int) -> None:
        half = view.nbytes // 2
        real_read(self, view[:half], offset)
        raise KeyboardInterrupt

    monkeypatch.setattr(SegmentReader, "_read_at", half_then_interrupted)
    out = np.full(40 * TB, 0xEE, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(pieces, 40, FlatKV(FP, out), FP, resume_at=lambda t: 0)
    assert np.isin(out, [0, 0xEE]).all(), "bytes of an interrupted read stayed in the buffer"
    assert not np.array_equal(kv[: 20 * TB], np.full(20 * TB, 0xEE, np.uint8))  # setup
