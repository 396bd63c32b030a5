"""Settings a user can get wrong, and credentials in them: every mistake is a ConfigError that
names the setting, never shows a password, and never silently drops a value the user gave."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store, StoreConfig
from stratastore.cli import main
from stratastore.errors import ConfigError
from stratastore.format import Level
from stratastore.levels.registry import open_level
from tests.conftest import tiny_fp

SECRET = "s3cretZQ"
URL = f"redis://alice:{SECRET}@h:1/0"


def _refused(**kw: object) -> str:
    with pytest.raises(ConfigError) as e:
        StoreConfig(**kw)  # type: ignore[arg-type]
    return str(e.value)


def test_an_alias_conflict_with_a_levels_url_hides_its_password() -> None:
    with pytest.raises(ConfigError) as e:
        StoreConfig.from_mapping(
            {
                "levels": [{"name": "r", "url": URL, "mib": 4}],
                "remote_url": "redis://alice:other@h:1/0",
            }
        )
    assert SECRET not in str(e.value) and "other" not in str(e.value)


@pytest.mark.parametrize(
    "levels",
    [
        {"name": "r", "url": URL, "mib": 4},  # [levels] written for [[levels]]
        [URL],
        [{"name": "r", "url": "redis://h:1/0", "mib": 4, "settings": SECRET}],
    ],
)
def test_a_malformed_levels_setting_names_its_type_not_its_value(levels: object) -> None:
    with pytest.raises(ConfigError) as e:
        StoreConfig.from_mapping({"levels": levels})
    assert SECRET not in str(e.value)


def test_a_memory_level_name_with_a_credential_is_refused_without_it() -> None:
    with pytest.raises(ConfigError) as e:
        open_level(f"memory://alice:{SECRET}@x", tiny_fp(), Level.COLD)
    assert SECRET not in str(e.value)


@pytest.mark.parametrize(
    "kw",
    [
        {"spill_dir": "/a", "cold_dir": "/b", "cold_mib": 1},
        {"cold_dir": "/b", "spill_dir": "/a", "cold_mib": 1},
        {"disk_mib": 5, "cold_mib": 1, "cold_dir": "/b"},
        {"cold_mib": 1, "disk_mib": 5, "cold_dir": "/b"},
    ],
)
def test_two_names_of_one_setting_with_different_values_are_refused_in_any_order(
    kw: dict[str, object],
) -> None:
    assert "same setting" in _refused(**kw)


def test_a_flat_keyword_that_disagrees_with_a_levels_entry_is_refused() -> None:
    cold = {"name": "cold", "dir": "/c", "mib": 1}
    assert "same setting" in _refused(levels=[cold], cold_mib=0)
    remote = {"name": "r", "url": "redis://h:1/0", "mib": 4, "settings": {"timeout_ms": 10}}
    assert "same setting" in _refused(levels=[cold, remote], remote_timeout_ms=5000)
    same = StoreConfig(levels=[cold], cold_mib=1, cold_dir="/c")  # agreeing names are fine
    assert same.cold_mib == 1


def test_an_unknown_keyword_is_a_config_error_naming_it() -> None:
    assert "colddir" in _refused(colddir="/x")


def test_a_memory_level_in_front_of_a_directory_level_is_on(tmp_path: Path) -> None:
    fp = tiny_fp()
    cfg = {
        "ram_mib": 1,
        "park": "disk",
        "levels": [
            {"name": "m", "url": "memory://scratch", "mib": 8},
            {"name": "cold", "dir": str(tmp_path / "cold"), "mib": 8},
        ],
    }
    said: list[str] = []
    with Store.open(fp, cfg, warn=said.append) as store:
        store.park(
            Conversation("c", np.arange(8), [Checkpoint(8)]), np.zeros(8 * fp.token_bytes, np.uint8)
        )
        store.flush()
        assert store.lookup(np.arange(9)) == ("disk", 8)
    assert not [s for s in said if "is OFF" in s], said


def test_the_cli_never_takes_a_memory_level_for_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cold = tmp_path / "cold"
    (tmp_path / "strata.toml").write_text(
        '[[levels]]\nname = "m"\nurl = "memory://scratch"\nmib = 8\n\n'
        f'[[levels]]\nname = "cold"\ndir = "{cold}"\nmib = 8\n'
    )
    cold.mkdir()
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    main(["--config", str(tmp_path / "strata.toml"), "fsck"])
    out = capsys.readouterr().out
    assert str(here) not in out and os.fspath(cold) in out
