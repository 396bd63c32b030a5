"""numba_kernels CPU paths: page hashes bit-exact against the blake3 package, validated copies
that never copy a bad page."""

from __future__ import annotations

import os

import blake3
import numpy as np
import pytest

from numba_kernels import page_hashes, start_page_hashes, validated_copy

SIZES = [
    0,
    1,
    1023,
    1024,
    1025,
    2048,
    2049,
    3072,
    3073,
    4096,
    4097,
    5120,
    5121,
    6144,
    6145,
    7168,
    7169,
    8192,
    8193,
    16384,
    31744,
    102400,
]


def pattern(n: int) -> np.ndarray:
    return (np.arange(n) % 251).astype(np.uint8)


@pytest.mark.parametrize("page_bytes", [1024, 4096, 65536, 1 << 20])
def test_page_hashes_match_the_reference(page_bytes: int) -> None:
    for size in SIZES:
        buf = pattern(size)
        got = page_hashes(buf, page_bytes)
        want = [
            blake3.blake3(buf[i : i + page_bytes].tobytes()).digest()
            for i in range(0, size, page_bytes)
        ]
        assert got.shape == (len(want), 32)
        assert [bytes(r) for r in got] == want, (size, page_bytes)


def test_whole_buffer_as_one_page_matches_official_pattern_digests() -> None:
    # one page per size: the digest of the whole official test input of that length
    for size in SIZES[1:]:
        buf = pattern(size)
        assert bytes(page_hashes(buf, size)[0]) == blake3.blake3(buf.tobytes()).digest()


def test_many_pages_in_parallel_and_async_join() -> None:
    buf = np.frombuffer(os.urandom(9 << 20), np.uint8)
    join = start_page_hashes(buf, 64 << 10)
    ref = page_hashes(buf, 64 << 10)
    assert np.array_equal(join(), ref) and ref.shape == (144, 32)


@pytest.mark.parametrize("bad", [None, 0, 5, 143])
def test_validated_copy(bad: int | None) -> None:
    pb = 64 << 10
    src = np.frombuffer(os.urandom(144 * pb - 100), np.uint8).copy()
    expected = page_hashes(src, pb)
    if bad is not None:
        src[bad * pb + 7] ^= 1
    dst = np.zeros_like(src)
    first = validated_copy(src, dst, pb, expected)
    assert first == (-1 if bad is None else bad)
    if bad is None:
        assert np.array_equal(dst, src)
    else:
        assert not dst[bad * pb : (bad + 1) * pb].any(), "a bad page was copied"
        assert np.array_equal(dst[: bad * pb], src[: bad * pb])


def test_validated_copy_refuses_size_mismatch() -> None:
    src = pattern(4096)
    with pytest.raises(ValueError):
        validated_copy(src, np.zeros(100, np.uint8), 1024, page_hashes(src, 1024))
    with pytest.raises(ValueError):
        validated_copy(src, np.zeros(4096, np.uint8), 1024, page_hashes(src, 1024)[:2])
