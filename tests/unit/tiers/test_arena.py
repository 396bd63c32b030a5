"""The RAM arena: chunked allocation, round trips, exhaustion and reuse."""

from __future__ import annotations

import numpy as np
import pytest

from stratastore import ConfigError
from stratastore.tiers.arena import Arena


def test_roundtrip_over_non_contiguous_chunks() -> None:
    arena = Arena(10 * 4096, chunk_bytes=4096)
    a = arena.alloc(3 * 4096)
    b = arena.alloc(2 * 4096 + 5)
    assert a is not None and b is not None
    arena.release(a)
    c = arena.alloc(4 * 4096 + 100)  # reuses a's chunks and more
    assert c is not None
    data = np.random.default_rng(0).integers(0, 256, c.nbytes, dtype=np.uint8)
    arena.write(c, data)
    out = np.zeros_like(data)
    arena.read_into(c, out)
    assert np.array_equal(out, data)
    part = np.zeros(5000, np.uint8)
    arena.read_into(c, part, 5000)
    assert np.array_equal(part, data[:5000])
    arena.close()


def test_exhaustion_and_release() -> None:
    arena = Arena(4 * 4096, chunk_bytes=4096)
    a = arena.alloc(4 * 4096)
    assert a is not None and arena.free_bytes == 0 and arena.alloc(1) is None
    arena.release(a)
    assert arena.free_bytes == arena.capacity == 4 * 4096
    arena.close()


def test_bad_chunk_size() -> None:
    with pytest.raises(ConfigError):
        Arena(1 << 20, chunk_bytes=1000)
