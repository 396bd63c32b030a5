"""The LMCache plugin's store side without lmcache: the stored key of a chunk key is stable across
processes and hash seeds and changes with every field; a chunk layout round-trips and gives token
counts; the chunk store keeps its byte budget exactly (oldest first, never a pinned chunk or the
layout record), refuses what cannot fit, records one layout per directory and turns a damaged chunk
into a counted miss that is removed. The LMCache side is
``tests/adapters/test_lmcache_plugin.py``."""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys
from pathlib import Path

import blake3
import numpy as np
import pytest

from stratastore.adapters.lmcache.chunks import ChunkLayout, KeyFields, chunk_id
from stratastore.adapters.lmcache.store import ChunkStore, stored_bytes
from stratastore.format import FormatError, ModelFingerprint, data_name
from stratastore.format.keys import state_key
from tests.conftest import tiny_fp

KEY = KeyFields("meta-llama/Llama-3.1-8B", 2, 1, -1234567890123, "torch.bfloat16")
#: ChunkLayout.of for LMCache's KV_2LTD objects [2, layers, tokens, hidden] of fp16
LAYOUT, _ = ChunkLayout.of("KV_2LTD", 2, ["torch.float16"], [2], [(2, 2, 16, 32)])
TOKEN_BYTES = 2 * 2 * 32 * 2


def test_the_chunk_id_is_a_golden_value_in_every_process() -> None:
    """Derived from the key's fields only (BLAKE3, spec in the module docstring), never from
    Python's ``hash()``: another process with another hash seed derives the same id."""
    here = chunk_id(KEY).hex()
    code = (
        "from stratastore.adapters.lmcache.chunks import KeyFields, chunk_id; print(chunk_id("
        "KeyFields('meta-llama/Llama-3.1-8B', 2, 1, -1234567890123, 'torch.bfloat16')).hex())"
    )
    for seed in ("1", "4242"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=seed),
            check=True,
        )
        assert out.stdout.strip() == here
    assert here == "4ceb6e5a77a427133e11b0c97e047b1339ecdbcdcd9af112bfb26268fd7c0252"

    # the module docstring's derivation, written out by hand
    def s(x: str) -> bytes:
        return struct.pack("<I", len(x)) + x.encode()

    spec = (
        b"strata-lmcache-key-v1\x00"
        + s(KEY.model_name)
        + struct.pack("<Qq", 2, 1)
        + b"\x00"
        + s("-1234567890123")
        + s("torch.bfloat16")
        + struct.pack("<qI", -1, 0)
    )
    assert blake3.blake3(spec).hexdigest() == here


@pytest.mark.parametrize(
    "change",
    [
        {"model_name": "other"},
        {"world_size": 4},
        {"worker_id": 0},
        {"chunk_hash": 5},
        {"chunk_hash": b"\x00" * 8},
        {"dtype": "torch.float16"},
        {"layer_id": 0},
        {"tags": (("user", "7"),)},
    ],
)
def test_every_field_changes_the_chunk_id(change: dict[str, object]) -> None:
    fields = {f: getattr(KEY, f) for f in KEY.__dataclass_fields__}
    assert chunk_id(KeyFields(**{**fields, **change})) != chunk_id(KEY)  # type: ignore[arg-type]


def test_a_layout_round_trips_and_counts_tokens() -> None:
    layout, tokens = ChunkLayout.of("KV_2LTD", 2, ["torch.float16"], [2], [(2, 2, 7, 32)])
    assert layout == LAYOUT and tokens == 7
    assert ChunkLayout.decode(layout.encode(), "record") == layout
    assert layout.bytes_per_token == TOKEN_BYTES
    assert layout.shapes_for(5) == [(2, 2, 5, 32)]
    assert layout.tokens_for(3 * TOKEN_BYTES) == 3
    assert layout.tokens_for(3 * TOKEN_BYTES + 1) is None and layout.tokens_for(0) is None
    with pytest.raises(FormatError, match="disagree on the token count"):
        ChunkLayout.of("KV_2LTD", 2, ["a", "b"], [2, 2], [(2, 2, 7, 32), (2, 2, 8, 32)])
    with pytest.raises(FormatError, match="record: not a chunk layout record"):
        ChunkLayout.decode(b"{}", "record")


def payload(seed: int, tokens: int = 16) -> memoryview:
    return memoryview(np.random.default_rng(seed).integers(0, 256, tokens * TOKEN_BYTES, np.uint8))


def cid(i: int) -> bytes:
    return chunk_id(KeyFields("m", 1, 0, i, "torch.float16"))


def open_store(path: Path, chunks: int, fp: ModelFingerprint | None = None) -> ChunkStore:
    """Room for the layout record and ``chunks`` chunks of 16 tokens."""
    layout_bytes = stored_bytes(len(LAYOUT.encode()))
    store = ChunkStore.open(
        str(path), fp or tiny_fp(), layout_bytes + chunks * stored_bytes(16 * TOKEN_BYTES)
    )
    assert store.accepts(LAYOUT)
    return store


def read(store: ChunkStore, i: int) -> bytes | None:
    chunk = store.open_chunk(cid(i))
    if chunk is None:
        return None
    out = bytearray(chunk.payload_bytes)
    return bytes(out) if store.copy_into(chunk, memoryview(out)) else None


