"""``strata fsck``, ``strata inspect`` and ``strata monitor`` work on a chunk store's levels as
on a conversation store's: fsck (``--deep`` too) finds a clean chunk level clean and a flipped
byte in a page; inspect lists the pages as running-state segments; the monitor's Prometheus
text has each level's entries and bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stratastore import ChunkLevel, ChunkStore
from stratastore.chunks import chunk_key, stored_key
from stratastore.cli import main
from stratastore.format import data_name
from tests.conftest import tiny_fp


def _fill(root: Path) -> list[Path]:
    levels = [root / "a", root / "b"]
    with ChunkStore.open([ChunkLevel(str(p), 200_000) for p in levels], tiny_fp()) as store:
        for i in range(10):
            store.put(chunk_key(f"page-{i}"), bytes([i]) * 40_000)
        assert store.stats()["degradations"] > 0  # pages on both levels
    return levels


def test_fsck_inspect_and_monitor_read_a_chunk_stores_levels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _fill(tmp_path)
    assert main(["fsck", "--deep", str(a), str(b)]) == 0
    assert "0 findings, 0 errors" in capsys.readouterr().out
    assert main(["inspect", str(a)]) == 0
    listing = capsys.readouterr().out
    assert f"{a}: " in listing and " state " in listing
    assert main(["monitor", str(a), "--prometheus"]) == 0
    text = capsys.readouterr().out
    assert 'strata_level_entries{level="a"}' in text and 'strata_level_bytes{level="a"}' in text


def test_fsck_deep_finds_a_flipped_byte_in_a_chunk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _fill(tmp_path)
    held = [a / data_name(stored_key(chunk_key(f"page-{i}"))) for i in range(10)]
    target = next(p for p in held if p.exists())
    with open(target, "r+b") as f:
        f.seek(os.path.getsize(target) - 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    assert main(["fsck", "--deep", str(a), str(b)]) != 0
    assert target.name[:20] in capsys.readouterr().out
