"""A park given the engine's own layout (``Store.park(conv, PagedKV(...))`` or a ``LayerKV``):
streamed to disk within the call when parks go to disk (gathered, hashed and written chunk by
chunk, never copied whole), gathered into the store's own copy otherwise. Whatever the path, a
restore gives back every token's K/V bit for bit, the engine's memory is free once park returns,
and a failed write raises from park with nothing acknowledged."""

from __future__ import annotations

import errno
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stratastore.levels.local.segment_store as segment_store
import stratastore.levels.streamed as streamed_put
from stratastore import Store
from stratastore.chain import Checkpoint, Conversation
from stratastore.format import ModelFingerprint
from stratastore.io import faults
from stratastore.io.errors import StrataIOError
from stratastore.io.faults import Fault
from stratastore.restore import LayerKV, PagedKV, pack_pages
from stratastore.tiers.records import InvalidConversation

FP = ModelFingerprint.create("engine-layout", n_layers=3, n_kv_heads=2, head_dim=8, page_tokens=4)
BS = FP.page_tokens  # vLLM's block of 16 tokens is one page of the store: here 4


def _pool(blocks: int, seed: int) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    shape = (2, blocks, BS, FP.n_kv_heads, FP.head_dim)
    return [rng.integers(0, 2**16, shape, dtype=np.uint16) for _ in range(FP.n_layers)]


def _tokens_of(pools: list[np.ndarray[Any, Any]], table: np.ndarray[Any, Any], n: int) -> Any:
    """Each layer's K and V of tokens [0, n) as [layers, 2, n, heads, dim] (the engine's view)."""
    out = np.stack([p[:, table].reshape(2, -1, FP.n_kv_heads, FP.head_dim) for p in pools])
    return out[:, :, :n]


def _store(tmp_path: Path, **extra: Any) -> Store:
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    return Store.open(FP, {**cfg, **extra})


def _conv(n: int, cid: str = "c", cuts: list[int] | None = None) -> Conversation:
    return Conversation(cid, np.arange(n, dtype=np.uint32), [Checkpoint(n)], cuts=cuts or [0])


@pytest.mark.parametrize("chunk_pages", [1, 2, 1000])
def test_a_paged_park_streams_to_disk_and_restores_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_pages: int
) -> None:
    # chunks of 1 and 2 pages run every chunk through the gather-hash-write pipeline and its
    # reuse of staging; 1000 pages is one chunk
    monkeypatch.setattr(segment_store, "WRITE_CHUNK", chunk_pages * FP.page_bytes)
    pools, n = _pool(40, 1), 30 * BS - 3  # the last page short
    table = np.random.default_rng(2).permutation(40)[:30]
    want = _tokens_of(pools, table, n).copy()
    with _store(tmp_path) as store:
        report = store.park(_conv(n, cuts=[0, 41]), PagedKV(FP, pools, table))
        assert (report.where, report.tokens) == ("disk", n)
        assert store.stats()["parks_disk"] == 1
        for p in pools:
            p[...] = 0  # the engine reuses its blocks: the park is not theirs any more
        store.flush()
    with _store(tmp_path) as store:  # from disk, in a new process's view
        back, table2 = _pool(40, 3), np.random.default_rng(4).permutation(40)[:30]
        got = store.restore(np.arange(n, dtype=np.uint32), PagedKV(FP, back, table2))
        assert (got.tokens, got.source) == (n, "disk")
        assert np.array_equal(_tokens_of(back, table2, n), want)


