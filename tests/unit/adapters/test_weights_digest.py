"""A weight file's digest (stratastore.adapters.weights_digest), the model identity of the
llama.cpp and vLLM adapters: every byte counts; a second open of the same unchanged file reads
nothing; a file rewritten in place (same size, its mtime set back, a new ctime), one whose
timestamps are too close to now to tell a later write from it, or one changed while it is read
is read again or refused, never answered from the cache."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from stratastore import ConfigError
from stratastore.adapters import weights_digest
from stratastore.adapters.weights_digest import SETTLE_NS, file_digest

SIZE = 3 * 2**20 + 5  #: a few chunks' worth when CHUNK_BYTES is lowered below, and a remainder


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights_digest, "_DIGESTS", {})
    monkeypatch.setattr(weights_digest, "CHUNK_BYTES", 1 << 20)


def _settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock a settle window past every file written here (no waiting for it)."""
    real = weights_digest._now_ns
    monkeypatch.setattr(weights_digest, "_now_ns", lambda: real() + 10 * SETTLE_NS)


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the digest reads, one entry per whole read."""
    reads: list[str] = []
    real: Callable[[int, str, int], bytes] = weights_digest._hash_file

    def counting(fd: int, path: str, size: int) -> bytes:
        reads.append(path)
        return real(fd, path, size)

    monkeypatch.setattr(weights_digest, "_hash_file", counting)
    return reads


def _weights(path: Path, flip_at: int | None = None) -> Path:
    raw = bytearray(bytes(range(251)) * (SIZE // 251 + 1))[:SIZE]
    if flip_at is not None:
        raw[flip_at] ^= 0x01
    path.write_bytes(bytes(raw))
    return path


def test_a_byte_changed_anywhere_is_another_digest(tmp_path: Path) -> None:
    import blake3

    base = file_digest(str(_weights(tmp_path / "a")))
    assert base == blake3.blake3(_weights(tmp_path / "same").read_bytes()).digest()
    for at in (0, 1 << 20, SIZE // 2, SIZE - 1):  # a chunk's first byte, the middle, the last
        assert file_digest(str(_weights(tmp_path / f"b{at}", flip_at=at))) != base, at


def test_the_same_unchanged_file_opened_twice_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    reads = _counted(monkeypatch)
    path = _weights(tmp_path / "model.gguf")
    link = tmp_path / "snapshot.gguf"  # a hub's snapshot links to the blob: one file
    link.symlink_to(path)
    first = file_digest(str(path))
    assert file_digest(str(path)) == first
    assert file_digest(str(link)) == first
    assert len(reads) == 1


def test_a_file_rewritten_in_place_with_its_mtime_set_back_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    reads = _counted(monkeypatch)
    path = _weights(tmp_path / "model.gguf")
    before = os.stat(path)
    first = file_digest(str(path))
    with open(path, "r+b") as f:  # in place: same inode, same size, one byte in the middle
        f.seek(SIZE // 2)
        f.write(bytes([path.read_bytes()[SIZE // 2] ^ 0x01]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    # the ctime moves at each change, in the filesystem's steps: set the mtime back again
    # until the ctime shows the rewrite (one clock tick at most; utime sets the ctime to now)
    while os.stat(path).st_ctime_ns == before.st_ctime_ns:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )
    assert file_digest(str(path)) != first
    assert len(reads) == 2


@pytest.mark.parametrize("mtime_from_now_ns", [0, -SETTLE_NS // 2, 3600 * 10**9])
def test_a_version_too_close_to_now_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mtime_from_now_ns: int
) -> None:
    """Within the filesystem's timestamp granularity of now (or in the future), a rewrite
    may keep the timestamps: such a version is read at every open."""
    reads = _counted(monkeypatch)
    path = _weights(tmp_path / "model.gguf")
    now = weights_digest._now_ns()
    os.utime(path, ns=(now, now + mtime_from_now_ns))
    first = file_digest(str(path))
    assert file_digest(str(path)) == first
    assert len(reads) == 2
    assert weights_digest._DIGESTS == {}


def test_a_file_changed_while_it_is_read_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _settled(monkeypatch)
    path = _weights(tmp_path / "model.gguf")
    real = weights_digest._hash_file

    def growing(fd: int, at: str, size: int) -> bytes:
        got = real(fd, at, size)
        with open(path, "ab") as f:  # a download still being written
            f.write(b"more")
        return got

    monkeypatch.setattr(weights_digest, "_hash_file", growing)
    with pytest.raises(ConfigError, match="changed while its digest was read") as got:
        file_digest(str(path))
    assert str(path) in str(got.value)
    assert weights_digest._DIGESTS == {}


def test_a_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read") as got:
        file_digest(str(tmp_path / "missing.gguf"))
    assert "missing.gguf" in str(got.value)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="cannot be read"):
        file_digest(str(fifo))  # never a hang on a FIFO
