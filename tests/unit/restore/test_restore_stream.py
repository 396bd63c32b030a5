"""A restore streams through bounded staging, chunk by chunk; reading, hashing and copying overlap;
what was written past the prefix it reports is taken back (zeroed), never a byte that failed
validation; a destination that cannot zero is written only where no later damage can take it
back."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore.levels.local import SegmentStore
from stratastore.levels.reader import SegmentReader
from stratastore.levels.staging import STAGING
from stratastore.restore import FlatKV, LayerKV, Outcome, Piece, restore_batch, two_pass_restore
from stratastore.restore.agenda import DEPTH
from stratastore.restore.two_pass import Job
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import flip, image

FP = tiny_fp()  # 64 bytes a token, 4-token pages
TB, PT = FP.token_bytes, FP.page_tokens
CHUNK = 2 * PT * TB  #: two pages a chunk
CUTS = [0, 40, 80, 120, 160]  # 4 segments of 10 pages: 5 chunks each


@pytest.fixture
def img(tmp_path: Path) -> tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]:
    store = SegmentStore.open(tmp_path / "s", FP)
    pieces, kv = image(store, 7, CUTS)
    yield store, pieces, kv  # type: ignore[misc]
    store.close()


def layer_dest(n: int, **kw: bool) -> tuple[LayerKV, list[np.ndarray]]:
    arrays = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(2 * FP.n_layers)]
    return LayerKV(FP, arrays[: FP.n_layers], arrays[FP.n_layers :], **kw), arrays


def stored_rows(kv: npt.NDArray[np.uint8]) -> list[npt.NDArray[np.uint8]]:
    """K and V of each layer as ``[tokens, row]`` bytes, from the stored page layout (every
    segment starts on a page here)."""
    pages = kv.reshape(-1, FP.n_layers, 2, PT, TB // (2 * FP.n_layers))
    return [
        pages[:, layer, kind].reshape(-1, TB // (2 * FP.n_layers))
        for layer in range(FP.n_layers)
        for kind in (0, 1)
    ]


class _Outstanding:
    """The staging bytes taken and not yet given back, at most, during a restore."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()
        take, give = STAGING.take, STAGING.give

        asked: dict[int, int] = {}  # buffer id -> the bytes asked for

        def taking(nbytes: int) -> npt.NDArray[np.uint8]:
            buf = take(nbytes)
            with self.lock:
                asked[id(buf)] = nbytes
                self.now += nbytes
                self.peak = max(self.peak, self.now)
            return buf

        def giving(buf: npt.NDArray[np.uint8]) -> None:
            with self.lock:
                self.now -= asked.pop(id(buf))
            give(buf)

        monkeypatch.setattr(STAGING, "take", taking)
        monkeypatch.setattr(STAGING, "give", giving)


@pytest.mark.parametrize("resume", ["page", "checkpoints only", "ladder off"])
def test_staging_is_bounded_whatever_the_resume_points(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
    monkeypatch: pytest.MonkeyPatch,
    resume: str,
) -> None:
    """Through staging (``read_direct=False``), a 160-token image of 20 chunks holds at most
    ``DEPTH + 2`` chunks at once, also when the only resume point is token 0 (the chunks are
    applied as they validate, and taken back if damage follows) and with the ladder off."""
    _, pieces, kv = img
    held = _Outstanding(monkeypatch)
    out = np.zeros(160 * TB, np.uint8)
    o = two_pass_restore(
        pieces,
        160,
        FlatKV(FP, out, read_direct=False),
        FP,
        resume_at=(lambda t: t // PT * PT) if resume == "page" else lambda t: 0,
        ladder=resume != "ladder off",
        chunk_bytes=CHUNK,
    )
    assert o.tokens == 160 and np.array_equal(out, kv)
    assert held.now == 0, "every staging buffer was given back"
    assert 0 < held.peak <= (DEPTH + 2) * CHUNK, f"{held.peak / CHUNK} chunks at once, of 20"


@pytest.mark.parametrize("direct", [False, True])
def test_damage_after_applied_chunks_takes_them_back(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], direct: bool
) -> None:
    """Damage in the last segment of a conversation whose only resume point is token 0: the
    three segments already applied are zeroed, the outcome is 0 tokens; with a checkpoint at 80,
    80 tokens are delivered and nothing past them; the ladder off raises and leaves nothing."""
    store, pieces, kv = img
    flip(store, pieces[3].key, 5 * PT * TB + 1)  # page 5 of the last segment: token 140
    for resume, expect in [(lambda t: 0, 0), (lambda t: 80 if t >= 80 else 0, 80)]:
        dest, arrays = layer_dest(160, read_direct=direct)
        o = two_pass_restore(pieces, 160, dest, FP, resume_at=resume, chunk_bytes=CHUNK)
        assert (o.tokens, o.first_bad) == (expect, 140)
        want = stored_rows(kv)  # K0 V0 K1 V1; the arrays are K0 K1 V0 V1
        for a, i in zip(arrays, [0, 2, 1, 3], strict=True):
            b = a.view(np.uint8).reshape(160, -1)
            assert np.array_equal(b[:expect], want[i][:expect])
            assert not b[expect:].any(), "everything past the prefix was taken back"
    dest, arrays = layer_dest(160, read_direct=direct)
    with pytest.raises(Exception, match="token 140"):
        two_pass_restore(
            pieces, 160, dest, FP, resume_at=lambda t: 0, ladder=False, chunk_bytes=CHUNK
        )
    assert not any(a.any() for a in arrays)


