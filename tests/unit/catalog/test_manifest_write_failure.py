"""A park whose manifest write fails (spec F-CHAIN-3, F-CAT-7): the park raises, and what the
store then holds is whole and the same in the live store and after a reopen. Before the rename
put the new manifest in place, the park is withdrawn (its new segments go, the earlier version
stays); after it (the directory's fsync or the file's stamp failed), the file is the new
version, so the park is finished from it as a dead process's would be: committed, every segment
it names kept. Never a manifest naming segments that were withdrawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from stratastore.chain import Checkpoint, Conversation
from stratastore.format import ModelFingerprint
from stratastore.io import faults
from stratastore.io.errors import StrataIOError
from stratastore.io.faults import Fault
from stratastore.restore import LayerKV

FP = ModelFingerprint.create(
    "manifest-failure", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=4
)
CHAIN = "strata-chain-"


def _layers(seed: int) -> tuple[list[Any], list[Any]]:
    """Per-layer K and V of 100 tokens, the engine's contiguous cache."""
    rng = np.random.default_rng(seed)
    shape = (100, FP.n_kv_heads, FP.head_dim)
    k = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(FP.n_layers)]
    v = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(FP.n_layers)]
    return k, v


K, V = _layers(1)


def _kv() -> LayerKV:
    """The engine's K/V as a park takes it: written within the call, so its errors raise there."""
    return LayerKV(FP, K, V)


def _conv(n: int) -> Conversation:
    return Conversation("c", np.arange(n, dtype=np.uint32), [Checkpoint(n)], cuts=[0, 40])


def _cfg(root: Path) -> dict[str, Any]:
    return {"park": "disk", "ram_mib": 0, "cold_dir": str(root / "cold"), "cold_mib": 64}


def _held(store: Store) -> int:
    """The tokens of the conversation a restore delivers, checked bit for bit."""
    k, v = _layers(2)
    got = store.restore(np.arange(100, dtype=np.uint32), LayerKV(FP, k, v))
    n = got.tokens
    assert all(np.array_equal(a[:n], b[:n]) for a, b in zip(k + v, K + V, strict=True))
    return n


def _fsync_after_rename(root: Path) -> int:
    """Which ``fsync_dir`` of the extending park is the one after its manifest's rename."""
    root.mkdir()
    with Store.open(FP, _cfg(root)) as store:
        store.park(_conv(40), _kv())
        with faults.inject(record=True) as rec:
            store.park(_conv(100), _kv())
    ops = rec.log
    renamed = next(i for i, (op, path) in enumerate(ops) if op == "rename" and CHAIN in path)
    return sum(1 for op, _ in ops[: renamed + 1] if op == "fsync_dir") + 1


@pytest.mark.parametrize(
    ("where", "after_rename"),
    [("rename", False), ("write", False), ("stat", True), ("fsync_dir", True)],
)
def test_a_failed_manifest_write_leaves_one_whole_version(
    tmp_path: Path, where: str, after_rename: bool
) -> None:
    if where == "fsync_dir":
        fault = Fault(op="fsync_dir", nth=_fsync_after_rename(tmp_path / "dry"))
    else:
        fault = Fault(op=where, path_contains=CHAIN)
    with Store.open(FP, _cfg(tmp_path)) as store:
        store.park(_conv(40), _kv())
        with faults.inject(fault), pytest.raises(StrataIOError):
            store.park(_conv(100), _kv())
        assert fault.fired == 1
        want = 100 if after_rename else 40
        assert store.lookup(np.arange(100, dtype=np.uint32)) == ("disk", want)
        assert _held(store) == want
    with Store.open(FP, _cfg(tmp_path)) as store:
        assert store.lookup(np.arange(100, dtype=np.uint32)) == ("disk", want)
        assert _held(store) == want
        store.park(_conv(100), _kv())  # and the conversation parks again as ever
        assert _held(store) == 100
