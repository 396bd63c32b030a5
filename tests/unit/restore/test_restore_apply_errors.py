"""Errors on the apply side.

1. ``Delivery._apply`` advances ``applied`` only after ``Job.write`` returned, so what a failed
   copy wrote before it raised (a ``write_pages`` that fails part-way, or the earlier
   ``chunk_bytes`` steps of ``Job.write`` over a larger chunk: a ZSTD segment is one chunk) is
   never zeroed by ``abort``: the job raised, yet its bytes stay in the caller's buffer
   (README: "what the restore wrote and does not deliver (... an error) is zeroed before the
   call returns").
2. A destination whose ``zero`` raises: ``_Agenda.take`` calls ``d.abort()`` inside its
   ``except``, the second failure escapes ``take``, and the whole batch raises: the other
   requests' outcomes are lost and their delivered prefixes are zeroed (``restore_batch``:
   "an I/O error of that job only: the others still complete")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from stratastore.format import Codec
from stratastore.levels.local import SegmentStore
from stratastore.restore import FlatKV, Job, Outcome, Piece, restore_batch
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import flip, image

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens
CHUNK = 2 * PT * TB
CUTS = [0, 40, 80, 120, 160]


def test_a_copy_that_fails_part_way_leaves_what_it_wrote(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, _ = image(store, 1, CUTS)
        out = np.zeros(160 * TB, np.uint8)
        dest = FlatKV(FP, out, read_direct=False)
        real = dest.write_pages

        def failing(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
            real(t0, n, data, pt)  # e.g. some layers of a LayerKV copied, then one fails
            if t0 >= 60:
                raise OSError("the engine's buffer went away")

        dest.write_pages = failing  # type: ignore[method-assign]
        got = restore_batch([Job(pieces, 160, dest, FP, lambda t: 0, chunk_bytes=CHUNK)])
        assert isinstance(got[0], OSError)
        assert not out.any(), "the restore failed, yet the bytes of its last copy are still there"


def test_a_zstd_chunk_copied_in_steps_leaves_the_first_steps(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        kv = np.random.default_rng(2).integers(0, 256, 160 * TB, dtype=np.uint8)
        r = store.put_kv(store.root_key, np.arange(160), kv, token_start=0, codec=Codec.ZSTD)
        pieces = [Piece(0, 160, r.key, store)]
        out = np.zeros(160 * TB, np.uint8)
        dest = FlatKV(FP, out)
        real, calls = dest.write_pages, []

        def failing(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
            calls.append(t0)
            if len(calls) == 3:  # Job.write copies a chunk in chunk_bytes steps
                raise OSError("the engine's buffer went away")
            real(t0, n, data, pt)

        dest.write_pages = failing  # type: ignore[method-assign]
        got = restore_batch([Job(pieces, 160, dest, FP, lambda t: 0, chunk_bytes=CHUNK)])
        assert isinstance(got[0], OSError)
        assert not out.any(), "the restore failed, yet its first two steps are still there"


def test_a_zero_that_fails_fails_the_whole_batch(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, CUTS) for seed in range(3)]
        flip(store, imgs[1][0][3].key, 5 * PT * TB + 1)  # job 1 ladders to 0: zero is needed
        outs = [np.zeros(160 * TB, np.uint8) for _ in imgs]
        dests = [FlatKV(FP, o, read_direct=False) for o in outs]

        def broken_zero(t0: int, n: int) -> None:
            raise OSError("the device buffer cannot be cleared")

        dests[1].zero = broken_zero  # type: ignore[method-assign]
        jobs = [
            Job(p, 160, d, FP, lambda t: 0, chunk_bytes=CHUNK)
            for (p, _), d in zip(imgs, dests, strict=True)
        ]
        try:
            got = restore_batch(jobs)
        except OSError as e:
            raise AssertionError(f"job 1's zero failed and the whole batch raised: {e}") from e
        assert isinstance(got[1], OSError)
        for i in (0, 2):
            assert isinstance(got[i], Outcome) and got[i].tokens == 160  # type: ignore[union-attr]
            assert np.array_equal(outs[i], imgs[i][1])
