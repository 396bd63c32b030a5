"""A process that opened the plugin's directory before another process
recorded the chunk layout treats every chunk it reads as damaged and deletes it, although the
chunk is valid and was reported durable to the other process (engine.md: "Several processes
... may share a directory"). ``ChunkStore.open_chunk`` (lmcache_store.py) uses
``self.layout``, read only at open or at this process's first put."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from stratastore.adapters.lmcache.store import ChunkStore  # noqa: E402
from tests.conftest import tiny_fp  # noqa: E402
from tests.unit.adapters.test_lmcache_chunks import cid, payload, read  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

OTHER_PROCESS = """
import sys
from tests.unit.adapters.test_lmcache_chunks import open_store, cid, payload
s = open_store(sys.argv[1], 8)          # records the layout (accepts), as a first put does
assert s.put(cid(0), payload(0)) == "stored"   # durable: the plugin's Future would say True
s.close()
"""


def test_a_chunk_another_process_stored_is_not_deleted_by_this_one(tmp_path: Path) -> None:
    d = tmp_path / "d"
    mine = ChunkStore.open(str(d), tiny_fp(), 1 << 20)  # opened first: no layout yet
    try:
        subprocess.run(
            [sys.executable, "-c", OTHER_PROCESS, str(d)], cwd=ROOT, check=True, timeout=120
        )
        assert mine.contains(cid(0))  # the shared index finds the other process's chunk
        got = read(mine, 0)
        # a valid, durable chunk: delivered, or at worst a miss, but never deleted
        assert mine.contains(cid(0)), "a valid chunk another process stored was deleted"
        assert mine.stats()["damaged"] == 0
        assert got in (None, bytes(payload(0)))
    finally:
        mine.close()


def test_valid_chunks_survive_a_repaired_layout_record(tmp_path: Path) -> None:
    """A damaged layout record stops the plugin from opening (ChecksumMismatch at open); the
    fix the message and engine.md point to, ``strata fsck --repair``, quarantines it; the
    plugin then opens with no layout and deletes every valid chunk it is asked for."""
    from stratastore.adapters.lmcache.chunks import LAYOUT_ID
    from stratastore.format import data_name
    from stratastore.format.keys import state_key
    from stratastore.ops.repair import repair
    from tests.unit.adapters.test_lmcache_chunks import open_store

    d = tmp_path / "d"
    s = open_store(d, 4)
    assert s.put(cid(0), payload(0)) == "stored"
    s.close()
    rec = d / data_name(state_key(LAYOUT_ID))
    raw = bytearray(rec.read_bytes())
    raw[4096 + 3] ^= 1  # bit rot in the layout record's page
    rec.write_bytes(bytes(raw))
    repair([str(d)])
    s = ChunkStore.open(str(d), tiny_fp(), 1 << 20)
    try:
        assert s.contains(cid(0))
        read(s, 0)
        assert s.contains(cid(0)), "a valid chunk was deleted for want of the layout record"
    finally:
        s.close()
