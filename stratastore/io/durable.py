"""The durable write protocol (spec F-DUR-1).

1. create a temp file ``strata-tmp-<random>-<name>`` in the *destination* directory;
2. write every byte; 3. fsync the file; 4. rename it over the final name (or ``link`` it, which
fails if the name exists); 5. fsync the directory.

The temp file is created with the store's file mode (spec F-DIR-9, default ``0o600``) and keeps
it under its final name; it is created ``O_EXCL`` so no link or existing file is written through.

After step 5 the file survives a crash byte-identical; before it, the final name either does not
exist or still holds its previous content. Any failure removes the temp file and raises; an
fsync is never retried on the same descriptor.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from types import TracebackType

from stratastore.format.naming import TEMP_PREFIX
from stratastore.io import files
from stratastore.io.errors import StrataIOError
from stratastore.io.guard import remove_store_file
from stratastore.io.modes import DEFAULT_FILE_MODE

__all__ = [
    "WRITEBACK_MIN",
    "DurableFile",
    "durable_write",
    "durable_write_in",
    "prepared_file",
    "temp_path_for",
]

#: writes at least this large start their writeback at once (see files.start_writeback)
WRITEBACK_MIN = 1 << 20


def temp_path_for(final: str) -> str:
    """A fresh temp name beside ``final``; fsck recognises it by ``TEMP_PREFIX``."""
    d, name = os.path.split(final)
    return os.path.join(d, f"{TEMP_PREFIX}{secrets.token_hex(8)}-{name}")


class DurableFile:
    """``with DurableFile(path) as f: f.write(...)`` commits on a clean exit, aborts on error.

    The steps can also be driven by hand: :meth:`prepare` (fsync, close) then :meth:`publish`
    (rename, fsync the directory), or :meth:`abort`. Once published or aborted, leaving the
    block does nothing more. ``exclusive=True`` publishes with ``link`` and raises
    :class:`StrataIOError` (EEXIST) if the final name exists, instead of replacing it.
    """

    def __init__(
        self, path: str, *, exclusive: bool = False, mode: int = DEFAULT_FILE_MODE
    ) -> None:
        self.path = path
        self.dir = os.path.dirname(path) or "."
        self.exclusive = exclusive
        self.mode = mode
        self.tmp = temp_path_for(path)
        self.fd = -1
        self.written = 0
        self.state = "new"  # new -> open -> prepared -> done

    def __enter__(self) -> DurableFile:
        self.fd = files.open_write(self.tmp, mode=self.mode)
        self.state = "open"
        return self

    def write(self, data: memoryview | bytes) -> None:
        n = memoryview(data).nbytes
        files.write_all(self.fd, data, self.tmp)
        if n >= WRITEBACK_MIN:
            files.start_writeback(self.fd, self.written, n)
        self.written += n

    def prepare(self) -> None:
        """Step 3: fsync and close the temp file; the final name is untouched."""
        try:
            files.fsync(self.fd, self.tmp)
        finally:
            files.close(self.fd)
            self.fd = -1
        self.state = "prepared"

    def publish(self) -> None:
        """Steps 4-5: give the prepared file its final name and fsync the directory."""
        self.rename()
        files.fsync_dir(self.dir)

    def rename(self) -> None:
        """Step 4 alone: give the prepared file its final name. The write is not acknowledged
        until the caller has fsynced :attr:`dir` (step 5): a group commit renames several
        prepared files and fsyncs their directory once (spec F-DUR-2)."""
        if self.exclusive:
            files.link(self.tmp, self.path)
            self.state = "done"
            remove_store_file(self.tmp)
        else:
            files.replace(self.tmp, self.path)
            self.state = "done"

    def commit(self) -> None:
        if self.state == "open":
            self.prepare()
        if self.state == "prepared":
            self.publish()

    def abort(self) -> None:
        if self.fd >= 0:
            files.close(self.fd)
            self.fd = -1
        if self.state != "done":
            self.state = "done"
            # best effort: fsck reports an orphan temp file and repair removes it
            with contextlib.suppress(StrataIOError):
                remove_store_file(self.tmp, missing_ok=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.commit()
        except BaseException:
            self.abort()
            raise


def prepared_file(
    path: str, data: bytes | memoryview, *, mode: int = DEFAULT_FILE_MODE
) -> DurableFile:
    """Steps 1-3 of a durable write of ``data`` to ``path``: the temp file written and fsynced,
    the final name untouched. The caller then publishes it (:meth:`DurableFile.publish`, or
    :meth:`DurableFile.rename` and an fsync of its directory) or aborts it; a failure here
    leaves no temp file and raises."""
    f = DurableFile(path, mode=mode)
    f.__enter__()
    try:
        f.write(data)
        f.prepare()
    except BaseException:
        f.abort()
        raise
    return f


def durable_write(
    path: str,
    data: bytes | memoryview,
    *,
    exclusive: bool = False,
    mode: int = DEFAULT_FILE_MODE,
) -> None:
    """Write ``data`` to ``path`` with the durable protocol; a new file gets ``mode``."""
    with DurableFile(path, exclusive=exclusive, mode=mode) as f:
        f.write(data)


def durable_write_in(
    directory: str, name: str, data: bytes | memoryview, *, mode: int = DEFAULT_FILE_MODE
) -> bytes:
    """:func:`durable_write` of ``data`` to the file ``name`` (a path relative to ``directory``:
    a manifest, its commit record, spec F-CHAIN-3, F-DIR-9); returns the written file's stamp
    (:func:`~stratastore.io.files.stamp`), what the shared catalog records of that version."""
    path = os.path.join(directory, name)
    durable_write(path, data, mode=mode)
    return files.stamp(path)
