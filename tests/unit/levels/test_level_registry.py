"""Opening a level from its spec by scheme (``stratastore.levels.registry``): a path and
``file://`` open the directory store, ``memory://`` the shipped in-memory backend, a Redis URL
the Redis backend (or a ConfigError naming the extra); an unknown scheme is a ConfigError that
names the schemes there are and no credential."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore.errors import ConfigError
from stratastore.format import Level
from stratastore.levels import SegmentBackend
from stratastore.levels.local import SegmentStore
from stratastore.levels.memory import MemoryBackend
from stratastore.levels.registry import SCHEMES, open_level, scheme_of
from tests.conftest import tiny_fp


def _round_trip(level: SegmentBackend) -> None:
    fp = level.fingerprint
    tokens = np.arange(fp.page_tokens, dtype=np.int64)
    payload = np.arange(fp.page_tokens * fp.token_bytes, dtype=np.uint32).astype(np.uint8)
    put = level.put_kv(b"\0" * 32, tokens, payload, token_start=0)
    assert put.created and put.key in level
    assert level.get_bytes(put.key, max_bytes=1 << 30) == payload.tobytes()


@pytest.mark.parametrize("form", ["path", "file"])
def test_a_path_opens_the_directory_store(tmp_path: Path, form: str) -> None:
    spec = str(tmp_path / "warm") if form == "path" else f"file://{tmp_path / 'warm'}"
    level = open_level(spec, tiny_fp(), Level.WARM)
    try:
        assert isinstance(level, SegmentStore) and level.level == Level.WARM
        _round_trip(level)
    finally:
        level.close()


def test_memory_opens_the_shipped_memory_backend() -> None:
    level = open_level("memory://scratch", tiny_fp(), Level.COLD)
    assert isinstance(level, MemoryBackend) and level.path == "memory://scratch"
    assert level.persistent is False
    _round_trip(level)


def test_an_unknown_scheme_is_a_config_error_without_the_url() -> None:
    with pytest.raises(ConfigError) as e:
        open_level("s3://alice:s3cret@bucket/x", tiny_fp())
    assert "s3cret" not in str(e.value) and "alice" not in str(e.value)
    assert "memory://" in str(e.value) and "redis://" in str(e.value)


def test_scheme_of() -> None:
    assert scheme_of("/var/lib/strata") == ""
    assert scheme_of(Path("relative/dir")) == ""
    assert scheme_of("redis+cluster://h:1,h:2") == "redis+cluster"
    assert scheme_of("MEMORY://x") == "memory"
    assert {"", "file", "memory", "redis", "rediss", "redis+cluster"} <= set(SCHEMES)
