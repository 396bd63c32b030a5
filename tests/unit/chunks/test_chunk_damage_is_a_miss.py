"""A chunk store never hands the caller a byte that failed validation: a page whose stored copy
is damaged (on a directory, in memory, on a lower level) is a miss, counted in ``damaged``,
logged and removed so that the next put writes it again; a read that fails otherwise (EMFILE)
is a miss that keeps the page; a reader holding a damaged copy open never removes the copy
stored again since."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_bytes, stored_key
from stratastore.format import data_name
from stratastore.io import files
from stratastore.io.errors import StrataIOError
from stratastore.levels.memory import MemoryBackend
from tests.conftest import tiny_fp

PAGE = 20_000


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, PAGE, np.uint8)


def flip_on_disk(directory: Path, i: int) -> None:
    """One bit inside page ``i``'s stored bytes, in its data file."""
    path = directory / data_name(stored_key(key(i)))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 1]))


def flip_in_memory(level: object, i: int) -> None:
    """One bit inside page ``i``'s stored bytes, in a memory level."""
    assert isinstance(level, MemoryBackend)
    level.raw[stored_key(key(i))][2][PAGE // 2] ^= 1


@pytest.mark.parametrize("where", ["dir", "memory"])
def test_a_damaged_page_is_a_counted_miss_and_is_removed(
    where: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = str(tmp_path / "d") if where == "dir" else f"memory://dmg-{tmp_path.name[-24:]}"
    with ChunkStore.open([ChunkLevel(spec, 1 << 20)], tiny_fp()) as s:
        for i in range(2):
            s.put(key(i), page(i))
        if where == "dir":
            flip_on_disk(tmp_path / "d", 1)
        else:
            flip_in_memory(s.backends[0], 1)
        out = np.zeros(PAGE, np.uint8)
        assert s.get_into(key(0), out) == PAGE
        with caplog.at_level("WARNING", logger="stratastore.chunks"):
            assert s.get_into(key(1), out) is None  # a miss, never the damaged bytes
        assert f"chunk {stored_key(key(1)).hex()[:16]} is damaged (ChecksumMismatch" in caplog.text
        assert not s.exists(key(1)) and s.stats()["damaged"] == 1
        if where == "dir":
            assert not (tmp_path / "d" / data_name(stored_key(key(1)))).exists()
        assert s.put(key(1), page(1)) == "stored" and s.get(key(1)) == page(1).tobytes()


def test_a_damaged_copy_on_a_lower_level_is_removed_there(tmp_path: Path) -> None:
    room = stored_bytes(PAGE)
    levels = [
        ChunkLevel(str(tmp_path / "fast"), room),
        ChunkLevel(f"memory://low-{tmp_path.name[-24:]}", 4 * room),
    ]
    with ChunkStore.open(levels, tiny_fp()) as s:
        s.put(key(0), page(0))
        s.put(key(1), page(1))  # 0 goes down
        flip_in_memory(s.backends[1], 0)
        assert s.get(key(0)) is None and not s.exists(key(0))
        assert s.stats()["damaged"] == 1 and s.get(key(1)) == page(1).tobytes()


def test_a_transient_read_error_is_a_miss_that_keeps_the_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        real = files.open_read

        def emfile(path: str) -> int:
            if path.endswith(".seg"):
                raise StrataIOError("open", path, errno.EMFILE)
            return real(path)

        monkeypatch.setattr(files, "open_read", emfile)
        assert s.get(key(0)) is None
        monkeypatch.setattr(files, "open_read", real)
        assert s.exists(key(0)) and s.stats()["read_errors"] == 1
        assert s.stats()["damaged"] == 0 and s.get(key(0)) == page(0).tobytes()


def test_a_stale_damaged_read_never_removes_the_copy_stored_again(tmp_path: Path) -> None:
    d = tmp_path / "d"
    with ChunkStore.open([ChunkLevel(str(d), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        flip_on_disk(d, 0)
        slow, fast = s.open_chunk(key(0)), s.open_chunk(key(0))  # two readers of one page
        assert slow is not None and fast is not None
        assert not s.read_into(fast, bytearray(fast.payload_bytes))  # damaged: removed
        assert s.put(key(0), page(0)) == "stored"  # written again
        assert not s.read_into(slow, bytearray(slow.payload_bytes))  # the old copy fails...
        assert s.get(key(0)) == page(0).tobytes()  # ...and the new one stays


def test_a_page_the_caller_rejects_is_counted_and_removed(tmp_path: Path) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        chunk = s.open_chunk(key(0))
        assert chunk is not None and chunk.payload_bytes == PAGE
        s.reject(chunk, "20000 bytes fit no layout of this engine")
        assert not s.exists(key(0)) and s.stats()["damaged"] == 1