def test_reading_overlaps_the_copy(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one chunk is copied into the destination, the next ones are read and hashed (the
    worker thread runs ahead by the hand-off's depth)."""
    _, pieces, kv = img
    out = np.zeros(160 * TB, np.uint8)
    flat = FlatKV(FP, out, read_direct=False)
    events: list[tuple[str, int]] = []
    real_read = SegmentReader._read_at

    def reading(seg: SegmentReader, view: memoryview, offset: int) -> None:
        events.append(("read", offset))
        real_read(seg, view, offset)

    real_write = flat.write_pages

    def writing(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        events.append(("copy start", t0))
        time.sleep(0.02)
        real_write(t0, n, data, pt)
        events.append(("copy end", t0))

    monkeypatch.setattr(SegmentReader, "_read_at", reading)
    flat.write_pages = writing  # type: ignore[method-assign]
    o = two_pass_restore(pieces, 160, flat, FP, resume_at=lambda t: 0, chunk_bytes=CHUNK)
    assert o.tokens == 160 and np.array_equal(out, kv)
    first_end = events.index(("copy end", 0))
    reads_before = sum(1 for e in events[:first_end] if e[0] == "read")
    assert reads_before >= 2, f"the next chunk was read while chunk 0 was copied: {events[:8]}"
    last_read = max(i for i, e in enumerate(events) if e[0] == "read")
    assert first_end < last_read, "the copy began before the whole image was read (streaming)"


class _NoZero:
    """A destination of the protocol alone (no ``zero``): it records what it is given."""

    def __init__(self, n: int) -> None:
        self.buf = np.full(n * TB, 0xEE, np.uint8)
        self.writes: list[tuple[int, int]] = []

    def capacity(self) -> int:
        return self.buf.size // TB

    def write_pages(self, t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        self.writes.append((t0, n))
        self.buf[t0 * TB : (t0 + n) * TB] = data[: n * TB]


def test_a_destination_that_cannot_zero_is_written_only_below_the_prefix(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
) -> None:
    store, pieces, kv = img
    flip(store, pieces[2].key, 3 * PT * TB)  # token 92
    dest = _NoZero(160)
    o = two_pass_restore(
        pieces, 160, dest, FP, resume_at=lambda t: 80 if t >= 80 else 0, chunk_bytes=CHUNK
    )
    assert o.tokens == 80 and max(t0 + n for t0, n in dest.writes) == 80
    assert np.array_equal(dest.buf[: 80 * TB], kv[: 80 * TB])
    assert (dest.buf[80 * TB :] == 0xEE).all()


def test_a_copy_that_fails_fails_its_job_only_and_takes_back_what_it_wrote(
    tmp_path: Path,
) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [image(store, seed, CUTS) for seed in range(3)]
        outs = [np.zeros(160 * TB, np.uint8) for _ in imgs]
        dests = [FlatKV(FP, o, read_direct=False) for o in outs]
        real = dests[1].write_pages

        def failing(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
            if t0 >= 60:
                raise OSError("the engine's buffer went away")
            real(t0, n, data, pt)

        dests[1].write_pages = failing  # type: ignore[method-assign]
        jobs = [
            Job(p, 160, d, FP, lambda t: 0, chunk_bytes=CHUNK)
            for (p, _), d in zip(imgs, dests, strict=True)
        ]
        got = restore_batch(jobs)
        assert isinstance(got[1], OSError) and not outs[1].any()
        for i in (0, 2):
            assert isinstance(got[i], Outcome) and got[i].tokens == 160  # type: ignore[union-attr]
            assert np.array_equal(outs[i], imgs[i][1])


def test_a_read_error_inside_a_segment_stops_at_its_chunk(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error on the third chunk of the second segment: the ladder stops at that chunk's
    first token (not the segment's), the chunks before it delivered."""
    _, pieces, kv = img
    from stratastore.io.errors import StrataIOError

    real = SegmentReader._read_at

    def failing(seg: SegmentReader, view: memoryview, offset: int) -> None:
        if seg.sidecar.token_start == 40 and offset <= 2 * CHUNK < offset + view.nbytes:
            raise StrataIOError("pread", "seg", 5, "injected")
        real(seg, view, offset)

    monkeypatch.setattr(SegmentReader, "_read_at", failing)
    for direct in (False, True):
        out = np.full(160 * TB, 0xEE, np.uint8)
        o = two_pass_restore(
            pieces,
            160,
            FlatKV(FP, out, read_direct=direct),
            FP,
            resume_at=lambda t: t // PT * PT,
            chunk_bytes=CHUNK,
        )
        stop = 56  # the chunk the error hit: [56, 64) of the segment [40, 80)
        assert (o.tokens, o.first_bad) == (stop, stop) and "injected" in (o.reason or "")
        assert np.array_equal(out[: stop * TB], kv[: stop * TB])
        assert np.isin(out[stop * TB :], [0, 0xEE]).all()


def test_every_chunk_boundary_and_page_cut(
    img: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
) -> None:
    """Any wanted length, any chunk size: whole pages of each segment, bytes identical."""
    _, pieces, kv = img
    for wanted, pages in itertools.product([1, 39, 40, 41, 83, 159, 160], [1, 3, 16]):
        out = np.zeros(160 * TB, np.uint8)
        o = two_pass_restore(
            pieces,
            wanted,
            FlatKV(FP, out, read_direct=False),
            FP,
            resume_at=lambda t: 0,
            chunk_bytes=pages * PT * TB,
        )
        seg_start = max(c for c in CUTS if c <= wanted)
        expect = wanted if wanted in CUTS else seg_start + (wanted - seg_start) // PT * PT
        assert o.tokens == expect, (wanted, pages)
        assert np.array_equal(out[: expect * TB], kv[: expect * TB])
        assert not out[expect * TB :].any()


def test_a_scatter_read_continues_after_short_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``preadv_exact`` fills every piece when the kernel returns less than asked, and stops
    early only when everything was filled."""
    import os

    from stratastore.io import files

    data = np.random.default_rng(1).integers(0, 256, 10_000, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    real = os.preadv
    calls: list[int] = []

    def short(fd: int, bufs: list[memoryview], offset: int) -> int:
        calls.append(offset)
        return real(fd, [bufs[0][: max(1, bufs[0].nbytes // 2)]], offset)  # half of one piece

    outs = [np.zeros(n, np.uint8) for n in (3000, 1, 4999, 2000)]
    fd = os.open(path, os.O_RDONLY)
    try:
        monkeypatch.setattr(files.os, "preadv", short)
        files.preadv_exact(fd, [o.data for o in outs], 0, str(path))
        assert len(calls) > 4
        monkeypatch.setattr(files.os, "preadv", real)
        whole = [np.zeros(n, np.uint8) for n in (3000, 1, 4999, 2000)]
        files.preadv_exact(fd, [o.data for o in whole], 0, str(path))
    finally:
        os.close(fd)
    assert np.array_equal(np.concatenate(outs), data) and np.array_equal(
        np.concatenate(whole), data
    )