def test_a_layer_park_streams_in_the_stored_layout_along_its_cuts(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    n, cuts = 50, [0, 22, 37]
    k = [rng.integers(0, 256, (64, FP.n_kv_heads, FP.head_dim * 2), np.uint8) for _ in range(3)]
    v = [rng.integers(0, 256, (64, FP.n_kv_heads, FP.head_dim * 2), np.uint8) for _ in range(3)]
    packed = pack_pages(FP, k, v, n, cuts)
    with _store(tmp_path) as store:
        conv = Conversation("c", np.arange(n, dtype=np.uint32), [Checkpoint(22), Checkpoint(n)])
        conv.cuts = list(cuts)
        k16 = [a.view(np.uint16) for a in k]
        v16 = [a.view(np.uint16) for a in v]
        assert store.park(conv, LayerKV(FP, k16, v16)).where == "disk"
        flat = np.zeros(n * FP.token_bytes, np.uint8)
        assert store.restore(np.arange(n, dtype=np.uint32), flat).tokens == n
        assert np.array_equal(flat, packed)  # the stored layout, segment by segment
        half = np.zeros(22 * FP.token_bytes, np.uint8)
        assert store.restore(np.arange(30, dtype=np.uint32), half, max_tokens=22).tokens == 22
        assert np.array_equal(half, packed[: 22 * FP.token_bytes])


def test_retention_cuts_a_streamed_park_at_the_checkpoints_it_keeps(tmp_path: Path) -> None:
    pools, table = _pool(40, 6), np.arange(40)[::-1].copy()
    with _store(tmp_path, checkpoints=4) as store:
        # the first park keeps a checkpoint at 24; the second passes only its newest, no cuts
        first = Conversation("c", np.arange(24, dtype=np.uint32), [Checkpoint(24)])
        store.park(first, PagedKV(FP, pools, table))
        store.park(_conv(100), PagedKV(FP, pools, table))
        back = _pool(40, 7)
        got = store.restore(np.arange(60, dtype=np.uint32), PagedKV(FP, back, table))
        assert got.tokens == 24  # a kept checkpoint is a segment bound: restorable
        assert np.array_equal(_tokens_of(back, table, 24), _tokens_of(pools, table, 24))
        got = store.restore(np.arange(100, dtype=np.uint32), PagedKV(FP, back, table))
        assert got.tokens == 100
        assert np.array_equal(_tokens_of(back, table, 100), _tokens_of(pools, table, 100))


def test_parks_kept_in_ram_gather_a_copy(tmp_path: Path) -> None:
    pools, table = _pool(20, 8), np.arange(20)
    want = _tokens_of(pools, table, 40).copy()
    with Store.open(FP, {"park": "ram", "ram_mib": 16}) as store:
        assert store.park(_conv(40), PagedKV(FP, pools, table)).where == "ram"
        for p in pools:
            p[...] = 0
        back = _pool(20, 9)
        got = store.restore(np.arange(40, dtype=np.uint32), PagedKV(FP, back, table))
        assert (got.tokens, got.source) == (40, "ram")
        assert np.array_equal(_tokens_of(back, table, 40), want)


def test_an_engine_layout_of_another_model_or_too_few_blocks_is_refused(tmp_path: Path) -> None:
    other = ModelFingerprint.create("other", n_layers=3, n_kv_heads=2, head_dim=8, page_tokens=4)
    pools = _pool(10, 10)
    with _store(tmp_path) as store:
        with pytest.raises(InvalidConversation, match=r"described for model .*this store holds"):
            store.park(_conv(8), PagedKV(other, pools, [0, 1]))
        with pytest.raises(InvalidConversation, match=r"holds 8 tokens.*has 12"):
            store.park(_conv(12), PagedKV(FP, pools, [0, 1]))
        with pytest.raises(InvalidConversation, match="cuts"):
            store.park(_conv(8, cuts=[0, 9]), PagedKV(FP, pools, [0, 1]))
        assert store.lookup(np.arange(8, dtype=np.uint32)) is None
        assert store.stats()["parks_disk"] == 0


def test_a_streamed_write_that_fails_raises_from_park_and_stores_nothing(tmp_path: Path) -> None:
    pools, table = _pool(20, 11), np.arange(20)
    with _store(tmp_path) as store:
        with faults.inject(Fault(op="write", errno=errno.EIO)), pytest.raises(StrataIOError):
            store.park(_conv(40), PagedKV(FP, pools, table))
        assert store.lookup(np.arange(40, dtype=np.uint32)) is None
        store.flush()  # nothing was acknowledged: nothing to report
        assert store.park(_conv(40), PagedKV(FP, pools, table)).where == "disk"
        assert store.lookup(np.arange(40, dtype=np.uint32)) == ("disk", 40)


def test_a_streamed_park_holds_its_staging_not_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp = ModelFingerprint.create("big", n_layers=4, n_kv_heads=8, head_dim=128, page_tokens=16)
    chunk = 1 << 20
    monkeypatch.setattr(segment_store, "WRITE_CHUNK", chunk)
    blocks = 256  # 64 MiB of K/V
    pools = [np.ones((2, blocks, 16, 8, 128), np.uint16) for _ in range(fp.n_layers)]
    n = blocks * 16
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "c"), "cold_mib": 256}
    with Store.open(fp, cfg) as store:
        tracemalloc.start()
        try:
            store.park(_conv(n), PagedKV(fp, pools, np.arange(blocks)))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert n * fp.token_bytes == 64 << 20
    assert peak < 8 << 20, f"a streamed park of 64 MiB peaked at {peak / 2**20:.1f} MiB"


