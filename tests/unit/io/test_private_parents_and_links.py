"""The parents a store creates are private too under ``umask 0`` (spec F-DIR-9), and a warm data
file replaced by a link cannot wedge the level (a park that needs room moves past it instead of
failing every later park; spec F-DIR-8)."""

from __future__ import annotations

import glob
import os
import shutil
import stat
from pathlib import Path

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from tests.conftest import tiny_fp

FP = tiny_fp()
TB = FP.token_bytes


def test_parents_made_by_the_store_are_private_under_umask_0(tmp_path: Path) -> None:
    cold = tmp_path / "a" / "b" / "cold"
    old = os.umask(0)
    try:
        cfg = {
            "ram_mib": 1,
            "slots": 1,
            "min_free_mib": 1,
            "cold_dir": str(cold),
            "cold_mib": 8,
            "create_dirs": True,
        }
        Store.open(FP, cfg, probe=lambda: 1 << 40).close()
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", cold):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_a_linked_warm_data_file_does_not_wedge_later_parks(tmp_path: Path) -> None:
    n = 512  # 32 KiB a conversation: a 1 MiB warm level holds about 30
    cfg = {
        "ram_mib": 1,
        "slots": 1,
        "min_free_mib": 1,
        "park": "disk",
        "warm_dir": str(tmp_path / "warm"),
        "warm_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }

    def park(store: Store, i: int) -> tuple[list[int], np.ndarray]:
        toks = list(range(i * 10_000, i * 10_000 + n))
        kv = np.random.default_rng(i).integers(0, 256, n * TB, dtype=np.uint8)
        store.park(Conversation(f"c{i}", toks, [Checkpoint(n)], cuts=[0]), kv.copy())
        store.flush()
        return toks, kv

    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        park(store, 0)
    outside = tmp_path / "outside.seg"
    (seg,) = glob.glob(str(tmp_path / "warm" / "*.seg"))
    shutil.copy(seg, outside)
    os.unlink(seg)
    os.symlink(outside, seg)
    before = outside.read_bytes()
    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        kept = [park(store, i) for i in range(1, 40)]  # each flush raises if its park failed
        for toks, kv in kept[-5:]:
            out = np.zeros(n * TB, np.uint8)
            assert store.restore(toks, out).tokens == n and np.array_equal(out, kv)
    assert os.path.islink(seg) and outside.read_bytes() == before  # left alone, not followed
