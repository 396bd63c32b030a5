"""When the apply side (the caller's thread) dies with a BaseException (Ctrl-C, or an exception
raised out of ``Delivery.abort``), ``_Agenda.pipeline``'s ``finally`` drains the hand-off queue only
``while worker.is_alive()``. A chunk the reader put after the last ``get_nowait`` and before it
exited stays in the queue: never released, so its staging is never given back and, for a direct
read, what it placed in the caller's destination (the bad page included) is never zeroed.

No window is widened: the reader puts its last chunk and exits between the consumer's last
``get_nowait`` and its ``is_alive`` check (50 runs of 50 here)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore.levels.local import SegmentStore
from stratastore.restore import FlatKV, Piece, two_pass_restore
from stratastore.restore.two_pass import Delivery
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import flip, image
from tests.unit.restore.test_restore_interrupt import _watch_staging

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens
CHUNK = 2 * PT * TB
CUTS = [0, 40, 80, 120, 160]


@pytest.fixture
def img(tmp_path: Path) -> tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]:
    store = SegmentStore.open(tmp_path / "s", FP)
    pieces, kv = image(store, 7, CUTS)
    yield store, pieces, kv  # type: ignore[misc]
    store.close()


def _ctrl_c_on_first_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C arrives while the caller's thread applies the first chunk (the reader has filled
    the hand-off meanwhile)."""
    real = Delivery.take
    calls = []

    def take(self: Delivery, item: object) -> None:
        real(self, item)  # type: ignore[arg-type]
        if not calls:
            calls.append(1)
            time.sleep(0.3)  # the reader fills the queue and blocks on its next put
            raise KeyboardInterrupt

    monkeypatch.setattr(Delivery, "take", take)


def test_a_damaged_direct_chunk_left_in_the_queue_stays_in_the_destination(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pieces, _ = img
    flip(store, pieces[3].key, 5 * PT * TB + 1)  # page 5 of the last segment: token 140
    _ctrl_c_on_first_take(monkeypatch)
    out = np.zeros(160 * TB, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(pieces, 160, FlatKV(FP, out), FP, resume_at=lambda t: 0, chunk_bytes=CHUNK)
    assert not [t.name for t in threading.enumerate() if t.name == "strata-agenda-read"]
    bad = out[140 * TB : 144 * TB]
    assert not bad.any(), "a page that failed BLAKE3 is in the caller's buffer after the call"
    assert not out.any(), "the restore raised: nothing it wrote may remain"


def test_a_staged_chunk_left_in_the_queue_is_never_given_back(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pieces, _ = img
    outstanding = _watch_staging(monkeypatch)
    _ctrl_c_on_first_take(monkeypatch)
    out = np.zeros(160 * TB, np.uint8)
    with pytest.raises(KeyboardInterrupt):
        two_pass_restore(
            pieces,
            160,
            FlatKV(FP, out, read_direct=False),
            FP,
            resume_at=lambda t: 0,
            chunk_bytes=CHUNK,
        )
    assert not outstanding, f"{len(outstanding)} staging buffers never given back"
