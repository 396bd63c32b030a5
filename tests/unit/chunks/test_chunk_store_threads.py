"""Threads putting and reading pages at once, while a full first level degrades into a second
that evicts: every read is the page's own bytes or a miss, never another's and never a move
counted as damage; every level ends within its budget; every page put is held, or was evicted
by this process."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_bytes
from tests.conftest import tiny_fp

PAGE = 4096
WRITERS, READERS, PAGES = 3, 2, 30


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def test_puts_and_reads_from_threads_through_the_cascade(tmp_path: Path) -> None:
    room = stored_bytes(PAGE)
    levels = [
        ChunkLevel(str(tmp_path / "fast"), 6 * room),
        ChunkLevel(f"memory://threads-{tmp_path.name[-24:]}", 10 * room),
    ]
    wrong: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()
    with ChunkStore.open(levels, tiny_fp()) as s:

        def write(w: int) -> None:
            try:
                for i in range(w, WRITERS * PAGES, WRITERS):
                    assert s.put(key(i), page(i)) in ("stored", "present")
            except BaseException as e:
                errors.append(e)

        def read(r: int) -> None:
            out = np.zeros(PAGE, np.uint8)
            try:
                while not done.is_set():
                    for i in range(r, WRITERS * PAGES, READERS):
                        n = s.get_into(key(i), out)
                        if n is not None and not np.array_equal(out, page(i)):
                            wrong.append(i)
            except BaseException as e:
                errors.append(e)

        writers = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
        readers = [threading.Thread(target=read, args=(r,)) for r in range(READERS)]
        for t in readers + writers:
            t.start()
        for t in writers:
            t.join(120)
        done.set()
        for t in readers:
            t.join(120)
        assert not errors and not wrong
        st = s.stats()
        assert st["damaged"] == 0 and st["read_errors"] == 0 and st["puts_refused"] == 0
        assert st["puts"] == WRITERS * PAGES == st["entries"] + st["evictions"]
        for row in s.describe():
            assert isinstance(row["used_bytes"], int) and isinstance(row["budget_bytes"], int)
            assert row["used_bytes"] <= row["budget_bytes"]
        held = [i for i in range(WRITERS * PAGES) if s.exists(key(i))]
        assert len(held) == st["entries"]
        assert all(s.get(key(i)) == page(i).tobytes() for i in held)
