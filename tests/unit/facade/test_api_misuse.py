"""Misuse of the engine API and half-right settings: every error reaches the call that caused it,
typed, and nothing hangs.

Each test fails on the earlier code (a hang there fails by timeout, never stalls the
suite)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, ConfigError, Conversation, StoreConfig, StrataError
from stratastore.chain import as_tokens
from stratastore.facade import SpillError, Store, StoreClosed
from stratastore.format.naming import is_chain_name
from tests.conftest import run_with_timeout, tiny_fp

FP = tiny_fp()  # 64 bytes a token
ROOT = Path(__file__).resolve().parents[3]


def conv(cid: Any, n: int, base: int, **kw: Any) -> tuple[Conversation, np.ndarray]:
    """A conversation of ``n`` tokens in one segment, and its K/V."""
    c = Conversation(cid, as_tokens(np.arange(base, base + n)), [Checkpoint(n)], **kw)
    kv = np.random.default_rng(base).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return c, kv


def disk_cfg(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, **kw}


# -- item 6: errors belong to the call that caused them ----------------------------------------
def _failing_writes(store: Store, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0) -> None:
    def boom(snap: Any, **kw: Any) -> bool:
        time.sleep(delay)  # still pending when the engine's next call comes
        raise StrataError(f"injected: disk write of {snap.conv.conv_id} failed")

    monkeypatch.setattr(store._tiers.writer, "write", boom)


def test_a_background_write_error_is_raised_by_flush_not_by_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        _failing_writes(store, monkeypatch, delay=0.3)
        c, kv = conv("lost", 40, 0)
        assert store.park(c, kv).where == "disk"
        out = np.zeros(50 * FP.token_bytes, np.uint8)
        # a restore never waits for the write; its own park in flight is served from
        # the capture in memory, and the write's error is not the restore's
        r = store.restore(np.arange(0, 50), out)
        assert (r.source, r.tokens) == ("pending", 40)
        with pytest.raises(SpillError, match=r"'lost'.*injected") as e:
            store.flush()  # the engine's own call reports it
        assert [cid for cid, _ in e.value.failures] == ["lost"]
        assert store.lookup(np.arange(0, 50)) is None  # the write did not land
        assert store.stats()["spill_errors"] == 1
        store.flush()  # reported once: the next flush has nothing new to say
        monkeypatch.undo()


def test_close_reports_a_failure_no_flush_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(FP, disk_cfg(tmp_path))
    _failing_writes(store, monkeypatch)
    c, kv = conv("late", 40, 0)
    store.park(c, kv)
    store.lookup(np.arange(0, 10))  # raises nothing
    with pytest.raises(SpillError, match="'late'"):
        store.close()


def test_a_refused_background_write_is_reported_to_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        writer = store._tiers.writer

        def refuse(snap: Any, **kw: Any) -> bool:
            writer.last_refusal = "cold level is full and when_full=reject"
            return False

        monkeypatch.setattr(writer, "write", refuse)
        c, kv = conv("refused", 40, 0)
        assert store.park(c, kv).where == "disk"
        with pytest.raises(SpillError, match=r"'refused'.*when_full=reject"):
            store.flush()
        s = store.stats()
        assert s["spill_errors"] == 1 and s["spills_refused"] == 1 and s["discards"] == 1
        monkeypatch.undo()


@pytest.mark.parametrize(
    ("cid", "kw", "match"),
    [
        (7, {}, "must be a non-empty string"),
        ("bad\udc80id", {}, "cannot be encoded as UTF-8"),
        ("x" * 5000, {}, "over the 4,096-byte limit"),
        ("cut", {"cuts": [0, 30, 99]}, "cuts"),
    ],
)
def test_park_refuses_what_it_could_not_store_before_acknowledging(
    tmp_path: Path, cid: Any, kw: dict[str, Any], match: str
) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        with pytest.raises(ConfigError, match=match):  # InvalidConversation is a ConfigError
            c, kv = conv(cid, 40, 0, **kw)
            store.park(c, kv)
        store.flush()  # nothing was queued, nothing failed
        s = store.stats()
        assert s["parks_disk"] == 0 and s["spill_errors"] == 0
        names = os.listdir(tmp_path / "cold")
        assert not [n for n in names if n.startswith("strata-conv-") or is_chain_name(n)]


def test_park_refuses_a_kv_of_the_wrong_size(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        c, kv = conv("short", 40, 0)
        with pytest.raises(ConfigError, match="K/V is"):
            store.park(c, kv[:-64])


# -- item 7: sessions and conversations do not overwrite each other ----------------------------
def test_a_park_does_not_replace_a_session_of_the_same_name(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        s, skv = conv("shared-name", 40, 0)
        store.save_session("shared-name", s.tokens, skv)
        c, kv = conv("shared-name", 60, 500)
        with pytest.raises(ConfigError, match="session"):
            store.park(c, kv)
        store.flush()
        out = np.zeros(skv.size, np.uint8)
        got = store.load_session("shared-name", out)
        assert np.array_equal(got.tokens, s.tokens) and np.array_equal(out, skv)


def test_a_session_does_not_replace_a_parked_conversation(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        c, kv = conv("chat-1", 40, 0)
        keep = kv.copy()
        assert store.park(c, kv).where == "disk"
        store.flush()
        s, skv = conv("x", 60, 500)
        with pytest.raises(ConfigError, match="parked conversation"):
            store.save_session("chat-1", s.tokens, skv)
        out = np.zeros(41 * FP.token_bytes, np.uint8)
        r = store.restore(np.arange(0, 41), out)
        assert r.tokens == 40 and np.array_equal(out[: keep.size], keep)


# -- item 8: nothing hangs ---------------------------------------------------------------------
@pytest.mark.parametrize("how", ["same path", "symlink"])
def test_one_directory_for_warm_and_cold_is_refused(tmp_path: Path, how: str) -> None:
    real = tmp_path / "lvl"
    real.mkdir()
    warm = real
    if how == "symlink":
        warm = tmp_path / "alias"
        warm.symlink_to(real)
    cfg = {"warm_dir": str(warm), "warm_mib": 1, "cold_dir": str(real), "cold_mib": 64}

    def open_and_park() -> None:
        with Store.open(FP, cfg) as store:  # the old code opened, then locked itself
            for i in range(8):
                c, kv = conv(f"c{i}", 4000, i * 5000)
                store.park(c, kv)
            store.flush()

    with pytest.raises(ConfigError, match=r"warm_dir=.*cold_dir=.*same directory"):
        run_with_timeout(open_and_park, 20)


def test_calls_on_a_closed_store_raise_store_closed(tmp_path: Path) -> None:
    store = Store.open(FP, disk_cfg(tmp_path))
    store.close()
    store.close()  # a second close does nothing
    c, kv = conv("after", 40, 0)
    buf = np.zeros(50 * FP.token_bytes, np.uint8)
    calls: dict[str, Callable[[], Any]] = {
        "park": lambda: store.park(c, kv),
        "flush": store.flush,
        "restore": lambda: store.restore(np.arange(50), buf),
        "restore_many": lambda: store.restore_many([(np.arange(50), buf)]),
        "lookup": lambda: store.lookup(np.arange(50)),
        "save_session": lambda: store.save_session("s", c.tokens, kv),
        "load_session": lambda: store.load_session("s", buf),
        "delete_session": lambda: store.delete_session("s"),
    }
    for name, call in calls.items():
        with pytest.raises(StoreClosed, match=f"store is closed: {name}\\(\\)"):
            run_with_timeout(call, 5)


# -- item 9: honest reports --------------------------------------------------------------------
def test_a_park_a_full_reject_level_refuses_is_reported_a_discard(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path, cold_mib=1, when_full="reject")) as store:
        a, kva = conv("a", 9000, 0)  # ~0.6 MiB of a 1 MiB level
        assert store.park(a, kva).where == "disk"
        b, kvb = conv("b", 9000, 100_000)  # does not fit beside it, and the level rejects
        report = store.park(b, kvb)
        assert report.where == "discard" and report.tokens == 0
        store.flush()
        s = store.stats()
        assert s["parks_disk"] == 1 and s["discards"] == 1 and s["spill_errors"] == 0


def test_an_impossible_ram_mib_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ram_mib=1099511627776"):
        Store.open(FP, {"ram_mib": 1 << 40})


def test_ram_mib_over_the_address_space_limit_is_a_config_error() -> None:
    script = textwrap.dedent("""
        import resource
        from stratastore import ConfigError, Store
        from tests.conftest import tiny_fp
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        limit = vm + (512 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            Store.open(tiny_fp(), {"ram_mib": 4096})
        except ConfigError as e:
            print("CONFIG-ERROR:", e)
    """)
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    assert "CONFIG-ERROR:" in r.stdout and "ram_mib=4096" in r.stdout, r.stdout


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"cold_dir": "/srv/strata"}, "cold_mib"),
        ({"spill_dir": "/srv/strata"}, "cold_mib"),
        ({"warm_dir": "/fast", "cold_dir": "/srv", "cold_mib": 8}, "warm_mib"),
        ({"warm_mib": 100, "cold_dir": "/srv", "cold_mib": 8}, "warm_dir"),  # cold_mib has one
    ],
)
def test_a_half_configured_level_is_a_config_error(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        StoreConfig.from_mapping(values)


def test_a_level_switched_off_by_its_budget_is_said_loudly(tmp_path: Path) -> None:
    said: list[str] = []
    cfg = StoreConfig.from_mapping(
        {"cold_dir": str(tmp_path / "c"), "cold_mib": 0, "ram_mib": 1, "min_free_mib": 1}
    )
    with Store.open(FP, cfg, warn=said.append, probe=lambda: 1 << 40) as store:
        assert "cold" not in store.stats()["levels"]
    assert any("cold level is OFF" in m and "cold_mib" in m for m in said), said
