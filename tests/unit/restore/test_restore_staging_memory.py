"""Staging memory: "the hand-off queue holds DEPTH validated chunks, which bounds the staging in
flight to DEPTH + 2 chunks" (agenda), "at most four chunks of staging are in use at once" (README).
A destination without ``zero()`` under page resume points (not checkpoint-only, ladder on) whose
page grid is not the segments' (``resume_at`` floors to a page counted from token 0 or from a cut,
segments start at a checkpoint or cut off that grid: ``resume_at(hi) < hi`` at every chunk end):
``Delivery.take`` holds each chunk until the next one arrives, so the consumer holds two chunks
while the queue holds two and the reader reads one: five."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore.levels.local import SegmentStore
from stratastore.levels.staging import STAGING
from stratastore.restore import two_pass_restore
from stratastore.restore.agenda import DEPTH
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import image

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens
CHUNK = 2 * PT * TB


class _NoZero:
    def __init__(self, n: int) -> None:
        self.buf = np.full(n * TB, 0xEE, np.uint8)

    def capacity(self) -> int:
        return self.buf.size // TB

    def write_pages(self, t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        time.sleep(0.01)  # an engine's copy: slower than the read pass (a hot restore)
        self.buf[t0 * TB : (t0 + n) * TB] = data[: n * TB]


@pytest.mark.xfail(
    strict=True,
    reason="a destination without zero() holds chunks until no later "
    "damage can take them back (documented); the DEPTH + 2 bound is for "
    "destinations with zero(), every built-in one",
)
def test_page_resume_off_the_segment_grid_holds_more_than_depth_plus_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, now, peak = threading.Lock(), [0], [0]
    asked: dict[int, int] = {}
    take, give = STAGING.take, STAGING.give

    def taking(n: int) -> npt.NDArray[np.uint8]:
        b = take(n)
        with lock:
            asked[id(b)] = n
            now[0] += n
            peak[0] = max(peak[0], now[0])
        return b

    def giving(b: npt.NDArray[np.uint8]) -> None:
        with lock:
            now[0] -= asked.pop(id(b))
        give(b)

    monkeypatch.setattr(STAGING, "take", taking)
    monkeypatch.setattr(STAGING, "give", giving)
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, kv = image(store, 9, [0, 2, 162])  # the second segment's pages start at 2
        dest = _NoZero(162)
        o = two_pass_restore(
            pieces, 162, dest, FP, resume_at=lambda t: t // PT * PT, chunk_bytes=CHUNK
        )
        assert o.tokens == 162 and np.array_equal(dest.buf, kv)
    assert now[0] == 0
    assert peak[0] <= (DEPTH + 2) * CHUNK, f"{peak[0] / CHUNK} chunks of staging at once"
