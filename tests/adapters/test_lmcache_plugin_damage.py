"""The plugin deletes valid, durable chunks it merely failed to read.

- ``ChunkStore.open_chunk`` / ``copy_into`` send every ``StrataError`` to ``_damaged``, which
  deletes the chunk: a transient resource error (EMFILE: the process ran out of descriptors) deletes
  a valid chunk.
- ``_damaged`` deletes by key with no check that the files are the ones that failed: a reader
  that held the old, damaged chunk open deletes the good copy that was stored again meanwhile
  (and reported durable)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from stratastore.format import data_name  # noqa: E402
from stratastore.format.keys import state_key  # noqa: E402
from stratastore.io import files  # noqa: E402
from stratastore.io.errors import StrataIOError  # noqa: E402
from tests.unit.adapters.test_lmcache_chunks import cid, open_store, payload, read  # noqa: E402


def test_a_transient_open_error_does_not_delete_a_valid_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "d", 4)
    try:
        assert store.put(cid(0), payload(0)) == "stored"  # durable
        real = files.open_read

        def emfile(path: str) -> int:
            if path.endswith(".seg"):
                raise StrataIOError("open", path, errno.EMFILE)
            return real(path)

        monkeypatch.setattr(files, "open_read", emfile)
        assert read(store, 0) is None  # a miss now is fine
        monkeypatch.setattr(files, "open_read", real)
        assert store.contains(cid(0)), "a valid chunk was deleted after EMFILE"
        assert read(store, 0) == bytes(payload(0))
    finally:
        store.close()


def test_a_stale_damaged_read_does_not_delete_the_chunk_stored_again(tmp_path: Path) -> None:
    d = tmp_path / "d"
    store = open_store(d, 4)
    try:
        assert store.put(cid(0), payload(0)) == "stored"
        path = d / data_name(state_key(cid(0)))
        with open(path, "r+b") as f:  # bit rot in chunk 0
            f.seek(os.path.getsize(path) - 10)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 1]))
        slow = store.open_chunk(cid(0))  # two retrieves of the same prefix
        fast = store.open_chunk(cid(0))
        assert slow is not None and fast is not None
        assert not store.copy_into(fast, memoryview(bytearray(fast.payload_bytes)))  # removed
        assert store.put(cid(0), payload(0)) == "stored"  # the next store writes it again
        assert not store.copy_into(slow, memoryview(bytearray(slow.payload_bytes)))
        assert store.contains(cid(0)), "the good copy stored again (durable) was deleted"
        assert read(store, 0) == bytes(payload(0))
    finally:
        store.close()
