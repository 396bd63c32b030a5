"""The batched read agenda: restores submitted together share one pipeline, and each one keeps the
two-pass contract: the same bytes and the same outcome as run alone, damage laddering (or failing)
that request only, read-ahead issued before the read pass needs it."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import BatchRestoreError, Store
from stratastore.format import data_name
from stratastore.levels.local import SegmentStore
from stratastore.restore import (
    FlatKV,
    Job,
    Outcome,
    Piece,
    RestoreFailed,
    restore_batch,
    two_pass_restore,
)
from tests.conftest import tiny_fp
from tests.unit.facade.test_store_facade import conversation

FP = tiny_fp()
TB, PT = FP.token_bytes, FP.page_tokens
MIB = 1 << 20


def image(store: SegmentStore, seed: int, cuts: list[int]) -> tuple[list[Piece], np.ndarray]:
    kv = np.random.default_rng(seed).integers(0, 256, cuts[-1] * TB, dtype=np.uint8)
    parent, pieces = store.root_key, []
    for a, b in itertools.pairwise(cuts):
        r = store.put_kv(parent, np.arange(a, b) + 1000 * seed, kv[a * TB : b * TB], token_start=a)
        pieces.append(Piece(a, b, r.key, store))
        parent = r.key
    return pieces, kv


def flip(store: SegmentStore, key: bytes, offset: int) -> None:
    path = Path(store.path) / data_name(key)
    raw = bytearray(path.read_bytes())
    raw[4096 + offset] ^= 0x01
    path.write_bytes(bytes(raw))


def page_floor(bad: int) -> int:
    return bad // PT * PT


def summary(o: Outcome | Exception) -> tuple[object, ...]:
    if isinstance(o, Exception):
        return (type(o), str(o))
    return (o.tokens, o.wanted, o.first_bad, o.reason, o.damaged)


def test_a_batch_equals_its_restores_run_one_by_one(tmp_path: Path) -> None:
    """Six images: whole, a flipped byte (first, middle page), a deleted segment, a truncated
    file, and one damaged with the ladder off; each request gets what it gets alone."""
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 12, 40, 64]) for seed in range(6)]
        flip(store, imgs[1][0][0].key, 3)  # page 0 of the first segment
        flip(store, imgs[2][0][1].key, 2 * PT * TB + 9)  # a middle page of the second
        (Path(store.path) / data_name(imgs[3][0][2].key)).unlink()
        path = Path(store.path) / data_name(imgs[4][0][1].key)
        path.write_bytes(path.read_bytes()[:-100])
        flip(store, imgs[5][0][2].key, 0)
        ladders = [True] * 5 + [False]

        def jobs(outs: list[np.ndarray]) -> list[Job]:
            return [
                Job(p, 60, FlatKV(FP, out), FP, page_floor, ladder)
                for (p, _), out, ladder in zip(imgs, outs, ladders, strict=True)
            ]

        alone_bufs = [np.full(64 * TB, 0xEE, np.uint8) for _ in imgs]
        alone: list[Outcome | Exception] = []
        for job in jobs(alone_bufs):
            try:
                alone.append(
                    two_pass_restore(
                        job.pieces,
                        job.wanted,
                        job.dest,
                        FP,
                        resume_at=page_floor,
                        ladder=job.ladder,
                    )
                )
            except RestoreFailed as e:
                alone.append(e)
        batch_bufs = [np.full(64 * TB, 0xEE, np.uint8) for _ in imgs]
        batch = restore_batch(jobs(batch_bufs))
        assert [summary(o) for o in batch] == [summary(o) for o in alone]
        for a, b in zip(alone_bufs, batch_bufs, strict=True):
            assert np.array_equal(a, b)
        got = [o.tokens if isinstance(o, Outcome) else None for o in batch]
        assert got == [60, 0, 12 + 2 * PT, 40, 12, None]
        for (_, kv), buf, n in zip(imgs, batch_bufs, got, strict=True):
            n = n or 0
            assert np.array_equal(buf[: n * TB], kv[: n * TB])
            past = buf[n * TB :]  # old bytes, or zeros where validated pages were taken back
            assert np.isin(past, [0, 0xEE]).all(), "nothing past the valid prefix delivered"
        assert isinstance(batch[5], RestoreFailed)


def test_read_ahead_runs_before_the_read_pass_needs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, bytes]] = []
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, [0, 16, 32]) for seed in range(4)]
        real_open = store.open_reader  # the read pass opens each segment it reads with it
        monkeypatch.setattr(store, "prefetch", lambda k: events.append(("prefetch", k)) or True)
        monkeypatch.setattr(
            store, "open_reader", lambda k: events.append(("read", k)) or real_open(k)
        )
        outs = [np.zeros(32 * TB, np.uint8) for _ in imgs]
        res = restore_batch(
            [
                Job(p, 32, FlatKV(FP, o), FP, page_floor)
                for (p, _), o in zip(imgs, outs, strict=True)
            ],
            readahead=2,
        )
        assert all(isinstance(r, Outcome) and r.tokens == 32 for r in res)
        for pieces, _ in imgs:
            for p in pieces:
                first_prefetch = events.index(("prefetch", p.key))
                assert first_prefetch < events.index(("read", p.key))
        # job 3's files are requested while job 1 is validated, before job 2's read pass ends
        assert events.index(("prefetch", imgs[3][0][0].key)) < events.index(
            ("read", imgs[2][0][0].key)
        )


def test_a_too_small_destination_fails_its_job_only(tmp_path: Path) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        (p1, kv1), (p2, _) = image(store, 1, [0, 32]), image(store, 2, [0, 32])
        ok = np.zeros(32 * TB, np.uint8)
        res = restore_batch(
            [
                Job(p1, 32, FlatKV(FP, ok), FP, page_floor),
                Job(p2, 32, FlatKV(FP, np.zeros(8 * TB, np.uint8)), FP, page_floor),
            ]
        )
        assert isinstance(res[0], Outcome) and np.array_equal(ok, kv1)
        assert "destination holds 8 tokens" in str(res[1])


def store_with_cold_images(
    tmp_path: Path, n: int, ladder: bool = True
) -> tuple[Store, list[tuple[npt.NDArray[np.int64], np.ndarray]]]:
    cfg = {"ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, "ladder": ladder}
    store = Store.open(FP, cfg)
    convs = []
    for i in range(n):
        conv, kv = conversation(f"c{i}", 96, 10_000 * (i + 1))
        assert store.park(conv, kv.copy()).where == "disk"
        convs.append((np.asarray(conv.tokens), kv))
    store.flush()
    return store, convs


def test_store_restore_many_matches_restore(tmp_path: Path) -> None:
    store, convs = store_with_cold_images(tmp_path, 4)
    with store:
        prompts = [np.concatenate([t, [1, 2]]) for t, _ in convs] + [np.arange(5)]
        outs = [np.zeros(len(p) * TB, np.uint8) for p in prompts]
        got = store.restore_many(list(zip(prompts, outs, strict=True)))
        assert [(r.source, r.tokens) for r in got] == [("disk", 96)] * 4 + [("none", 0)]
        for (_, kv), out in zip(convs, outs[:4], strict=True):
            assert np.array_equal(out[: kv.size], kv)
        s = store.stats()
        assert s["hits_disk"] == 4 and s["tokens_restored"] == 4 * 96
        assert s["tokens_reread"] == 4 * 2 + 5


def test_store_restore_many_with_the_ladder_off_reports_every_result(tmp_path: Path) -> None:
    store, convs = store_with_cold_images(tmp_path, 3, ladder=False)
    with store:
        victim = sorted((tmp_path / "cold").rglob("strata-conv-*.seg"), key=lambda q: q.name)
        data = victim[0]
        raw = bytearray(data.read_bytes())
        raw[4096] ^= 0xFF
        data.write_bytes(bytes(raw))
        outs = [np.zeros(len(t) * TB, np.uint8) for t, _ in convs]
        with pytest.raises(BatchRestoreError) as err:
            store.restore_many([(t, o) for (t, _), o in zip(convs, outs, strict=True)])
        results = err.value.results
        failed = [i for i, r in enumerate(results) if isinstance(r, RestoreFailed)]
        assert len(failed) == 1 and "1 of 3 restores failed" in str(err.value)
        for i, ((_, kv), out) in enumerate(zip(convs, outs, strict=True)):
            if i in failed:
                assert not out.any(), "a failed request got nothing"
            else:
                assert np.array_equal(out, kv)


def test_store_restore_many_refuses_a_too_small_destination_before_anything_runs(
    tmp_path: Path,
) -> None:
    from stratastore import StrataError

    store, convs = store_with_cold_images(tmp_path, 2)
    with store:
        (t0, _), (t1, _) = convs
        ok = np.zeros(len(t0) * TB, np.uint8)
        with pytest.raises(StrataError, match="needs room for all of them"):
            store.restore_many([(t0, ok), (t1, np.zeros(3 * TB, np.uint8))])
        assert not ok.any(), "nothing ran"
        assert store.stats()["hits_disk"] == 0
