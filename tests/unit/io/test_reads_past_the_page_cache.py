"""A read of bytes that are not in the page cache goes past it (``O_DIRECT``) when the memory, the
offset and the lengths allow it and the filesystem does direct I/O, and leaves the cache as it
was; through the cache otherwise, and wherever the kernel cannot say what is cached. Either
way the caller gets exactly the file's bytes, the descriptor is left as it was, and failures
are the io layer's typed errors."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from stratastore.io import faults, files
from stratastore.io.errors import ShortRead, StrataIOError
from stratastore.io.faults import Fault

SIZE = 3 * files.DIRECT_ALIGN + 8 * files.DIRECT_ALIGN


def write_file(p: Path, n: int = SIZE) -> bytes:
    data = os.urandom(n)
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return data


def evict(p: Path) -> int:
    """Drop the file's pages from the page cache; an open descriptor of it."""
    fd = files.open_read(str(p))
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd


def direct_io_works(d: Path) -> bool:
    probe = d / "probe"
    probe.write_bytes(b"\0" * files.DIRECT_ALIGN)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, files.DIRECT_ALIGN)
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def aligned(n: int) -> memoryview:
    return memoryview(mmap.mmap(-1, n))


def test_bytes_not_in_the_cache_are_read_past_it_and_are_the_files_bytes(tmp_path: Path) -> None:
    if not direct_io_works(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} does no direct I/O (the cached read is tested)")
    data = write_file(tmp_path / "f")
    fd = evict(tmp_path / "f")
    try:
        if files.cached_pages(fd, 0, SIZE) is None:
            pytest.skip("this kernel cannot say what is cached (no cachestat: Linux < 6.5)")
        assert files.cached_pages(fd, 0, SIZE) == 0
        head, rest = aligned(files.DIRECT_ALIGN), aligned(SIZE - files.DIRECT_ALIGN)
        assert files.preadv_uncached(fd, [head, rest], 0, "f") is True
        assert bytes(head) + bytes(rest) == data
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT  # left as it was given
        assert files.cached_pages(fd, 0, SIZE) == 0  # the page cache is left as it was
    finally:
        files.close(fd)


def test_bytes_in_the_cache_are_read_from_it(tmp_path: Path) -> None:
    data = write_file(tmp_path / "f")
    fd = files.open_read(str(tmp_path / "f"))
    try:
        os.pread(fd, SIZE, 0)  # now resident
        out = aligned(SIZE)
        assert files.preadv_uncached(fd, [out], 0, "f") is False
        assert bytes(out) == data
    finally:
        files.close(fd)


@pytest.mark.parametrize("case", ["offset", "length", "memory"])
def test_what_a_direct_read_cannot_take_is_read_through_the_cache(
    tmp_path: Path, case: str
) -> None:
    data = write_file(tmp_path / "f")
    fd = evict(tmp_path / "f")
    try:
        if case == "offset":
            out, off = aligned(files.DIRECT_ALIGN), 512
        elif case == "length":
            out, off = aligned(2 * files.DIRECT_ALIGN)[:5000], 0
        else:
            out, off = memoryview(bytearray(SIZE + 1))[1:], 0
        assert files.preadv_uncached(fd, [out], off, "f") is False
        assert bytes(out) == data[off : off + out.nbytes]
    finally:
        files.close(fd)


def test_a_file_that_ends_first_is_a_short_read(tmp_path: Path) -> None:
    write_file(tmp_path / "f", 4 * files.DIRECT_ALIGN)
    fd = evict(tmp_path / "f")
    try:
        with pytest.raises(ShortRead):
            files.preadv_uncached(fd, [aligned(8 * files.DIRECT_ALIGN)], 0, "f")
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        files.close(fd)


def test_a_failed_read_is_a_typed_error_naming_the_file(tmp_path: Path) -> None:
    write_file(tmp_path / "f")
    fd = evict(tmp_path / "f")
    try:
        fault = Fault("read", errno=errno.EIO, persistent=True, path_contains="f")
        with faults.inject(fault), pytest.raises(StrataIOError) as got:
            files.preadv_uncached(fd, [aligned(SIZE)], 0, str(tmp_path / "f"))
        assert got.value.errno == errno.EIO and "f" in str(got.value)
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        files.close(fd)
    assert faults.hit("read", "f") is None


def test_where_the_kernel_cannot_say_what_is_cached_the_read_goes_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_file(tmp_path / "f")
    fd = evict(tmp_path / "f")
    monkeypatch.setattr(files, "_cachestat_works", False)  # a kernel before cachestat
    try:
        assert files.cached_pages(fd, 0, SIZE) is None
        out = aligned(SIZE)
        assert files.preadv_uncached(fd, [out], 0, "f") is False
        assert bytes(out) == data
    finally:
        files.close(fd)


def test_an_interrupt_inside_a_direct_read_leaves_the_descriptor_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not direct_io_works(tmp_path):
        pytest.skip(f"the filesystem of {tmp_path} does no direct I/O")
    write_file(tmp_path / "f")
    fd = evict(tmp_path / "f")
    if files.cached_pages(fd, 0, SIZE) is None:
        pytest.skip("this kernel cannot say what is cached (no cachestat: Linux < 6.5)")

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "preadv_exact", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            files.preadv_uncached(fd, [aligned(SIZE)], 0, "f")
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT
    finally:
        files.close(fd)
