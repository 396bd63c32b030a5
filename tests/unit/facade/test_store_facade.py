"""The Store facade: the engine's calls, the spill writer, state surfaces, threads, and two
processes on one directory."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from stratastore import ConfigError, Store
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]


conversation = conversation_kv


def test_park_restore_from_ram_and_disk(tmp_path: Path) -> None:
    free = [1 << 40]
    cfg = {
        "ram_mib": 1,
        "min_free_mib": 100,
        "park_min_free_mib": 10,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }
    with Store.open(FP, cfg, probe=lambda: free[0]) as store:
        a, kva = conversation("a", 100, 0)
        b, kvb = conversation("b", 100, 1000)
        assert store.park(a, kva.copy()).where == "ram"
        free[0] = 50 * MIB  # now the parking floor fails: b spills to disk
        assert store.park(b, kvb.copy()).where == "disk"
        store.flush()  # b's write has landed (before it, b is served from its capture: pending)
        for toks, kv, source in [(a.tokens, kva, "ram"), (b.tokens, kvb, "disk")]:
            prompt = np.concatenate([toks, [7, 7, 7]])
            assert store.lookup(prompt) == (source, 100)
            out = np.zeros(len(prompt) * FP.token_bytes, np.uint8)
            r = store.restore(prompt, out)
            assert (r.source, r.tokens) == (source, 100)
            assert np.array_equal(out[: kv.size], kv)
        s = store.stats()
        assert s["parks_ram"] == 1 and s["parks_disk"] == 1 and s["tokens_reread"] == 6
        assert "parks ram=1 disk=1" in store.info_line()
        prom = store.prometheus()
        assert 'strata_parks_total{destination="disk"} 1' in prom
        assert 'strata_level_entries{level="cold"}' in prom


def test_sessions(tmp_path: Path) -> None:
    cfg = {"ram_mib": 1, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation("x", 80, 5)
        store.save_session("chat-1", conv.tokens, kv, checkpoints=[32])
    with Store.open(FP, cfg) as store:
        out = np.zeros_like(kv)
        got = store.load_session("chat-1", out)
        assert np.array_equal(out, kv) and [c.length for c in got.checkpoints] == [32, 80]
        assert store.delete_session("chat-1")


def test_threads_park_and_restore_concurrently(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 2,
        "slots": 8,
        "min_free_mib": 1,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 256,
    }
    errors: list[BaseException] = []
    with Store.open(FP, cfg, spill_queue=2) as store:

        def worker(w: int) -> None:
            try:
                for i in range(15):
                    conv, kv = conversation(f"w{w}-{i}", 64, 100_000 * w + 1000 * i)
                    store.park(conv, kv.copy())
                    out = np.zeros_like(kv)
                    r = store.restore(conv.tokens, out)
                    assert r.tokens == 64 and np.array_equal(out, kv)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_bad_open_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        Store.open(FP, {"ram": 1})
    with pytest.raises(ConfigError, match="spill_queue"):
        Store.open(FP, {"ram_mib": 1}, spill_queue=0)
    with pytest.raises(ConfigError, match="does not exist"):
        Store.open(FP, "/nonexistent/strata.toml")


_PARKER = """
import sys, json, numpy as np
from stratastore import Store
from tests.unit.facade.test_store_facade import conversation, FP
cfg = {"ram_mib": 1, "park": "disk", "cold_dir": sys.argv[1], "cold_mib": 512,
       "min_free_mib": 1}
with Store.open(FP, cfg) as store:
    for i in range(int(sys.argv[2])):
        conv, kv = conversation(f"p{i}", 64 + i, 1000 * i)
        store.park(conv, kv)
        store.flush()
        print(f"ACK {i}", flush=True)
