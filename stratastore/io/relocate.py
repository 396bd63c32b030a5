"""Rename-or-copy relocation of a file to another directory (spec F-DUR-4).

On one volume: ``rename``, then fsync the destination and the source directories. Across
volumes (``EXDEV``): byte-copy into a temp file in the destination directory, fsync it, rename
it to the final name, fsync the destination directory, and only then unlink the source and fsync
its directory. A crash at any step leaves the source intact or the destination complete (or
both: then the two are identical and either may be dropped).
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Literal

from stratastore.io import files
from stratastore.io.durable import DurableFile
from stratastore.io.errors import StrataIOError

__all__ = ["COPY_CHUNK", "link_or_copy", "relocate_file"]

COPY_CHUNK = 16 << 20


def relocate_file(src: str, dst: str) -> Literal["rename", "copy"]:
    """Move ``src`` to the path ``dst`` durably; returns how it was done."""
    src_dir = os.path.dirname(src) or "."
    dst_dir = os.path.dirname(dst) or "."
    try:
        files.replace(src, dst)
    except StrataIOError as e:
        if e.errno != _errno.EXDEV:
            raise
    else:
        files.fsync_dir(dst_dir)
        if os.path.realpath(src_dir) != os.path.realpath(dst_dir):
            files.fsync_dir(src_dir)
        return "rename"
    _copy_durably(src, dst)
    files.unlink(src)  # a regular file (lstat); callers that move store files guard the name
    files.fsync_dir(src_dir)
    return "copy"


def link_or_copy(src: str, dst: str) -> Literal["link", "copy"]:
    """Make ``dst`` a durable second name (or a durable copy) of ``src``, keeping ``src``
    (spec F-DUR-8). On one volume a hard link, then fsync the destination directory: no byte is
    copied and, unlike a rename, the source stays whole until the caller drops it. Across volumes
    (``EXDEV``) a durable byte copy. ``dst`` must not exist."""
    try:
        files.link(src, dst)
    except StrataIOError as e:
        if e.errno not in (_errno.EXDEV, _errno.EPERM, _errno.EOPNOTSUPP):
            raise
    else:
        files.fsync_dir(os.path.dirname(dst) or ".")
        return "link"
    _copy_durably(src, dst)
    return "copy"


def _copy_durably(src: str, dst: str) -> None:
    """Copy ``src`` (a regular file, never a link) to ``dst`` durably, keeping its mode."""
    fd = files.open_read(src)
    try:
        size = files.file_size(src)
        buf = bytearray(min(COPY_CHUNK, max(size, 1)))
        view = memoryview(buf)
        with DurableFile(dst, mode=files.permissions(src)) as out:
            offset = 0
            while offset < size:
                n = files.pread_into(fd, view[: min(len(buf), size - offset)], offset, src)
                if n == 0:
                    raise StrataIOError("read", src, _errno.EIO, "file shrank during the copy")
                out.write(view[:n])
                offset += n
    finally:
        files.close(fd)
