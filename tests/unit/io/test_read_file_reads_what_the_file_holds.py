"""``files.read_file`` reads what the file holds, not a buffer of its limit: a 320-byte sidecar
read under a 40 MB limit allocates about 320 bytes (every segment open reads one). The content
is whole, a file over the limit is refused before it is read, an empty file is empty."""

from __future__ import annotations

import errno
import tracemalloc
from pathlib import Path

import pytest

from stratastore.io import files
from stratastore.io.errors import StrataIOError


def test_a_small_file_under_a_large_limit_allocates_what_it_holds(tmp_path: Path) -> None:
    p = tmp_path / "small"
    p.write_bytes(b"s" * 320)
    files.read_file(str(p), 64 << 20)  # warm any one-time allocations
    tracemalloc.start()
    try:
        got = files.read_file(str(p), 64 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == b"s" * 320
    assert peak < 1 << 20, f"reading 320 bytes allocated up to {peak} bytes"


def test_contents_limit_and_empty(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(bytes(range(256)) * 300)
    assert files.read_file(str(p), 256 * 300) == bytes(range(256)) * 300
    with pytest.raises(StrataIOError) as e:
        files.read_file(str(p), 256 * 300 - 1)
    assert e.value.errno == errno.EFBIG
    (tmp_path / "empty").write_bytes(b"")
    assert files.read_file(str(tmp_path / "empty"), 100) == b""
