"""A setting a level's backend does not take is a ConfigError naming the setting, the level (a
URL by its scheme alone) and the settings that backend takes, raised where every opener is
called (``BackendEntry.open``), before the opener runs: for a chunk level (whose settings are
the opener's arguments as they are), for ``open_level`` and for a backend registered from
outside the package; never the opener's own TypeError."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from stratastore import ChunkLevel, ChunkStore, ConfigError
from stratastore.format import Level, ModelFingerprint
from stratastore.levels import (
    BackendEntry,
    LevelContext,
    SegmentBackend,
    Setting,
    open_level,
    register_backend,
    unregister_backend,
)
from stratastore.levels.memory import MemoryBackend
from tests.conftest import tiny_fp

SECRET = "pw-QJXZ"
REDIS_TAKES = (
    "name, username, password, tls_ca, tls_cert, tls_key, timeout_s, part_bytes, eviction, "
    "budget_bytes, keep_local"
)


def _refused(level: ChunkLevel) -> str:
    with pytest.raises(ConfigError) as e:
        ChunkStore.open([level], tiny_fp())
    return str(e.value)


def test_a_redis_chunk_level_names_the_setting_and_what_it_takes() -> None:
    msg = _refused(
        ChunkLevel(f"redis://alice:{SECRET}@127.0.0.1:1/0", 1 << 20, settings={"timeout_ms": 1})
    )
    assert "level 'redis://...': setting 'timeout_ms' is not one a Redis level takes" in msg
    assert f"its settings are {REDIS_TAKES}" in msg
    assert SECRET not in msg and "alice" not in msg


def test_a_directory_chunk_level_names_the_setting_and_what_it_takes(tmp_path: Path) -> None:
    d = tmp_path / "d"
    msg = _refused(ChunkLevel(str(d), 1 << 20, settings={"file_mod": 0o600, "zz": 1}))
    assert f"level {str(d)!r}: settings 'file_mod', 'zz' are not one a directory level" in msg
    assert "its settings are file_mode, create" in msg
    assert not d.exists()  # refused before the opener made anything


def test_a_memory_level_takes_none() -> None:
    with pytest.raises(ConfigError, match=r"'memory://\.\.\.': setting 'x' .* takes no settings"):
        open_level("memory://m", tiny_fp(), Level.COLD, {"x": 1})


def test_the_settings_a_backend_takes_still_open(tmp_path: Path) -> None:
    level = ChunkLevel(str(tmp_path / "d"), 1 << 20, settings={"file_mode": 0o640})
    with ChunkStore.open([level], tiny_fp()) as s:
        assert s.put(b"\1" * 32, b"page") == "stored"
    open_level(str(tmp_path / "d"), tiny_fp(), Level.COLD, {"create": False}).close()


class _Toy(MemoryBackend):
    pass


def _open_toy(
    spec: str, fingerprint: ModelFingerprint, level: Level, args: Mapping[str, Any]
) -> SegmentBackend:
    return _Toy(spec.partition("://")[2], fingerprint, level, **args)  # a TypeError on a stranger


def _toy_arguments(table: Mapping[str, Any], context: LevelContext) -> dict[str, Any]:
    return {}  # the toy's opener takes nothing, whatever its table holds


@pytest.fixture
def toys() -> Iterator[None]:
    register_backend(
        "toyargs",
        BackendEntry(
            "toy", _open_toy, settings={"shelf": Setting("shelf", "top")}, arguments=_toy_arguments
        ),
    )
    register_backend("toytable", BackendEntry("toy table", _open_toy))
    yield
    unregister_backend("toyargs")
    unregister_backend("toytable")


def test_a_backend_registered_from_outside_gets_the_same_check(toys: None) -> None:
    msg = _refused(ChunkLevel("toyargs://a", 1 << 20, settings={"shelf": "top"}))
    assert "level 'toyargs://...': setting 'shelf' is not one a toy level takes" in msg
    assert "it takes no settings" in msg
    with pytest.raises(ConfigError, match="setting 'colour' is not one a toy table level takes"):
        open_level("toytable://b", tiny_fp(), Level.COLD, {"colour": "red"})
    with ChunkStore.open([ChunkLevel("toyargs://c", 1 << 20)], tiny_fp()) as s:
        assert isinstance(s.backends[0], _Toy)
