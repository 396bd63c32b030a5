"""Read-ahead hints (:mod:`stratastore.io.read_ahead`) are served off the thread that asks: the
asker never waits for a blocked ``WILLNEED`` (a busy device), may close its descriptor at once,
and leaves no descriptor open when hints are dropped; a range already in the page cache is not
asked for again; a cold one asked for ends up resident."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from strata_harness.peer_protocol import evict, resident, warm
from stratastore.io import files, read_ahead
from stratastore.levels.local import SegmentStore
from tests.conftest import tiny_fp
from tests.unit.restore.test_agenda import image

MIB = 1 << 20


def _cold_file(tmp_path: Path, nbytes: int = 8 * MIB) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, nbytes, np.uint8).tobytes())
    if evict([str(path)]) > 0.01:
        pytest.skip(f"{tmp_path}'s filesystem keeps the file's pages resident after DONTNEED")
    return path


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _record_advice(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    asked: list[tuple[int, int]] = []
    real = files.advise_range

    def advising(fd: int, offset: int, nbytes: int) -> None:
        asked.append((offset, nbytes))
        real(fd, offset, nbytes)

    monkeypatch.setattr(files, "advise_range", advising)
    return asked


def test_a_cold_range_asked_for_is_read_in_after_the_asker_closed_its_descriptor(
    tmp_path: Path,
) -> None:
    path = _cold_file(tmp_path)
    fd = os.open(path, os.O_RDONLY)
    read_ahead.ask(fd, 0, 8 * MIB)
    os.close(fd)  # the hint holds a descriptor of its own
    read_ahead.settle()
    deadline = time.monotonic() + 60  # the reads were started; this waits for the disk
    while (have := resident([str(path)]))[0] < have[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert have[0] == have[1], f"{have[0]} of {have[1]} pages resident after the hint"


def test_a_resident_range_is_not_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _cold_file(tmp_path)
    asked = _record_advice(monkeypatch)
    assert warm([str(path)]) > 0.99
    with open(path, "rb") as f:
        read_ahead.ask(f.fileno(), 0, 8 * MIB)
        read_ahead.settle()
        assert asked == [], "WILLNEED was asked for pages already in the page cache"
        evict([str(path)])
        read_ahead.ask(f.fileno(), MIB, 2 * MIB)
        read_ahead.settle()
    assert asked == [(MIB, 2 * MIB)], "the cold range was not asked for"


def test_the_asker_never_waits_for_a_blocked_hint_and_dropped_hints_leave_nothing_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _cold_file(tmp_path)
    release, blocked = threading.Event(), threading.Event()

    def stuck(fd: int, offset: int, nbytes: int) -> None:  # a device whose queue is full
        blocked.set()
        assert release.wait(60)

    monkeypatch.setattr(files, "advise_range", stuck)
    before = _open_fds()
    fd = os.open(path, os.O_RDONLY)
    try:
        read_ahead.ask(fd, 0, MIB)
        assert blocked.wait(30), "the hint never reached the read-ahead thread"
        for i in range(3 * read_ahead.QUEUE):  # more than the queue holds: the rest dropped
            read_ahead.ask(fd, i * 4096, 4096)
        assert _open_fds() <= before + 2 + read_ahead.QUEUE  # ours, the served and queued ones
    finally:
        os.close(fd)
        release.set()
    read_ahead.settle()
    assert _open_fds() == before, "a hint's descriptor was left open"


def test_a_reader_asked_to_read_ahead_returns_while_the_hint_is_blocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = tiny_fp()
    release, caller = threading.Event(), threading.current_thread()
    on_the_caller: list[int] = []

    def stuck(fd: int, offset: int, nbytes: int) -> None:  # a device whose queue is full
        if threading.current_thread() is caller:
            on_the_caller.append(offset)  # the reader itself would wait here
            return
        release.wait(60)

    monkeypatch.setattr(files, "advise_range", stuck)
    with SegmentStore.open(tmp_path / "s", fp) as store:
        pieces, _ = image(store, 3, [0, 40])
        with store.open_reader(pieces[0].key) as seg:
            evict([str(p) for p in (tmp_path / "s").iterdir() if p.is_file()])
            seg.advise(0, 40 * fp.token_bytes)
            out = np.empty(40 * fp.token_bytes, np.uint8)
            seg.read_into(out, 0)
        assert store.prefetch(pieces[0].key) is True
        release.set()
    read_ahead.settle()
    assert on_the_caller == [], "the reader's own thread asked the kernel for read-ahead"


def test_a_range_past_the_files_end_is_judged_by_the_last_page_the_file_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch asks for more than a small file holds: its last page, not a byte past the
    end (which reads nothing and so looks resident), decides whether it is asked for."""
    path = _cold_file(tmp_path, 4 * MIB)
    asked = _record_advice(monkeypatch)
    assert warm([str(path)]) > 0.99
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 4096, 0, os.POSIX_FADV_DONTNEED)  # all but the first page
        read_ahead.ask(f.fileno(), 0, 32 * MIB)
        read_ahead.settle()
    assert asked == [(0, 4 * MIB)], "the file's cold pages were not asked for"