def test_the_budget_is_kept_exactly_oldest_first_never_a_pinned_chunk(tmp_path: Path) -> None:
    store = open_store(tmp_path / "d", 3)
    for i in range(3):
        assert store.put(cid(i), payload(i)) == "stored"
    assert store.pages.backends[0].used() == store.budget_bytes  # full, exactly
    assert store.pin(cid(0))
    assert store.put(cid(3), payload(3)) == "stored"  # evicts 1, the oldest not pinned
    assert [store.contains(cid(i)) for i in range(4)] == [True, False, True, True]
    assert store.put(cid(2), payload(2)) == "present"
    assert store.unpin(cid(0)) and not store.pinned(cid(0))
    assert store.put(cid(4), payload(4)) == "stored"  # now 0 goes
    assert [store.contains(cid(i)) for i in range(5)] == [False, False, True, True, True]
    on_disk = sum(os.path.getsize(p) for p in (tmp_path / "d").iterdir() if p.is_file())
    assert store.pages.backends[0].used() == on_disk == store.budget_bytes
    assert read(store, 3) == bytes(payload(3))
    s = store.stats()
    assert (s["puts"], s["puts_deduped"], s["evictions"], s["entries"]) == (5, 1, 2, 3)
    store.close()


def test_what_cannot_fit_is_refused_and_only_pinned_chunks_stay(tmp_path: Path) -> None:
    store = open_store(tmp_path / "d", 2)
    assert store.put(cid(0), payload(0)) == "stored" and store.pin(cid(0))
    assert store.put(cid(1), payload(1)) == "stored" and store.pin(cid(1))
    assert store.put(cid(2), payload(2)) == "refused"  # nothing evictable
    assert store.put(cid(3), payload(3, tokens=64)) == "refused"  # larger than the budget
    assert store.stats()["puts_refused"] == 2 and store.stats()["in_flight_bytes"] == 0
    assert store.remove(cid(0)) and not store.pinned(cid(0))
    assert store.put(cid(2), payload(2)) == "stored"
    store.close()


def test_one_layout_per_directory_recorded_durably(tmp_path: Path) -> None:
    store = open_store(tmp_path / "d", 2)
    other, _ = ChunkLayout.of("KV_2LTD", 2, ["torch.float16"], [2], [(2, 4, 16, 32)])
    assert not store.accepts(other) and store.stats()["puts_refused"] == 1
    store.close()
    again = ChunkStore.open(str(tmp_path / "d"), tiny_fp(), 1 << 20)
    assert again.layout == LAYOUT and again.entries() == 0
    again.close()


def test_a_damaged_chunk_is_a_counted_miss_and_is_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path / "d", 3)
    for i in range(2):
        store.put(cid(i), payload(i))
    path = tmp_path / "d" / data_name(state_key(cid(1)))
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) - 100)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 1]))
    assert read(store, 0) == bytes(payload(0))
    with caplog.at_level("WARNING", logger="stratastore.adapters.lmcache"):
        assert read(store, 1) is None
    assert "is damaged (ChecksumMismatch" in caplog.text
    assert not store.contains(cid(1)) and not path.exists()
    assert store.stats()["damaged"] == 1
    assert store.put(cid(1), payload(1)) == "stored" and read(store, 1) == bytes(payload(1))
    store.close()


def test_strata_bench_lmcache_without_the_extra_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``strata bench --lmcache`` where lmcache is not installed: exit 2 and a line naming the
    extra, no traceback (skipped where the extra is installed)."""
    if importlib.util.find_spec("lmcache") is not None:
        pytest.skip("the lmcache extra is installed: the benchmark would run")
    from stratastore.cli import main

    assert main(["bench", "--lmcache"]) == 2
    err = capsys.readouterr().err
    assert "stratastore[lmcache]" in err and "Traceback" not in err


def test_engines_of_two_memory_formats_sharing_a_redis_level_never_mix_chunks(
    tmp_path: Path,
) -> None:
    """Each engine's first level is its own and the last (Redis) is shared: the layout the
    shared level took first is the one every engine keeps, so the second engine's chunks of
    another memory format are refused, never stored under keys the first reads."""
    from stratastore.chunks import ChunkConfig, ChunkLevel, KeptRecordConflict
    from tests.redis_servers import RedisServer
    from tests.remote.conftest import import_or_skip, redis_binaries_or_skip

    import_or_skip("redis")
    other, _ = ChunkLayout.of("KV_T2D", 1, ["torch.float16"], [2], [(16, 2, 2, 32)])
    assert other != LAYOUT
    with RedisServer(tmp_path / "redis", binaries=redis_binaries_or_skip()) as server:
        shared = ChunkLevel(server.url, 1 << 24, settings={"name": "lmcache"})

        def engine(own: str) -> ChunkStore:
            first = ChunkLevel(str(tmp_path / own), 1 << 24)
            return ChunkStore.open_levels(ChunkConfig((first, shared)), tiny_fp())

        a, b = engine("a"), engine("b")  # both open before anything is recorded
        try:
            assert a.accepts(LAYOUT) and a.put(cid(0), payload(0)) == "stored"
            assert not b.accepts(other)  # the shared level holds a's layout: refused
            assert b.counters.puts_refused == 1 and b.layout == LAYOUT
        finally:
            a.close()
            b.close()
        b = engine("b")  # its own level took nothing of its own
        assert b.known_layout() == LAYOUT
        b.close()
        c = ChunkStore.open_levels(
            ChunkConfig((ChunkLevel(str(tmp_path / "c"), 1 << 24),)), tiny_fp()
        )
        assert c.accepts(other)  # c's own level records the other format
        c.close()
        with pytest.raises(KeptRecordConflict, match="share a level"):
            ChunkStore.open_levels(
                ChunkConfig((ChunkLevel(str(tmp_path / "c"), 1 << 24), shared)), tiny_fp()
            )