def test_a_streamed_park_counts_the_parks_waiting_for_the_writer(tmp_path: Path) -> None:
    """``when_full = reject``: a streamed park that does not fit beside a park still waiting for
    the spill writer is refused at once, and the waiting one lands (never the other way)."""
    blocks = 800
    n = blocks * BS  # 600 KiB: one fits in the level's 1 MiB, two do not
    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": str(tmp_path / "c"), "cold_mib": 1}
    with Store.open(FP, {**cfg, "when_full": "reject"}) as store:
        gate = threading.Event()
        write = store._writes.write
        store._writes.write = lambda snap: (gate.wait(5), write(snap))[1]  # the writer lags
        waiting = _conv(n, "waiting")
        assert store.park(waiting, np.ones(n * FP.token_bytes, np.uint8)).where == "disk"
        streamed = Conversation("s", np.arange(n, dtype=np.uint32) + 10**6, [Checkpoint(n)])
        pools = _pool(blocks, 12)
        assert store.park(streamed, PagedKV(FP, pools, np.arange(blocks))).where == "discard"
        gate.set()
        store.flush()  # the acknowledged park landed
        assert store.lookup(np.arange(n, dtype=np.uint32)) == ("disk", n)
        assert store.stats()["spills_refused"] == 1


def test_a_streamed_park_into_a_level_kept_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A level that keeps or ships a segment whole (``memory://``) gathers the stream whole:
    more chunks than the stream's staging buffers, every byte in its place."""
    whole = streamed_put.streamed  # a chunk of one page: many more chunks than buffers
    monkeypatch.setattr(
        streamed_put, "streamed", lambda src, pb, chunk, given: whole(src, pb, pb, given)
    )
    levels = [
        {"name": "mem", "url": "memory://scratch", "mib": 64},
        {"name": "cold", "dir": str(tmp_path / "cold"), "mib": 64},
    ]
    pools, table = _pool(40, 13), np.random.default_rng(14).permutation(40)[:30]
    n = 30 * BS
    with Store.open(FP, {"park": "disk", "ram_mib": 0, "levels": levels}) as store:
        assert store.park(_conv(n), PagedKV(FP, pools, table)).where == "disk"
        back = _pool(40, 15)
        got = store.restore(np.arange(n, dtype=np.uint32), PagedKV(FP, back, table))
        assert got.tokens == n
        assert np.array_equal(_tokens_of(back, table, n), _tokens_of(pools, table, n))


@pytest.mark.parametrize("then", ["flush", "close"])
def test_a_later_park_of_the_id_lands_after_a_streamed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A park of a conversation whose streamed park is still being written waits for it, so the
    two land in the order they were made: the newer one is what the store keeps. A close
    meanwhile waits for both."""
    import stratastore.tiers.park as park_flow

    entered, go = threading.Event(), threading.Event()
    write = park_flow.Parking.write

    def held(self: Any, snap: Any) -> bool:
        if snap.capture is not None:  # the streamed park, placed, before its write
            entered.set()
            go.wait(10)
        return write(self, snap)

    monkeypatch.setattr(park_flow.Parking, "write", held)
    pools, table = _pool(40, 16), np.arange(40)
    newer = _conv(100)
    engine = _tokens_of(pools, table, 100)  # [layers, 2, tokens, heads, dim]
    kv = pack_pages(FP, list(engine[:, 0]), list(engine[:, 1]), 100, [0])
    with _store(tmp_path) as store:
        older = threading.Thread(target=store.park, args=(_conv(40), PagedKV(FP, pools, table)))
        older.start()
        assert entered.wait(10)
        later = threading.Thread(target=store.park, args=(newer, kv))
        later.start()
        later.join(1.0)  # (without the wait, its spill write lands meanwhile)
        deadline = time.monotonic() + 5
        while not later.is_alive() and store.lookup(newer.tokens) != ("disk", 100):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        closing = threading.Thread(target=store.close)
        if then == "close":
            closing.start()  # it waits for both parks in flight
            closing.join(0.2)
        go.set()
        older.join(10)
        later.join(10)
        if then == "close":
            closing.join(10)
            assert not closing.is_alive()
        else:
            store.flush()
            assert store.lookup(newer.tokens) == ("disk", 100)
    with _store(tmp_path) as store:
        assert store.lookup(newer.tokens) == ("disk", 100)
