"""Filesystem primitives: the only place stratastore calls ``os.*`` on store files.

Each primitive makes its OS call through the fault seam (:func:`faults.call`: ``faults.hit``
first, an ``OSError`` turned into a :class:`StrataIOError` naming the operation and the path).
Policy code never imports ``os``; it calls these (or the protocols built on them in ``durable``
and ``relocate``, and the destructive-operation guard in ``guard``).

Safety contract (spec F-DIR-8, F-DIR-9):

* every open for reading is ``O_NOFOLLOW | O_NONBLOCK`` and checks ``S_ISREG`` on the open
  descriptor before reading: a symbolic link raises :class:`SymlinkRefused`, a FIFO, device,
  socket or directory raises :class:`NotARegularFile` (never a hang, never a read through a
  link);
* data is read with ``pread`` into memory the caller owns (:func:`pread_exact`,
  :func:`preadv_exact`, :func:`preadv_uncached`), never through a mapping: a file truncated or
  failing under a reader is a typed error at the read (:class:`ShortRead`,
  :class:`StrataIOError`), never a SIGBUS;
* every destructive operation on the store's files goes through one guard,
  :mod:`stratastore.io.guard` (:func:`~stratastore.io.guard.remove_store_file`, ...);
  :func:`unlink` here is for files that are not the store's;
* files are created with the store's ``file_mode`` (default ``0o600``), directories with
  :func:`~stratastore.io.modes.dir_mode` of it (default ``0o700``), :mod:`stratastore.io.modes`;
  the process umask may remove bits, never add them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno as _errno
import fcntl
import functools
import os
import stat
import struct
import sys
from collections.abc import Callable
from typing import cast

from stratastore.io import faults
from stratastore.io.errors import ShortRead, StrataIOError, SymlinkRefused, refusal
from stratastore.io.faults import call as _do
from stratastore.io.modes import DEFAULT_FILE_MODE, dir_mode

__all__ = [
    "NETWORK_FILESYSTEMS",
    "FileLock",
    "advise_range",
    "advise_willneed",
    "cached_pages",
    "close",
    "exists",
    "is_dir",
    "is_file",
    "is_link",
    "lexists",
    "list_names",
    "permissions",
    "mtime_ns",
    "file_size",
    "fsync",
    "fsync_dir",
    "link",
    "listdir",
    "makedirs",
    "missing_parent",
    "open_read",
    "open_write",
    "fd_size",
    "fd_version",
    "pread_exact",
    "preadv_exact",
    "preadv_uncached",
    "pread_into",
    "read_file",
    "read_head",
    "replace",
    "resident",
    "rmdir",
    "start_writeback",
    "subdirectories",
    "unlink",
    "write_all",
]


def open_write(path: str, *, exclusive: bool = True, mode: int = DEFAULT_FILE_MODE) -> int:
    """Create ``path`` for writing with ``mode`` (spec F-DIR-9); never through a symbolic link
    (``O_EXCL`` refuses any existing name, ``O_NOFOLLOW`` a link when truncating)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    flags |= os.O_EXCL if exclusive else os.O_TRUNC
    return _do("open", path, lambda: os.open(path, flags, mode))


def _open_regular(path: str) -> int:
    """``open(O_RDONLY | O_NOFOLLOW | O_NONBLOCK)`` then ``fstat``: a regular file's descriptor
    (blocking again), else :class:`SymlinkRefused` / :class:`NotARegularFile`. ``O_NONBLOCK``
    keeps the open of a FIFO from waiting for a writer; raises ``OSError`` for other failures."""
    return _open_regular_sized(path)[0]


