"""The read pass asks the kernel for the chunks after the one it reads (at the first, for that one
too), so a cold segment's disk reads run while the chunk before is hashed: every byte a restore
reads was asked for first, each once, nothing past the segment's payload, and the hint reaches
the page cache (a cold file's asked-for range is resident afterwards)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from strata_harness.peer_protocol import evict, resident
from stratastore.io import files
from stratastore.levels.local import SegmentStore
from stratastore.levels.reader import SegmentReader
from stratastore.restore import FlatKV, PagedKV, Piece, two_pass_restore
from stratastore.restore.reads import AHEAD_CHUNKS
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import image

FP = tiny_fp()  # 64 bytes a token, 4-token pages
TB, PT = FP.token_bytes, FP.page_tokens
CHUNK = 2 * PT * TB  #: two pages a chunk
CUTS = [0, 40, 80]  # 2 segments of 10 pages: 5 chunks each


class _Log:
    """What each segment's reader was asked for and what it read, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, int, int, int]] = []  # (kind, segment start, a, b)
        self.lock = threading.Lock()
        advise, read_at, readv_at = (
            SegmentReader.advise,
            SegmentReader._read_at,
            SegmentReader._readv_at,
        )
        log = self

        def advising(self: SegmentReader, offset: int, nbytes: int) -> None:
            log.add("advise", self, offset, offset + nbytes)
            advise(self, offset, nbytes)

        def reading(self: SegmentReader, view: memoryview, offset: int) -> None:
            log.add("read", self, offset, offset + view.nbytes)
            read_at(self, view, offset)

        def reading_v(self: SegmentReader, views: list[memoryview], offset: int) -> None:
            log.add("read", self, offset, offset + sum(v.nbytes for v in views))
            readv_at(self, views, offset)

        monkeypatch.setattr(SegmentReader, "advise", advising)
        monkeypatch.setattr(SegmentReader, "_read_at", reading)
        monkeypatch.setattr(SegmentReader, "_readv_at", reading_v)

    def add(self, kind: str, seg: SegmentReader, a: int, b: int) -> None:
        with self.lock:
            self.events.append((kind, seg.sidecar.token_start, a, b))


def _restore(pieces: list[Piece], dest: FlatKV | PagedKV) -> int:
    return two_pass_restore(
        pieces, 80, dest, FP, resume_at=lambda t: t // PT * PT, chunk_bytes=CHUNK
    ).tokens


def _dests() -> list[tuple[str, FlatKV | PagedKV, npt.NDArray[np.uint8] | None]]:
    flat = np.zeros(80 * TB, np.uint8)
    direct = np.zeros(80 * TB, np.uint8)
    pools = [
        np.zeros((2, 20, PT, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(FP.n_layers)
    ]
    return [
        ("staged", FlatKV(FP, flat, read_direct=False), flat),
        ("direct", FlatKV(FP, direct, read_direct=True), direct),
        ("paged", PagedKV(FP, pools, np.arange(20)[::-1].copy()), None),
    ]


@pytest.mark.parametrize("which", ["staged", "direct", "paged"])
def test_every_byte_read_was_asked_for_once_before_it_was_read_and_chunks_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    store = SegmentStore.open(tmp_path / "s", FP)
    try:
        pieces, kv = image(store, 3, CUTS)
        name, dest, out = next(d for d in _dests() if d[0] == which)
        log = _Log(monkeypatch)
        assert _restore(pieces, dest) == 80
        if out is not None:
            assert np.array_equal(out, kv[: 80 * TB])
        payload = 40 * TB
        for seg in (0, 40):
            events = [e for e in log.events if e[1] == seg]
            reads = [(a, b) for kind, _, a, b in events if kind == "read"]
            assert reads and sum(b - a for a, b in reads) == payload, name
            for i, (kind, _, a, b) in enumerate(events):
                if kind != "read":
                    assert 0 <= a < b <= payload, f"{name}: asked for [{a}, {b}) past the payload"
                    continue
                asked = [(x, y) for k, _, x, y in events[:i] if k == "advise"]
                assert any(x <= a and b <= y for x, y in asked), f"{name}: [{a}, {b}) not asked"
            # before each chunk is read, the AHEAD_CHUNKS after it were asked for (to the
            # payload's end); each byte is asked for once
            advised = [(a, b) for kind, _, a, b in events if kind == "advise"]
            asked = np.zeros(payload, np.int64)
            for a, b in advised:
                asked[a:b] += 1
            assert (asked == 1).all(), f"{name}: bytes asked for more than once, or never"
            for chunk in range(0, payload, CHUNK):
                first = next(i for i, e in enumerate(events) if e[0] == "read" and e[2] >= chunk)
                reach = max(b for k, _, a, b in events[:first] if k == "advise")
                assert reach == min(payload, chunk + (1 + AHEAD_CHUNKS) * CHUNK), (name, chunk)
    finally:
        store.close()


def test_a_reader_asked_for_bytes_outside_its_payload_or_after_close_does_nothing(
    tmp_path: Path,
) -> None:
    store = SegmentStore.open(tmp_path / "s", FP)
    try:
        pieces, _ = image(store, 3, CUTS)
        with store.open_reader(pieces[0].key) as seg:
            for offset, nbytes in [(-5, 10), (0, 0), (0, -1), (40 * TB, 100), (1 << 62, 1 << 62)]:
                seg.advise(offset, nbytes)
        seg.advise(0, 40 * TB)  # closed: a hint still never raises
    finally:
        store.close()


def test_advise_range_never_raises_on_a_bad_descriptor_or_range() -> None:
    files.advise_range(-1, 0, 1 << 20)
    r, w = os.pipe()
    try:
        files.advise_range(r, 0, 1 << 20)  # a pipe: ESPIPE, ignored
    finally:
        os.close(r)
        os.close(w)
    assert files.advise_willneed("/nonexistent/strata-read-ahead", 1 << 20) is False


def test_a_cold_file_asked_for_is_read_into_the_page_cache(tmp_path: Path) -> None:
    """The whole range asked for is read, not only the kernel's first read-ahead window (a
    single WILLNEED over a long range starts one window and no more)."""
    path = tmp_path / "cold.bin"
    nbytes = 24 << 20
    path.write_bytes(np.random.default_rng(0).integers(0, 256, nbytes, np.uint8).tobytes())
    if evict([str(path)]) > 0.01:
        pytest.skip(f"{tmp_path}'s filesystem keeps the file's pages resident after DONTNEED")
    fd = os.open(path, os.O_RDONLY)
    try:
        files.advise_range(fd, 0, nbytes)
        deadline = time.monotonic() + 60  # the reads were started; this waits for the disk
        while True:
            have, total = resident([str(path)])
            if have == total or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert have == total, f"{have} of {total} pages resident after asking for all of them"
    finally:
        os.close(fd)
