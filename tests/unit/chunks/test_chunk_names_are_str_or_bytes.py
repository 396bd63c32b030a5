"""A page name is a ``str`` or bytes-like (``bytes``, ``bytearray``, a C-contiguous
``memoryview`` of bytes): anything else is a ChunkKeyError naming its type and what is taken,
never another name's key (``bytes(5)`` is five zero bytes, ``bytes([1, 2])`` a list's values).
Every call of the chunk API that takes a key checks it through ``stored_key`` before it does
anything, the batch calls for every key before the first page."""

from __future__ import annotations

import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import ChunkKeyError, chunk_key
from tests.conftest import tiny_fp


@pytest.mark.parametrize(
    "name",
    [5, 0, True, None, [0, 0, 0, 0, 0], (1, 2), 1.5, np.zeros(5, np.uint8), {"a": 1}],
    ids=lambda n: type(n).__name__,
)
def test_a_name_of_another_type_is_refused(name: Any) -> None:
    with pytest.raises(ChunkKeyError) as e:
        chunk_key(name)
    msg = str(e.value)
    assert f"not a {type(name).__name__};" in msg
    assert "a str or bytes-like (bytes, bytearray, a C-contiguous memoryview of bytes)" in msg


def test_no_name_shares_another_names_key() -> None:
    zeros = chunk_key(b"\0" * 5)
    for other in (5, [0] * 5, np.zeros(5, np.uint8)):
        with pytest.raises(ChunkKeyError):
            assert chunk_key(other) != zeros


def test_the_bytes_like_names_are_their_bytes() -> None:
    want = chunk_key(b"page-7")
    assert chunk_key("page-7") == want
    assert chunk_key(bytearray(b"page-7")) == want
    assert chunk_key(memoryview(b"page-7")) == want
    assert chunk_key(memoryview(array.array("b", b"page-7"))) == want
    assert chunk_key(memoryview(b"xpage-7x")[1:-1]) == want


def test_a_view_that_is_not_plain_bytes_is_refused() -> None:
    with pytest.raises(ChunkKeyError, match="memoryview of format 'I'"):
        chunk_key(memoryview(array.array("I", [1, 2])))
    with pytest.raises(ChunkKeyError, match="not C-contiguous"):
        chunk_key(memoryview(b"abcdef")[::2])


def test_a_namespace_is_a_str() -> None:
    with pytest.raises(ChunkKeyError, match="namespace is a str, not a bytes"):
        chunk_key("x", namespace=b"tp0")  # type: ignore[arg-type]


def _calls(key: Any) -> list[Callable[[ChunkStore], object]]:
    good = chunk_key("fine")
    return [
        lambda s: s.put(key, b"page"),
        lambda s: s.batch_put([good, key], [b"page", b"page"]),
        lambda s: s.exists(key),
        lambda s: key in s,
        lambda s: s.contains(key),
        lambda s: s.batch_exists([good, key]),
        lambda s: s.get(key),
        lambda s: s.get_into(key, bytearray(8)),
        lambda s: s.batch_get_into([good, key], [bytearray(8), bytearray(8)]),
        lambda s: s.open_chunk(key),
        lambda s: s.pin(key),
        lambda s: s.unpin(key),
        lambda s: s.pinned(key),
        lambda s: s.remove(key),
    ]


@pytest.mark.parametrize(
    "key",
    [5, b"\0" * 5, bytearray(32), "x" * 32, None],
    ids=["int", "short", "bytearray", "str", "None"],
)
def test_every_call_that_takes_a_key_checks_it_first(tmp_path: Path, key: Any) -> None:
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 1 << 20)], tiny_fp()) as s:
        for i, call in enumerate(_calls(key)):
            with pytest.raises(ChunkKeyError, match="a chunk key is 32 bytes"):
                call(s)
            assert s.entries() == 0, i  # batch_put checked every key before the first page
    for call in _calls(key):  # closed: still a typed error, never a quiet False
        with pytest.raises(ChunkKeyError):
            call(s)
