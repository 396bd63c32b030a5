"""The environment's switches: ``STRATA_PARK_TRUNCATE``, ``STRATA_RESTORE_LADDER`` and
``STRATA_BATCH_AGENDA`` override ``park_truncate``, ``ladder`` and ``batch_agenda`` when a Store
opens (``1/0``, ``true/false``, ``yes/no``, ``on/off``, any case), each change said once; any
other value is a ConfigError naming the variable; the config itself, and ``strata init --yes``,
never read them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import ConfigError, Store, StoreConfig
from stratastore.ops.installer import to_toml
from stratastore.restore import RestoreFailed
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
TB = FP.token_bytes
MIB = 1 << 20
SWITCHES = ("STRATA_PARK_TRUNCATE", "STRATA_RESTORE_LADDER", "STRATA_BATCH_AGENDA")


@pytest.fixture(autouse=True)
def no_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)


def truncating_store(said: list[str]) -> Store:
    """No disk level, and free RAM for 40 of a conversation's 96 tokens above the floor."""
    cfg = {"ram_mib": 1, "min_free_mib": 1, "park_truncate": False}
    return Store.open(FP, cfg, probe=lambda: MIB + 40 * TB, warn=said.append)


@pytest.mark.parametrize("value", ["1", "true", "YES", "On"])
def test_park_truncate_switched_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("STRATA_PARK_TRUNCATE", value)
    said: list[str] = []
    with truncating_store(said) as store:
        conv, kv = conversation_kv("a", 96, 0)
        rep = store.park(conv, kv.copy())
        assert (rep.where, rep.tokens) == ("ram", 32)  # the deepest checkpoint that fits
    (line,) = [m for m in said if "STRATA_" in m]
    assert line == f"STRATA_PARK_TRUNCATE={value} turns park_truncate on (the config says off)"


def test_without_the_switch_the_config_holds() -> None:
    said: list[str] = []
    with truncating_store(said) as store:
        conv, kv = conversation_kv("a", 96, 0)
        assert store.park(conv, kv).where == "discard"
    assert not [m for m in said if "STRATA_" in m]


def damaged_store(tmp_path: Path, ladder: bool, said: list[str]) -> tuple[Store, Any, Any]:
    cold = tmp_path / "cold"
    cfg = {
        "ram_mib": 0,
        "cold_dir": str(cold),
        "cold_mib": 64,
        "ladder": ladder,
        "create_dirs": True,
    }
    store = Store.open(FP, cfg, warn=said.append)
    conv, kv = conversation_kv("a", 96, 0, step=32)
    tokens = conv.tokens.copy()
    assert store.park(conv, kv.copy()).where == "disk"
    store.flush()
    for seg in (tmp_path / "cold").rglob("strata-conv-*.seg"):  # damage every segment's end
        raw = bytearray(seg.read_bytes())
        raw[-1] ^= 0xFF
        seg.write_bytes(bytes(raw))
    return store, tokens, kv


def test_the_ladder_switched_off_and_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_RESTORE_LADDER", "off")
    said: list[str] = []
    store, tokens, _ = damaged_store(tmp_path / "a", True, said)
    with store, pytest.raises(RestoreFailed):
        store.restore(tokens, np.zeros(len(tokens) * TB, np.uint8))
    assert "STRATA_RESTORE_LADDER=off turns ladder off (the config says on)" in said
    monkeypatch.setenv("STRATA_RESTORE_LADDER", "TRUE")
    said.clear()
    store, tokens, kv = damaged_store(tmp_path / "b", False, said)
    with store:
        out = np.zeros(len(tokens) * TB, np.uint8)
        r = store.restore(tokens, out)  # the valid prefix, not an error
        assert r.tokens < 96 and np.array_equal(out[: r.tokens * TB], kv[: r.tokens * TB])
    assert "STRATA_RESTORE_LADDER=TRUE turns ladder on (the config says off)" in said


def test_a_switch_that_agrees_with_the_config_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_RESTORE_LADDER", "yes")
    monkeypatch.setenv("STRATA_BATCH_AGENDA", "1")
    monkeypatch.setenv("STRATA_PARK_TRUNCATE", "no")
    said: list[str] = []
    Store.open(FP, {"ram_mib": 1}, warn=said.append).close()
    assert not [m for m in said if "STRATA_" in m]


