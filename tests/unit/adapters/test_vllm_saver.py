"""The vLLM connector's saver thread, without vLLM: a park counts as durable only once the
Store's write landed (what a new store then restores), a finished request's blocks are given
back only after its park, jobs handed over together all land, and a park the store
refuses or cannot take is counted by reason, never raised into vLLM's step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ModelFingerprint, Store
from stratastore.adapters.vllm.plan import SaveJob, conversation_id, save_cuts
from stratastore.adapters.vllm.saver import Saver
from stratastore.adapters.vllm.tally import Tally
from stratastore.restore import FlatKV

P = 16


def _fp() -> ModelFingerprint:
    return ModelFingerprint.create(
        "tiny", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=P, dtype="bfloat16"
    )


class _Pool:
    """Stands in for vLLM's pool: each request's pages are a function of their position, its
    blocks a park's source in the engine's memory, as the pool's are (room for the longest
    request here, 16,384 tokens)."""

    def __init__(self, fp: ModelFingerprint) -> None:
        self.fp = fp
        self.sourced: list[tuple[int, ...]] = []

    def source(self, block_ids: Any) -> FlatKV:
        self.sourced.append(tuple(block_ids))
        return FlatKV(self.fp, _pages(self.fp, 16384))


def _pages(fp: ModelFingerprint, n: int) -> np.ndarray:
    return (np.arange(n * fp.token_bytes, dtype=np.uint64) % 251).astype(np.uint8)


def _job(prompt: np.ndarray, n: int, held: bool, req: str = "r") -> SaveJob:
    return SaveJob(
        req, conversation_id(prompt, req), prompt[:n], (0, 1, 2), save_cuts(n, P), held=held
    )


def _open(fp: ModelFingerprint, dir: Path, **kw: Any) -> Store:
    cfg = {"ram_mib": 0, "park": "disk", "page_resume": True, "cold_dir": str(dir)}
    return Store.open(fp, {**cfg, "cold_mib": 64, **kw})


def test_a_park_is_durable_before_it_counts_and_its_blocks_go_back(tmp_path: Path) -> None:
    fp, tally = _fp(), Tally()
    store, pool = _open(fp, tmp_path), _Pool(fp)
    prompt = np.arange(3, 3 + 100, dtype=np.uint32)
    saver = Saver(store, pool, tally)  # type: ignore[arg-type]
    saver.submit(_job(prompt, 96, held=False), _pages(fp, 96))  # copied in the step
    saver.close()
    saver = Saver(store, pool, tally)  # type: ignore[arg-type]
    whole = np.arange(3, 3 + 140, dtype=np.uint32)
    saver.submit(SaveJob("r", conversation_id(prompt, "r"), whole[:128], (0, 1, 2), (0, 96)))
    saver.close()
    assert pool.sourced == [(0, 1, 2)]  # the held blocks parked from, on the thread, once
    assert saver.finished() == {"r"}  # given back after the park
    totals = tally.snapshot()
    assert (totals["parks"], totals["tokens_parked"]) == (2, 96 + 128)
    assert totals["bytes_park"] == (96 + 128) * fp.token_bytes
    assert totals["park_seconds_count"] == 2
    store.close()
    again = _open(fp, tmp_path)  # what counted as durable is there for a new store
    assert again.lookup(np.concatenate([whole[:128], [7]])) == ("disk", 128)
    again.close()


def test_jobs_handed_together_all_land_and_only_held_blocks_go_back(tmp_path: Path) -> None:
    fp, tally = _fp(), Tally()
    store, pool = _open(fp, tmp_path), _Pool(fp)
    prompt = np.arange(3, 3 + 70, dtype=np.uint32)
    other = np.arange(500, 500 + 40, dtype=np.uint32)
    saver = Saver(store, pool, tally, start=False)  # type: ignore[arg-type]
    saver.submit(_job(prompt, 64, held=False, req="a"), _pages(fp, 64))
    saver.submit(_job(other, 32, held=False, req="b"), _pages(fp, 32))
    whole = np.concatenate([prompt, np.arange(900, 920, dtype=np.uint32)])
    saver.submit(SaveJob("a", conversation_id(prompt, "a"), whole[:80], (0, 1), (0, 64)))
    saver.start()
    saver.close()
    totals = tally.snapshot()
    assert (totals["parks"], totals["tokens_parked"]) == (3, 64 + 32 + 80)
    assert saver.finished() == {"a"}  # only the held request's blocks are given back
    assert store.lookup(np.concatenate([whole[:80], [7]])) == ("disk", 80)
    assert store.lookup(np.concatenate([other[:32], [7]])) == ("disk", 32)
    store.close()


def test_what_the_store_does_not_keep_is_counted_by_reason(tmp_path: Path) -> None:
    fp, tally = _fp(), Tally()
    store, pool = _open(fp, tmp_path, cold_mib=1, when_full="reject"), _Pool(fp)
    big = np.arange(3, 3 + 16384, dtype=np.uint32)  # 2 MiB of K/V: over the level's budget
    bad = SaveJob("c", "", big[:16], (0,), (0,), held=True)  # an empty conversation id
    saver = Saver(store, pool, tally, start=False)  # type: ignore[arg-type]
    saver.submit(SaveJob("b", conversation_id(big, "b"), big, (0,), save_cuts(16384, P)))
    saver.submit(bad)
    saver.start()
    saver.close()
    totals = tally.snapshot()
    assert totals["parks"] == 0
    assert totals["dropped"]["error"] == 1, totals
    assert totals["dropped"]["refused"] == 1, totals  # over the budget, when_full = reject
    assert saver.finished() == {"b", "c"}  # their blocks go back all the same
    store.close()


def test_an_unexpected_error_gives_the_blocks_back_and_the_thread_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp, tally = _fp(), Tally()
    store, pool = _open(fp, tmp_path), _Pool(fp)
    prompt = np.arange(3, 3 + 40, dtype=np.uint32)

    def broken() -> None:
        raise OSError("the disk went away")

    monkeypatch.setattr(store, "flush", broken)
    saver = Saver(store, pool, tally, start=False)  # type: ignore[arg-type]
    saver.submit(SaveJob("r1", conversation_id(prompt, "r1"), prompt[:32], (0,), (0,)))
    saver.start()
    later = np.arange(600, 640, dtype=np.uint32)
    saver.submit(SaveJob("r2", conversation_id(later, "r2"), later[:32], (0,), (0,)))
    saver.close()
    assert saver.finished() == {"r1", "r2"}  # vLLM gets every block back
    assert tally.snapshot()["dropped"]["error"] == 2 and tally.snapshot()["parks"] == 0
    monkeypatch.undo()
    store.close()
