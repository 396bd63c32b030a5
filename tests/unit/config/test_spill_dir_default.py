"""The cold level's default directory: a budget alone (``cold_mib``, or a ``[[levels]]`` table
named ``cold`` with ``mib`` and no ``dir``) keeps the level in the user's cache directory
(``$XDG_CACHE_HOME/stratastore``, else ``~/.cache/stratastore``), made with its parents and named
once at open; an explicit empty directory still turns the level off; the warm level has none."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import ConfigError, Store, StoreConfig
from stratastore.cli import main
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()
TB = FP.token_bytes


def said_of_the_directory(said: list[str]) -> list[str]:
    return [m for m in said if "no directory" in m]


def parked_and_restored(store: Store) -> None:
    conv, kv = conversation_kv("a", 64, 0)
    tokens = conv.tokens.copy()
    assert store.park(conv, kv.copy()).where == "disk"
    store.flush()
    out = np.zeros(len(tokens) * TB, np.uint8)
    r = store.restore(tokens, out)
    assert (r.source, r.tokens) == ("disk", 64) and np.array_equal(out, kv)


def test_a_budget_alone_keeps_the_cold_level_under_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "xdg" / "cache"  # neither exists yet: both are made
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    said: list[str] = []
    with Store.open(FP, {"cold_mib": 16, "ram_mib": 0}, warn=said.append) as store:
        level = store.stats()["levels"]["cold"]
        assert level["dir"] == str(cache / "stratastore") and level["budget"] == 16 << 20
        parked_and_restored(store)
    (line,) = said_of_the_directory(said)  # once, naming the directory and the setting
    assert str(cache / "stratastore") in line and "cold_dir" in line and "cold_mib=16" in line
    assert not [m for m in said if "OFF" in m]
    with Store.open(FP, {"cold_mib": 16, "ram_mib": 0}, warn=lambda m: None) as store:
        assert store.lookup(np.arange(64)) == ("disk", 64)  # the same place, opened again


@pytest.mark.parametrize("xdg", [None, "", "relative/cache"], ids=["unset", "empty", "relative"])
def test_without_xdg_cache_home_it_is_under_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xdg: str | None
) -> None:
    home = tmp_path / "home"  # no ~/.cache yet
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    said: list[str] = []
    with Store.open(FP, StoreConfig(cold_mib=8, ram_mib=0), warn=said.append) as store:
        assert store.stats()["levels"]["cold"]["dir"] == str(home / ".cache" / "stratastore")
        parked_and_restored(store)
    assert len(said_of_the_directory(said)) == 1
    assert not (tmp_path / "relative").exists()


def test_an_explicit_empty_directory_still_turns_the_level_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for cfg in ({"cold_dir": "", "cold_mib": 16}, {"spill_dir": "", "disk_mib": 16}):
        said: list[str] = []
        with Store.open(FP, cfg, warn=said.append, probe=lambda: 1 << 40) as store:
            assert "cold" not in store.stats()["levels"]
        assert any("cold level is OFF" in m for m in said) and not said_of_the_directory(said)
    assert not (tmp_path / "cache").exists()


def test_a_levels_table_named_cold_with_a_budget_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "strata.toml"
    path.write_text(
        f'ram_mib = 0\n\n[[levels]]\nname = "warm"\ndir = "{tmp_path / "warm"}"\nmib = 4\n\n'
        '[[levels]]\nname = "cold"\nmib = 16\n'
    )
    said: list[str] = []
    with Store.open(FP, str(path), warn=said.append) as store:
        levels = store.stats()["levels"]
        assert levels["cold"]["dir"] == str(tmp_path / "cache" / "stratastore")
        assert levels["warm"]["dir"] == str(tmp_path / "warm")
    (line,) = said_of_the_directory(said)
    assert "levels[1] (cold) dir" in line
    # the operator's commands read the same config and find the same directory
    assert main(["--config", str(path), "fsck"]) == 0


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"warm_mib": 4, "cold_mib": 16}, "warm_dir"),
        ({"levels": [{"name": "warm", "mib": 4}]}, r"levels\[0\] \('warm'\) has no dir"),
    ],
)
def test_the_warm_level_has_no_default_directory(
    values: dict[str, object], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=named):
        Store.open(FP, values)
    assert not (tmp_path / "cache").exists()


def test_no_cache_directory_to_default_to_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")  # no home directory: nowhere to default to
    monkeypatch.setattr("os.path.expanduser", lambda p: p)
    with pytest.raises(ConfigError, match=r"cold_mib.*set the cold level's directory"):
        Store.open(FP, {"cold_mib": 16})