def agenda_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_agenda: bool
) -> tuple[list[list[int]], list[str]]:
    """The wanted tokens of each call of the read agenda by one ``restore_many`` of three
    conversations on disk (96, 64 and 32 tokens), and what was said at open."""
    import stratastore.tiers.restore as flow

    said: list[str] = []
    cfg = {"ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, "create_dirs": True}
    calls: list[list[int]] = []
    real = flow.restore_batch

    def recorded(jobs: Any, **kw: Any) -> Any:
        calls.append([job.wanted for job in jobs])
        return real(jobs, **kw)

    monkeypatch.setattr(flow, "restore_batch", recorded)
    with Store.open(FP, {**cfg, "batch_agenda": batch_agenda}, warn=said.append) as store:
        convs = [conversation_kv(f"c{i}", n, 1000 * i) for i, n in enumerate((96, 64, 32))]
        for conv, kv in convs:
            store.park(conv, kv.copy())
        store.flush()
        prompts: list[npt.NDArray[Any]] = [np.asarray(c.tokens) for c, _ in convs]
        outs = [np.zeros(len(p) * TB, np.uint8) for p in prompts]
        got = store.restore_many(list(zip(prompts, outs, strict=True)))
        assert [r.tokens for r in got] == [96, 64, 32]
        for (_, kv), out in zip(convs, outs, strict=True):
            assert np.array_equal(out, kv)
    return calls, said


def test_the_batch_agenda_switched_off_reads_each_request_on_its_own_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, said = agenda_calls(tmp_path / "a", monkeypatch, True)
    assert calls == [[96, 64, 32]]  # one agenda for the three
    monkeypatch.setenv("STRATA_BATCH_AGENDA", "0")
    calls, said = agenda_calls(tmp_path / "b", monkeypatch, True)
    assert calls == [[96], [64], [32]]
    assert "STRATA_BATCH_AGENDA=0 turns batch_agenda off (the config says on)" in said
    monkeypatch.setenv("STRATA_BATCH_AGENDA", "on")
    calls, said = agenda_calls(tmp_path / "c", monkeypatch, False)
    assert calls == [[96, 64, 32]]
    assert "STRATA_BATCH_AGENDA=on turns batch_agenda on (the config says off)" in said


def test_batch_agenda_off_still_refuses_a_small_destination_before_anything_runs(
    tmp_path: Path,
) -> None:
    from stratastore import StrataError

    cfg = {"ram_mib": 0, "cold_dir": str(tmp_path), "cold_mib": 64, "batch_agenda": False}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation_kv("a", 64, 0)
        tokens = conv.tokens.copy()
        store.park(conv, kv)
        store.flush()
        ok = np.zeros(64 * TB, np.uint8)
        with pytest.raises(StrataError, match="needs room for all of them"):
            store.restore_many([(tokens, ok), (tokens, np.zeros(3 * TB, np.uint8))])
        assert not ok.any() and store.stats()["hits_disk"] == 0


@pytest.mark.parametrize("name", SWITCHES)
@pytest.mark.parametrize("value", ["maybe", "2", "", "enabled"])
def test_any_other_value_is_a_config_error_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    cfg = {"ram_mib": 1, "cold_dir": str(tmp_path / "cold"), "cold_mib": 4}
    with pytest.raises(ConfigError) as e:
        Store.open(FP, cfg)
    assert f"{name}={value!r}" in str(e.value)
    assert "1/0, true/false, yes/no or on/off" in str(e.value)
    assert not (tmp_path / "cold").exists(), "refused before any level is opened"


def test_the_config_and_strata_init_never_read_them(tmp_path: Path) -> None:
    env = {**os.environ, **dict.fromkeys(SWITCHES, "1"), "STRATA_RESTORE_LADDER": "0"}
    assert StoreConfig.from_mapping({}) == StoreConfig()
    out = tmp_path / "strata.toml"
    r = subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "init", "--yes", "--output", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text() == to_toml(StoreConfig())
