"""``resume_at`` that is not non-decreasing (a documented assumption of ``two_pass``, not checked),
with a destination without ``zero()``. ``Delivery.take`` applied tokens ``[0, 80)`` below
``resume_at(hi)``; the damage at 140 gives ``resume_at(140) == 0``; ``Delivery._release`` then hits
``assert self.zero is not None``: the ``AssertionError`` is raised again by ``abort`` inside
``_Agenda.take``'s ``except``, escapes it and the whole batch raises (the other request's outcome is
lost), with 80 tokens left in the destination. Under ``python -O`` the assert is gone: the job
reports 0 tokens and leaves 80 in the buffer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError
from stratastore.levels.local import SegmentStore
from stratastore.restore import FlatKV, Job, Outcome, restore_batch
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import flip, image

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens
CUTS = [0, 40, 80, 120, 160]


class _NoZero:
    def __init__(self, n: int) -> None:
        self.buf = np.full(n * TB, 0xEE, np.uint8)

    def capacity(self) -> int:
        return self.buf.size // TB

    def write_pages(self, t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        self.buf[t0 * TB : (t0 + n) * TB] = data[: n * TB]


def test_a_non_monotone_resume_at_fails_its_job_only_and_typed(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, _ = image(store, 1, CUTS)
        other, _ = image(store, 2, CUTS)
        flip(store, pieces[3].key, 5 * PT * TB + 1)  # token 140
        dest, ob = _NoZero(160), np.zeros(160 * TB, np.uint8)
        jobs = [
            Job(other, 160, FlatKV(FP, ob), FP, lambda t: 0, chunk_bytes=2 * PT * TB),
            Job(
                pieces, 160, dest, FP, lambda t: 80 if 80 <= t < 120 else 0, chunk_bytes=2 * PT * TB
            ),
        ]
        try:
            got = restore_batch(jobs)
        except AssertionError as e:
            raise AssertionError(f"one job's resume_at failed the whole batch: {e}") from e
        assert isinstance(got[0], Outcome) and got[0].tokens == 160
        # tokens [0, 80) were applied below resume_at(80) = 80; resume_at(140) = 0 takes them
        # back, which a destination without zero() cannot: that job alone fails, typed, and
        # says why (the precondition is a non-decreasing resume_at)
        assert isinstance(got[1], StrataError) and "non-decreasing" in str(got[1])