"""

_RESTORER = """
import sys, time, numpy as np
from stratastore import Store
from tests.unit.facade.test_store_facade import conversation, FP
cfg = {"ram_mib": 1, "cold_dir": sys.argv[1], "cold_mib": 512, "min_free_mib": 1}
seen = set()
deadline = time.time() + 60
with Store.open(FP, cfg) as store:
    while len(seen) < int(sys.argv[2]) and time.time() < deadline:
        for i in range(int(sys.argv[2])):
            if i in seen:
                continue
            conv, kv = conversation(f"p{i}", 64 + i, 1000 * i)
            out = np.zeros_like(kv)
            r = store.restore(conv.tokens, out)
            if r.tokens:
                assert r.tokens == len(conv.tokens) and np.array_equal(out, kv), i
                seen.add(i)
        time.sleep(0.01)
print("RESTORED", len(seen))
"""


def test_two_processes_one_parking_one_restoring(tmp_path: Path) -> None:
    n = 20
    cold = tmp_path / "cold"
    with Store.open(FP, {"ram_mib": 1, "cold_dir": str(cold), "cold_mib": 512}):
        pass  # create the level before the two start
    env = {"PYTHONPATH": str(ROOT)}
    parker = subprocess.Popen(
        [sys.executable, "-c", _PARKER, str(cold), str(n)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, **env},
    )
    restorer = subprocess.Popen(
        [sys.executable, "-c", _RESTORER, str(cold), str(n)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, **env},
    )
    p_out, p_err = parker.communicate(timeout=120)
    r_out, r_err = restorer.communicate(timeout=120)
    assert parker.returncode == 0, p_err
    assert restorer.returncode == 0, r_err
    assert p_out.count("ACK") == n
    assert f"RESTORED {n}" in r_out


def test_bad_calls_are_typed_and_lose_nothing(tmp_path: Path) -> None:
    from stratastore import StrataError

    cfg = {"ram_mib": 1, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation("a", 40, 0)
        with pytest.raises(StrataError, match="K/V is 100 bytes"):
            store.park(conv, kv[:100])
        with pytest.raises(StrataError, match="K/V is"):
            store.save_session("s", conv.tokens, kv[:10])
        store.park(conv, kv.copy())
        with pytest.raises(StrataError, match="destination holds"):
            store.restore(conv.tokens, np.zeros(10, np.uint8))
        with pytest.raises(ConfigError, match="token ids"):
            store.restore([-1], np.zeros(64, np.uint8))
        out = np.zeros_like(kv)
        assert store.restore(conv.tokens, out).tokens == 40 and np.array_equal(out, kv)


def test_restore_into_layer_and_paged_layouts_from_ram_and_disk(tmp_path: Path) -> None:
    from stratastore.restore import LayerKV, PagedKV

    free = [1 << 40]
    cfg = {
        "ram_mib": 1,
        "min_free_mib": 100,
        "park_min_free_mib": 10,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }
    with Store.open(FP, cfg, probe=lambda: free[0]) as store:
        a, kva = conversation("a", 64, 0)
        b, kvb = conversation("b", 64, 1000)
        store.park(a, kva.copy())
        free[0] = 50 * MIB
        store.park(b, kvb.copy())
        free[0] = 1 << 40
        for conv, kv in ((b, kvb), (a, kva)):
            flat = np.zeros_like(kv)
            k = [np.zeros((64, 2, 4), np.float16) for _ in range(2)]
            v = [np.zeros((64, 2, 4), np.float16) for _ in range(2)]
            pools = [np.zeros((2, 8, 16, 2, 4), np.float16) for _ in range(2)]
            r1 = store.restore(conv.tokens, LayerKV(FP, k, v))
            r2 = store.restore(conv.tokens, PagedKV(FP, pools, [3, 1, 6, 0]))
            r3 = store.restore(conv.tokens, flat)
            assert r1.tokens == r2.tokens == r3.tokens == 64
            page = flat[: 4 * FP.token_bytes].reshape(2, 2, 4, 16)  # first page: [L, K/V, p, row]
            assert np.array_equal(k[1][:4].view(np.uint8).reshape(4, 16), page[1, 0])
            assert np.array_equal(pools[0][1, 3, :4].view(np.uint8).reshape(4, 16), page[0, 1])
            assert np.array_equal(flat, kv)