def _open_regular_sized(path: str) -> tuple[int, int]:
    """:func:`_open_regular`, with the file's size from the same ``fstat``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == _errno.ELOOP:
            raise SymlinkRefused("open", path) from e
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refusal("open", path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_read(path: str) -> int:
    """A descriptor of the regular file ``path`` for reading (spec F-DIR-8: never a symbolic
    link, never a FIFO or device; :class:`SymlinkRefused` / :class:`NotARegularFile`)."""
    return _do("open", path, lambda: _open_regular(path))


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
    """Remove the regular file ``path`` (a file that is not the store's, e.g. a probe file);
    store files go through :func:`.guard.remove_store_file`. Refuses a link or a non-regular file
    (``lstat``). Returns False (with ``missing_ok``) when it was already gone."""

    def run() -> bool:
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode):
                raise refusal("unlink", path, st.st_mode)
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
            return False
        return True

    return _do("unlink", path, run)


def makedirs(path: str, *, mode: int = DEFAULT_FILE_MODE) -> None:
    """Make ``path`` and its missing parents for a store with file mode ``mode``: each directory
    made here gets :func:`dir_mode` of it (spec F-DIR-9; ``os.makedirs`` would give the parents
    ``0o777`` less the umask, open to every user under ``umask 0``); an existing directory keeps
    its mode."""

    def run() -> None:
        missing: list[str] = []
        p = os.path.abspath(path)
        while not os.path.isdir(p):
            missing.append(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):  # made meanwhile by another process
                os.mkdir(d, dir_mode(mode))
        if not os.path.isdir(path):
            raise NotADirectoryError(_errno.ENOTDIR, os.strerror(_errno.ENOTDIR), path)

    _do("mkdir", path, run)


def missing_parent(path: str) -> str | None:
    """The parent directory of ``path`` when neither exists (what :func:`makedirs` would make
    besides ``path`` itself), else None: a look-up only, nothing is made."""
    p = os.path.abspath(path)
    parent = os.path.dirname(p)
    return parent if not os.path.exists(p) and not os.path.exists(parent) else None


def rmdir(path: str) -> None:
    _do("unlink", path, lambda: os.rmdir(path))


def listdir(path: str) -> list[str]:
    return _do("listdir", path, lambda: os.listdir(path))


def mtime_ns(path: str) -> int:
    """Modification time in ns (a directory's changes when an entry is added or removed)."""
    return _do("stat", path, lambda: os.stat(path).st_mtime_ns)


def permissions(path: str) -> int:
    """The permission bits of ``path`` (``lstat``: a link's own, never its target's)."""
    return stat.S_IMODE(_do("stat", path, lambda: os.lstat(path)).st_mode)


def exists(path: str) -> bool:
    return os.path.exists(path)


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory (a link to one counts): a look-up only."""
    return os.path.isdir(path)


def is_file(path: str) -> bool:
    """Whether ``path`` is a regular file (a link to one counts): a look-up only."""
    return os.path.isfile(path)


def is_link(path: str) -> bool:
    """Whether ``path`` is a symbolic link (``lstat``, never followed): a look-up only."""
    return os.path.islink(path)


def lexists(path: str) -> bool:
    """Whether anything is named ``path``, a dangling link included (``lstat``): a look-up."""
    return os.path.lexists(path)


def list_names(path: str) -> list[str] | None:
    """The names in directory ``path``, or None when it cannot be listed (missing, not a
    directory, not readable): a look-up for discovering a store's levels in paths a user named,
    not an I/O step of the fault seam (that is :func:`listdir`)."""
    try:
        return os.listdir(path)
    except OSError:
        return None


def subdirectories(path: str) -> list[str]:
    """The names in directory ``path`` that are directories (a link to one counts), in the
    order the directory lists them: a look-up; raises ``OSError`` (``FileNotFoundError``, ...)
    when ``path`` cannot be listed."""
    with os.scandir(path) as entries:
        return [e.name for e in entries if e.is_dir()]


def file_size(path: str) -> int:
    return _do("stat", path, lambda: os.stat(path).st_size)


def read_file(path: str, max_bytes: int) -> bytes:
    """The whole file, refusing one larger than ``max_bytes`` before reading it."""

    def run() -> bytes:
        fd, size = _open_regular_sized(path)
        try:
            if size > max_bytes:
                raise OSError(_errno.EFBIG, f"{size} bytes is over the {max_bytes}-byte limit")
            # reads of the size the file has (a buffer of max_bytes each time would cost an
            # allocation as large); one that grew meanwhile is read on, up to the limit
            out = os.read(fd, size + 1)
            if len(out) <= size:  # fewer bytes than asked for: the end of the file
                return out
            grown = bytearray(out)  # it grew since the fstat: read on, up to the limit
            while len(grown) <= max_bytes:
                more = os.read(fd, min(1 << 16, max_bytes + 1 - len(grown)))
                if not more:
                    break
                grown += more
            return bytes(grown)
        finally:
            os.close(fd)

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


#: the kernel's read-ahead window when the device's cannot be read (Linux's default, 128 KiB)
_DEFAULT_WINDOW = 128 << 10


@functools.cache
def _readahead_window(dev: int) -> int:
    """The read-ahead window of the block device ``dev`` (``queue/read_ahead_kb`` in sysfs, a
    partition's from its disk), or :data:`_DEFAULT_WINDOW` when it has none to read (tmpfs, an
    overlay's anonymous device, another OS)."""
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for queue in (f"{base}/queue", f"{base}/../queue"):
        try:
            with open(f"{queue}/read_ahead_kb", "rb") as f:
                kb = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        return max(kb << 10, 4096) if kb else _DEFAULT_WINDOW
    return _DEFAULT_WINDOW


def advise_range(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start reading bytes ``[offset, offset + nbytes)`` of the open file
    ``fd`` into the page cache now (``posix_fadvise`` WILLNEED), so a read of them soon finds
    them there. Linux starts at most one read-ahead window (the device's ``read_ahead_kb``) a
    call, so a longer range is asked for a window at a time; pages already cached cost a
    lookup. A hint only: never raises, and is not an I/O step of the fault seam."""
    if nbytes <= 0:
        return
    try:
        window = _readahead_window(os.fstat(fd).st_dev)
        for a in range(offset, offset + nbytes, window):
            os.posix_fadvise(fd, a, min(window, offset + nbytes - a), os.POSIX_FADV_WILLNEED)
    except OSError:
        return


def advise_willneed(path: str, nbytes: int) -> bool:
    """Have the first ``nbytes`` of ``path`` read into the page cache soon, off this thread
    (:func:`stratastore.io.read_ahead.ask`). A hint only: any failure (a file already gone)
    is ignored and reported as False, never raised, so it is not an I/O step of the fault
    seam."""
    from stratastore.io import read_ahead  # it builds on this module

    try:
        fd = _open_regular(path)
    except (OSError, StrataIOError):
        return False
    try:
        read_ahead.ask(fd, 0, nbytes)
        return True
    finally:
        os.close(fd)


#: filesystems LMDB cannot live on (no coherent shared memory map or byte-range locks)
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "afs",
        "9p",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "lustre",
        "gpfs",
        "beegfs",
        "davfs",
    }
)


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing), for one writer across processes.

    ``flock`` does not exclude threads of one process sharing the descriptor, so callers pair it
    with a ``threading.Lock``.
    """

    def __init__(self, path: str, *, mode: int = DEFAULT_FILE_MODE) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

        def run() -> int:
            try:
                fd = os.open(path, flags, mode)
            except OSError as e:
                if e.errno == _errno.ELOOP:
                    raise SymlinkRefused("open", path) from e
                raise
            st_mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(st_mode):
                os.close(fd)
                raise refusal("open", path, st_mode)
            os.set_blocking(fd, True)
            return fd

        self.fd = _do("open", path, run)

    def acquire(self) -> None:
        _do("lock", self.path, lambda: fcntl.flock(self.fd, fcntl.LOCK_EX))

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def fd_size(fd: int, path: str) -> int:
    """The size of the open file ``fd`` (``fstat``): a reader checks the size of the file it
    holds open, so a rename over the name meanwhile cannot change what it reads."""
    return _do("stat", path, lambda: os.fstat(fd).st_size)


def fd_version(fd: int, path: str) -> tuple[int, int, int, int, int]:
    """What tells one version of the open file ``fd`` from another without reading it
    (``fstat``): ``(device, inode, size, mtime_ns, ctime_ns)``. Every write moves the ctime to
    the clock's now (``utime`` may set the mtime back; nothing but a change of the clock sets
    the ctime back), to the filesystem's timestamp granularity: two writes within one such
    step may leave the same version, so a caller that keys on it must not trust a version
    whose timestamps are that close to now."""
    st = _do("stat", path, lambda: os.fstat(fd))
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def pread_exact(fd: int, buf: memoryview, offset: int, path: str) -> None:
    """Fill all of ``buf`` (memory the caller owns, never a mapping) from ``offset`` of ``fd``.

    Every failure is a typed error at this call, never a signal at a later access: a failed
    read (EIO, or a fault injected at op ``read``) raises :class:`StrataIOError`, a file that
    ends first (truncated since its size was checked) raises :class:`ShortRead`."""
    n = pread_into(fd, buf, offset, path)
    if n < buf.nbytes:
        raise ShortRead(path, offset + n, offset + buf.nbytes)


_IOV_MAX = 1024  #: buffers one preadv call takes at most (Linux IOV_MAX)


def preadv_exact(fd: int, bufs: list[memoryview], offset: int, path: str) -> None:
    """Fill every buffer of ``bufs`` in turn (a scatter read: consecutive file bytes into the
    caller's separate pieces of memory, never a mapping) from ``offset`` of ``fd``, continuing
    after short reads. Errors as :func:`pread_exact`: :class:`StrataIOError` for a failed read,
    :class:`ShortRead` when the file ends first."""
    views = [b.cast("B") if b.format != "B" or b.ndim != 1 else b for b in bufs if b.nbytes]
    total = sum(v.nbytes for v in views)
    done, i = 0, 0
    while i < len(views):
        n = _do(
            "read", path, functools.partial(os.preadv, fd, views[i : i + _IOV_MAX], offset + done)
        )
        if n == 0:
            raise ShortRead(path, offset + done, offset + total)
        done += n
        if done == total:
            return  # everything filled (the usual case: no trimming pass over the buffers)
        while n and i < len(views):  # drop what was filled, trim a half-filled buffer
            take = min(n, views[i].nbytes)
            views[i], n = views[i][take:], n - take
            i += views[i].nbytes == 0


#: what a read past the page cache (``O_DIRECT``) asks of the caller's memory, the file offset
#: and each length: the page size, a multiple of every logical block size in use
DIRECT_ALIGN = 4096


def resident(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` of ``fd`` is in the page cache: a one-byte
    ``preadv2(RWF_NOWAIT)``, which never waits for the device (on a miss the kernel may start
    reading that page). False where the kernel or the filesystem cannot say."""
    try:
        return os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT) >= 0
    except (OSError, AttributeError):  # EAGAIN: not resident; no RWF_NOWAIT: cannot say
        return False


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


_SYS_CACHESTAT = 451  #: Linux 6.5+, one number on every architecture (the generic table)
_cachestat_works = sys.platform == "linux"


def _cachestat() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "syscall", None)
    if fn is None:
        return None
    fn.restype = ctypes.c_long
    return cast("Callable[..., int]", fn)


_SYSCALL = _cachestat() if _cachestat_works else None


def cached_pages(fd: int, offset: int, nbytes: int) -> int | None:
    """How many pages of bytes ``[offset, offset + nbytes)`` of ``fd`` are in the page cache
    (``cachestat``, Linux 6.5 and later: a look-up that reads nothing and starts no read), or
    None where this kernel cannot say."""
    global _cachestat_works
    if not _cachestat_works or _SYSCALL is None or nbytes <= 0:
        return None
    rng, out = _CachestatRange(offset, nbytes), _Cachestat()
    rc = _SYSCALL(
        ctypes.c_long(_SYS_CACHESTAT),
        ctypes.c_int(fd),
        ctypes.byref(rng),
        ctypes.byref(out),
        ctypes.c_uint(0),
    )
    if rc != 0:
        if ctypes.get_errno() in (_errno.ENOSYS, _errno.EPERM):  # an older kernel, a sandbox
            _cachestat_works = False
        return None
    return int(out.cache)


def _aligned(views: list[memoryview], offset: int) -> bool:
    if offset % DIRECT_ALIGN:
        return False
    for v in views:
        if v.nbytes % DIRECT_ALIGN or v.readonly:
            return False
        if ctypes.addressof(ctypes.c_char.from_buffer(v)) % DIRECT_ALIGN:
            return False
    return True


def preadv_uncached(fd: int, bufs: list[memoryview], offset: int, path: str) -> bool:
    """:func:`preadv_exact`, read past the page cache (``O_DIRECT``: the device writes straight
    into the caller's memory, nothing is copied and the page cache is left as it was) when
    fewer than half of the bytes' pages are in it (:func:`cached_pages`), every buffer, its
    length and ``offset`` are :data:`DIRECT_ALIGN`-aligned and the filesystem does direct I/O;
    a read through the page cache otherwise: cached bytes come from memory, and where the
    kernel cannot say what is cached the read goes through the cache as any other. True when
    it read direct. ``fd`` is a descriptor :func:`open_read` gave (no file status flags of its
    own): it is left as it was, an interrupt included. Errors as :func:`preadv_exact`; a
    descriptor whose flags cannot be set or put back is a :class:`StrataIOError`."""
    views = [b.cast("B") if b.format != "B" or b.ndim != 1 else b for b in bufs if b.nbytes]
    total = sum(v.nbytes for v in views)
    cached = cached_pages(fd, offset, total) if total and _aligned(views, offset) else None
    if cached is None or 2 * cached >= -(-total // DIRECT_ALIGN):
        preadv_exact(fd, views, offset, path)
        return False
    direct = False
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, os.O_DIRECT)
            direct = True
        except OSError as e:
            if e.errno != _errno.EINVAL:
                raise StrataIOError("read", path, e.errno or _errno.EIO) from e
        if direct:  # else: no direct I/O on this filesystem
            try:
                preadv_exact(fd, views, offset, path)
            except StrataIOError as e:
                if e.errno != _errno.EINVAL:
                    raise
                direct = False  # the device wants a larger alignment: read through the cache
    finally:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, 0)
        except OSError as e:
            raise StrataIOError("read", path, e.errno or _errno.EIO) from e
    if not direct:
        preadv_exact(fd, views, offset, path)
    return direct


def realpath(path: str) -> str:
    """``path`` with every symbolic link resolved (two names of one directory compare equal);
    a look-up only, nothing is opened."""
    return os.path.realpath(path)


def directory_id(path: str) -> tuple[int, int] | None:
    """The device and inode of the directory ``path`` names (a link followed), or None when
    it names no directory that can be looked at: two names of one directory, a bind mount
    included, have one id. A look-up only, nothing is opened."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def stamp(path: str) -> bytes:
    """What identifies a file's version without reading it: inode, size and mtime (ns), 24
    bytes (lstat: a link is never followed). The shared catalog keeps a manifest's stamp so that
    an open re-reads only the manifests changed behind its back."""
    st = _do("stat", path, lambda: os.lstat(path))
    return struct.pack(">QQQ", st.st_ino, st.st_size, st.st_mtime_ns)
