"""Filesystem primitives: the only place stratastore calls ``os.*`` on store files.

Each primitive passes through :func:`faults.hit` first and turns an ``OSError`` into a
:class:`StrataIOError` naming the operation and the path. Policy code never imports ``os``;
it calls these (or the protocols built on them in ``durable`` and ``relocate``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import fcntl
import functools
import mmap
import os
from collections.abc import Callable
from typing import TypeVar, cast

from . import faults
from .errors import StrataIOError

__all__ = [
    "NETWORK_FILESYSTEMS",
    "FileLock",
    "advise_willneed",
    "close",
    "exists",
    "mtime_ns",
    "file_size",
    "filesystem_type",
    "fsync",
    "fsync_dir",
    "link",
    "listdir",
    "makedirs",
    "map_readonly",
    "open_read",
    "open_write",
    "pread_into",
    "read_file",
    "read_head",
    "replace",
    "rmdir",
    "start_writeback",
    "unlink",
    "write_all",
]

T = TypeVar("T")


def _do(op: str, path: str, fn: Callable[[], T]) -> T:
    fault = faults.hit(op, path)
    if fault is not None and not fault.short:
        raise StrataIOError(op, path, fault.errno, f"injected {os.strerror(fault.errno)}")
    try:
        return fn()
    except OSError as e:
        raise StrataIOError(op, path, e.errno or _errno.EIO, e.strerror or str(e)) from e


def open_write(path: str, *, exclusive: bool = True) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    return _do("open", path, lambda: os.open(path, flags, 0o644))


def open_read(path: str) -> int:
    return _do("open", path, lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC))


def close(fd: int) -> None:
    os.close(fd)


def write_all(fd: int, data: memoryview | bytes, path: str) -> None:
    """Write every byte of ``data``, continuing after short writes (one op per write call).

    A write that makes no progress is reported as ENOSPC rather than looping forever.
    """
    view = memoryview(data).cast("B")
    while view:
        fault = faults.hit("write", path)
        if fault is not None and not fault.short:
            raise StrataIOError("write", path, fault.errno, f"injected {os.strerror(fault.errno)}")
        chunk = view[: max(len(view) // 2, 1)] if fault is not None else view
        if fault is not None and fault.persistent and fault.seen > fault.nth:
            chunk = view[:0]
        try:
            n = os.write(fd, chunk)
        except OSError as e:
            raise StrataIOError("write", path, e.errno or _errno.EIO, e.strerror or "") from e
        if n <= 0:
            raise StrataIOError("write", path, _errno.ENOSPC, "write made no progress")
        view = view[n:]


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``[offset, offset+nbytes)`` to the device now, so a
    large file's final fsync overlaps with the writing instead of following it. A hint only:
    durability still comes from :func:`fsync`; where the call is missing it does nothing."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def fsync(fd: int, path: str) -> None:
    """fsync once. On failure the caller must abandon the file: after a failed fsync the page
    cache may have dropped the dirty pages, so a retry on the same descriptor can falsely succeed.
    """
    _do("fsync", path, lambda: os.fsync(fd))


def fsync_dir(path: str) -> None:
    def run() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    _do("fsync_dir", path, run)


def replace(src: str, dst: str) -> None:
    _do("rename", dst, lambda: os.replace(src, dst))


def link(src: str, dst: str) -> None:
    _do("link", dst, lambda: os.link(src, dst))


def unlink(path: str, *, missing_ok: bool = False) -> bool:
    """Remove ``path``; returns False (with ``missing_ok``) when it was already gone."""

    def run() -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
            return False
        return True

    return _do("unlink", path, run)


def makedirs(path: str) -> None:
    _do("mkdir", path, lambda: os.makedirs(path, exist_ok=True))


def rmdir(path: str) -> None:
    _do("unlink", path, lambda: os.rmdir(path))


def listdir(path: str) -> list[str]:
    return _do("listdir", path, lambda: os.listdir(path))


def mtime_ns(path: str) -> int:
    """Modification time in ns (a directory's changes when an entry is added or removed)."""
    return _do("stat", path, lambda: os.stat(path).st_mtime_ns)


def exists(path: str) -> bool:
    return os.path.exists(path)


def file_size(path: str) -> int:
    return _do("stat", path, lambda: os.stat(path).st_size)


def read_file(path: str, max_bytes: int) -> bytes:
    """The whole file, refusing one larger than ``max_bytes`` before reading it."""

    def run() -> bytes:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise OSError(_errno.EFBIG, f"{size} bytes is over the {max_bytes}-byte limit")
            return f.read(max_bytes + 1)

    return _do("read", path, run)


def pread_into(fd: int, buf: memoryview, offset: int, path: str) -> int:
    """Fill ``buf`` from ``offset``; returns the bytes read (fewer only at end of file)."""
    view = memoryview(buf).cast("B")
    total = 0
    while total < len(view):
        n = _do("read", path, functools.partial(os.preadv, fd, [view[total:]], offset + total))
        if n == 0:
            break
        total += n
    return total


def read_head(path: str, nbytes: int) -> tuple[bytes, int]:
    """The first ``nbytes`` of a file (fewer if it is shorter) and the file's size."""
    fd = open_read(path)
    try:
        size = _do("stat", path, lambda: os.fstat(fd).st_size)
        head = bytearray(min(nbytes, size))
        n = pread_into(fd, memoryview(head), 0, path)
        return bytes(head[:n]), size
    finally:
        close(fd)


def advise_willneed(path: str) -> bool:
    """Ask the kernel to start reading ``path`` into the page cache now (``posix_fadvise``
    WILLNEED: asynchronous read-ahead). A hint only: any failure (a file already gone, a
    filesystem without it) is ignored and reported as False, never raised, so it is not an I/O
    step of the fault seam."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def map_readonly(path: str) -> tuple[mmap.mmap, int]:
    """A read-only shared mapping of the whole file and its size (a size-0 file maps nothing)."""

    def run() -> tuple[mmap.mmap, int]:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise OSError(_errno.EINVAL, "empty file")
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_SEQUENTIAL"):  # readers stream it: read ahead further
                mm.madvise(mmap.MADV_SEQUENTIAL)
            return mm, size
        finally:
            os.close(fd)

    return _do("open", path, run)


#: filesystems LMDB cannot live on (no coherent shared memory map or byte-range locks)
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs", "lustre", "gpfs", "beegfs", "davfs",
})  # fmt: skip


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem holding ``path`` (longest mount point that prefixes it), or
    ``None`` when the mount table cannot be read (not Linux)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    real = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, best_type = mount, tail[0]
    return best_type


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing), for one writer across processes.

    ``flock`` does not exclude threads of one process sharing the descriptor, so callers pair it
    with a ``threading.Lock``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = _do("open", path, lambda: os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC))

    def acquire(self) -> None:
        _do("lock", self.path, lambda: fcntl.flock(self.fd, fcntl.LOCK_EX))

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
