"""The vLLM connector's loader, without vLLM: a step's loads run on the loader's own thread,
which lets itself (and the read threads it starts) run on every CPU of the process even when
the thread that starts it is pinned to one (vLLM pins its worker's); ``wait`` returns only once
the loads ended; the blocks a load did not fill are reported once; a load that raises
something unexpected is a shortfall, never a hang or a failed step."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import ModelFingerprint
from stratastore.adapters.vllm.loader import Loader
from stratastore.adapters.vllm.plan import LoadJob
from stratastore.adapters.vllm.tally import Tally
from stratastore.io.system import process_cpus

BS = 32


class _Restored:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens


class _Store:
    """Restores ``gives`` tokens of each request (or raises ``raises``) once ``gate`` opens,
    noting the CPUs its calling thread may run on."""

    def __init__(self, gives: int, raises: BaseException | None = None) -> None:
        self.gives, self.raises = gives, raises
        self.gate = threading.Event()
        self.cpus: list[set[int]] = []

    def restore(self, tokens: Any, dest: Any, max_tokens: int) -> _Restored:
        self.cpus.append(os.sched_getaffinity(0))
        self.gate.wait(30)
        if self.raises is not None:
            raise self.raises
        return _Restored(min(self.gives, max_tokens))


class _Pool:
    fp = ModelFingerprint.create(
        "tiny", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=16, dtype="bfloat16"
    )

    def destination(self, block_ids: Any, skip: int) -> object:
        return object()


def _job(n: int, skip: int = 0) -> LoadJob:
    return LoadJob("r", np.arange(n, dtype=np.uint32), tuple(range(10, 10 + -(-n // BS))), skip)


@pytest.mark.skipif(len(process_cpus()) < 2, reason="needs a process allowed 2 CPUs or more")
def test_loads_run_off_the_pinned_core_and_wait_returns_once_they_ended() -> None:
    store, tally = _Store(gives=4 * BS), Tally()
    loader = Loader(store, _Pool(), tally, BS)
    everything = process_cpus()
    pinned = threading.Event()

    def engine_thread() -> None:  # vLLM's worker: pinned to one core, starts the loads
        os.sched_setaffinity(0, {min(everything)})
        pinned.set()
        loader.start([_job(4 * BS), _job(2 * BS)])

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert pinned.is_set()
    waited = threading.Event()
    waiter = threading.Thread(target=lambda: (loader.wait(), waited.set()))
    waiter.start()
    assert not waited.wait(0.2)  # the loads have not ended: the forward would still wait
    store.gate.set()
    waiter.join(30)
    assert waited.is_set()
    assert store.cpus and all(c == everything for c in store.cpus)
    assert loader.errors() == set()
    assert tally.snapshot()["loads"] == 2
    loader.close()


def test_the_blocks_a_load_did_not_fill_are_reported_once() -> None:
    store = _Store(gives=BS + 16)  # a block and a half of four
    store.gate.set()
    loader = Loader(store, _Pool(), Tally(), BS)
    loader.start([_job(4 * BS)])
    assert loader.errors() == {11, 12, 13}  # the second block on: vLLM recomputes them
    assert loader.errors() == set()
    loader.close()


def test_an_unexpected_error_is_a_shortfall_never_a_hang() -> None:
    store = _Store(gives=0, raises=RuntimeError("a bug"))
    store.gate.set()
    tally = Tally()
    loader = Loader(store, _Pool(), tally, BS)
    loader.start([_job(3 * BS, skip=BS)])
    assert loader.errors() == {11, 12}  # past vLLM's own first block
    assert tally.snapshot()["load_shortfalls"] == 1
    loader.start([_job(BS)])  # the thread goes on
    assert loader.errors() == {10}
    loader.close()


def test_the_cpus_a_process_may_use_take_its_parents_in(tmp_path: Path) -> None:
    """vLLM's worker has every thread pinned to its forward's core; its parent, the engine
    process, is not: the CPUs the worker may use are the parent's too."""
    seen: list[set[int]] = []

    def pinned_worker() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        seen.append(process_cpus(tasks=str(tmp_path)))  # no other thread of its own to see

    t = threading.Thread(target=pinned_worker)
    t.start()
    t.join()
    assert seen == [os.sched_getaffinity(os.getppid()) | {min(os.sched_getaffinity(0))}]
