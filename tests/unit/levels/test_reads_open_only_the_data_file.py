"""A directory level keeps the sidecars it wrote or checked, by key and index record, so a read of
a page it knows opens only the data file; the header of that file is checked with the first
read (in the same call as the pages), before any byte is handed back. A sidecar kept is used
only while the index lists the record it was kept under: a page deleted and written again, here
or by another process on the same directory, is read with its new sidecar, never checked
against the old digests (which would call a good copy damaged and delete it)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_key
from stratastore.format import FormatError, IndexRecord, Kind, Level, data_name, sidecar_name
from stratastore.format.sidecar import Codec
from stratastore.io import faults, files
from stratastore.levels import reader
from stratastore.levels.local.sidecar_cache import SidecarCache
from stratastore.levels.reader import SegmentReader
from tests.conftest import tiny_fp

ROOT = Path(__file__).resolve().parents[3]
PAGE = 5 * 4096


def page(seed: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(seed).integers(0, 256, PAGE, np.uint8)


def opened_names(log: list[tuple[str, str]]) -> list[str]:
    """The files an operation was made on (open, read, stat), once an operation."""
    return [Path(p).name for _, p in log]


def test_a_page_written_or_read_here_is_read_without_its_sidecar(tmp_path: Path) -> None:
    k = chunk_key("known")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(1)) == "stored"
        with faults.inject(record=True) as rec:
            assert cs.get(k) == page(1).tobytes()
        assert set(opened_names(rec.log)) == {data_name(stored_key(k))}
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        with faults.inject(record=True) as rec:  # a new process: the sidecar is read once
            assert cs.get(k) == page(1).tobytes()
            assert cs.get(k) == page(1).tobytes()
        side, data = sidecar_name(stored_key(k)), data_name(stored_key(k))
        assert opened_names(rec.log).count(side) == 1  # the first read's
        assert set(opened_names(rec.log)) == {side, data}


def test_a_page_written_again_by_another_process_is_read_with_its_new_sidecar(
    tmp_path: Path,
) -> None:
    k = chunk_key("rewritten")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(1)) == "stored"
        assert cs.get(k) == page(1).tobytes()
        other = (
            "import numpy as np\n"
            "from stratastore import ChunkLevel, ChunkStore\n"
            "from tests.conftest import tiny_fp\n"
            f"from tests.unit.levels.test_reads_open_only_the_data_file import page\n"
            f"with ChunkStore.open([ChunkLevel({str(tmp_path)!r}, budget_bytes=1 << 24)], "
            "tiny_fp()) as cs:\n"
            f"    assert cs.remove({k!r})\n"
            f"    assert cs.put({k!r}, page(2)) == 'stored'\n"
        )
        subprocess.run([sys.executable, "-c", other], cwd=ROOT, check=True, timeout=120)
        assert cs.get(k) == page(2).tobytes()  # the new bytes, checked against the new digests
        assert cs.stats()["damaged"] == 0
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.get(k) == page(2).tobytes()  # nothing was deleted as damage


def test_a_damaged_header_is_found_by_the_first_read_and_nothing_is_delivered(
    tmp_path: Path,
) -> None:
    k = chunk_key("bad-head")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(3)) == "stored"
        data = tmp_path / data_name(stored_key(k))
        raw = bytearray(data.read_bytes())
        raw[20] ^= 0x01  # inside the header's key
        data.write_bytes(bytes(raw))
        out = np.zeros(PAGE, np.uint8)
        assert cs.get_into(k, out) is None
        assert cs.stats()["damaged"] == 1
        assert not data.exists()  # the damaged copy is removed; the next put writes it again


def test_a_reader_of_an_unusual_size_checks_the_header_when_it_opens(tmp_path: Path) -> None:
    k = chunk_key("padded")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(4)) == "stored"
        sc = cs.backends[0].sidecar(stored_key(k))
    data = tmp_path / data_name(stored_key(k))
    with open(data, "ab") as f:
        f.write(b"\0")
    with pytest.raises(FormatError, match="truncated or padded"):
        SegmentReader(sc, str(data)).close()


def test_a_cold_page_read_into_aligned_memory_leaves_the_page_cache_as_it_was(
    tmp_path: Path,
) -> None:
    k = chunk_key("cold")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(5)) == "stored"
        path = str(tmp_path / data_name(stored_key(k)))
        fd = files.open_read(path)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if files.cached_pages(fd, 0, PAGE + 4096) is None:
                pytest.skip("this kernel cannot say what is cached (no cachestat: Linux < 6.5)")
            out = memoryview(mmap.mmap(-1, PAGE))  # page-aligned, like an engine's pinned pool
            assert cs.get_into(k, out) == PAGE
            assert bytes(out) == page(5).tobytes()
            assert files.cached_pages(fd, 0, PAGE + 4096) == 0  # read past the cache
        finally:
            files.close(fd)
        assert cs.get_into(k, out) == PAGE and bytes(out) == page(5).tobytes()


def test_a_process_forked_after_a_read_has_header_memory_of_its_own(tmp_path: Path) -> None:
    k = chunk_key("forked")
    with ChunkStore.open([ChunkLevel(str(tmp_path), budget_bytes=1 << 24)], tiny_fp()) as cs:
        assert cs.put(k, page(6)) == "stored"
        assert cs.get(k) == page(6).tobytes()
        block = reader._head_block()
        before = bytes(block)
        pid = os.fork()
        if pid == 0:  # the child scribbles over its own block, then leaves at once
            reader._head_block()[:] = b"\xff" * len(block)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        assert bytes(block) == before  # the parent's header memory is its own
        assert cs.get(k) == page(6).tobytes()


def record(sealed: int, sidecar_bytes: int = 300) -> IndexRecord:
    return IndexRecord(
        Kind.STATE, Level.COLD, Codec.RAW, 0, 1, PAGE, sidecar_bytes, PAGE + 4096, 0, 0, sealed,
        b"\0" * 32,
    )  # fmt: skip


def test_the_cache_answers_only_for_the_record_it_was_given_and_stays_bounded() -> None:
    sc = object()
    cache = SidecarCache(max_entries=3, max_bytes=1000)
    cache.put(b"a", record(1), sc)  # type: ignore[arg-type]
    assert cache.get(b"a", record(1)) is sc
    assert cache.get(b"a", record(2)) is None  # written again since: not this sidecar
    for key in (b"b", b"c", b"d"):
        cache.put(key, record(1), sc)  # type: ignore[arg-type]
    assert len(cache) == 3 and cache.get(b"a", record(1)) is None  # the least recent went
    cache.put(b"e", record(1, sidecar_bytes=900), sc)  # type: ignore[arg-type]
    assert len(cache) == 1 and cache.get(b"e", record(1, sidecar_bytes=900)) is sc
    cache.put(b"f", record(1, sidecar_bytes=5000), sc)  # type: ignore[arg-type]
    assert cache.get(b"f", record(1, sidecar_bytes=5000)) is None  # larger than the bound
    cache.drop(b"e")
    assert len(cache) == 0
