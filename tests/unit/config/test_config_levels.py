"""The disk levels are an ordered list (``levels``); the flat ``warm_*``/``cold_*`` (and
``spill_dir``/``disk_mib``) settings stay as aliases with the same defaults, so every existing
config reads as before; the list is validated, round-trips through a mapping and TOML, and the
sidecar level byte (spec F-SC-5) a level writes stays what 1.x wrote."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stratastore import ConfigError
from stratastore.config import MAX_LEVELS, MAX_SETTING, LevelSpec, StoreConfig, level_byte
from stratastore.format.sidecar import Level
from stratastore.ops.installer import to_toml

WARM = {"name": "warm", "dir": "/nvme/strata", "mib": 65536}
COLD = {"name": "cold", "dir": "/hdd/strata", "mib": 1048576, "max_age_s": 2592000}
WARM_COLD_TOML = b"""
[[levels]]
name = "warm"
dir = "/nvme/strata"
mib = 65536
[[levels]]
name = "cold"
dir = "/hdd/strata"
mib = 1048576
max_age_s = 2592000
"""
THREE = (LevelSpec("a", '/x "y"', 1), LevelSpec("b", "/b", 0, 7), LevelSpec("cold", "/c", 2))


def test_defaults_have_no_disk_level() -> None:
    cfg = StoreConfig()
    assert cfg.levels == () and cfg.disk_levels() == ()
    assert StoreConfig.from_mapping({}) == cfg == StoreConfig.from_mapping({"levels": []})
    assert "levels" not in to_toml(cfg)  # strata init --yes writes exactly what it wrote before


def test_flat_settings_derive_the_list_as_before() -> None:
    cfg = StoreConfig.from_mapping(
        {"warm_dir": "/w", "warm_mib": 10, "warm_max_age_s": 60, "cold_dir": "/c", "cold_mib": 20}
    )
    assert cfg.levels == ()  # nothing given as a list: the flat settings are the truth
    assert cfg.disk_levels() == (LevelSpec("warm", "/w", 10, 60), LevelSpec("cold", "/c", 20))
    assert StoreConfig(cold_dir="/c", cold_mib=20).disk_levels() == (LevelSpec("cold", "/c", 20),)
    assert StoreConfig(warm_dir="/w", warm_mib=10).disk_levels() == (LevelSpec("warm", "/w", 10),)
    off = StoreConfig.from_mapping(
        {"warm_dir": "/w", "warm_mib": 0, "cold_dir": "/c", "cold_mib": 20}
    )
    assert [lv.name for lv in off.disk_levels()] == ["cold"]  # a level is on only with both


def test_spill_dir_and_disk_mib_name_the_cold_level() -> None:
    cfg = StoreConfig.from_mapping({"spill_dir": "/d", "disk_mib": 100})
    assert cfg.disk_levels() == (LevelSpec("cold", "/d", 100),)
    listed = StoreConfig.from_mapping({"levels": [COLD], "spill_dir": "/hdd/strata"})
    assert listed.cold_dir == "/hdd/strata"
    with pytest.raises(ConfigError, match=r"spill_dir='/x'.*levels\[0\] \(cold\) dir"):
        StoreConfig.from_mapping({"levels": [COLD], "spill_dir": "/x"})


def test_the_levels_toml_example() -> None:
    cfg = StoreConfig.from_toml_bytes(WARM_COLD_TOML)
    assert cfg.disk_levels() == (
        LevelSpec("warm", "/nvme/strata", 65536),
        LevelSpec("cold", "/hdd/strata", 1048576, 2592000),
    )
    # old code reading the flat settings reads the list's warm and cold entries
    assert (cfg.warm_dir, cfg.warm_mib, cfg.warm_max_age_s) == ("/nvme/strata", 65536, 0)
    assert (cfg.cold_dir, cfg.cold_mib, cfg.cold_max_age_s) == ("/hdd/strata", 1048576, 2592000)
    assert cfg.warm_on and cfg.cold_on


def test_three_levels_and_names_of_ones_own() -> None:
    levels = [
        {"name": "nvme", "dir": "/a", "mib": 1},
        {"name": "ssd", "dir": "/b", "mib": 2},
        {"name": "hdd-0", "dir": "/c", "mib": 3, "max_age_s": 9},
    ]
    cfg = StoreConfig.from_mapping({"levels": levels})
    assert [lv.name for lv in cfg.disk_levels()] == ["nvme", "ssd", "hdd-0"]
    assert not cfg.warm_on and not cfg.cold_on and cfg.warm_dir == cfg.cold_dir == ""
    three = StoreConfig.from_mapping(
        {"levels": [WARM, {"name": "mid", "dir": "/m", "mib": 5}, COLD]}
    )
    assert [lv.name for lv in three.disk_levels()] == ["warm", "mid", "cold"]
    assert three.warm_dir == "/nvme/strata" and three.cold_dir == "/hdd/strata"
    off = StoreConfig.from_mapping({"levels": [WARM, {"name": "mid", "dir": "/m", "mib": 0}]})
    assert [lv.name for lv in off.disk_levels()] == ["warm"]  # mib = 0 keeps a level off


def test_built_in_python_from_specs_or_mappings() -> None:
    spec = StoreConfig(levels=(LevelSpec(**WARM), LevelSpec(**COLD)))
    mapped = StoreConfig(levels=[WARM, COLD])  # type: ignore[arg-type]
    assert spec == mapped and isinstance(mapped.levels, tuple)
    assert mapped == StoreConfig.from_toml_bytes(WARM_COLD_TOML)
    hash(mapped)  # still a frozen, hashable record
    assert dataclasses.replace(mapped, ram_mib=1).disk_levels() == mapped.disk_levels()


def test_list_with_agreeing_flat_settings() -> None:
    cfg = StoreConfig.from_mapping(
        {
            "levels": [WARM, COLD],
            "warm_dir": "/nvme/strata",
            "warm_mib": 65536,
            "cold_max_age_s": 2592000,
        }
    )
    assert cfg == StoreConfig.from_toml_bytes(WARM_COLD_TOML)
    # a flat setting of a level the list does not have, at its default, agrees (it is off)
    assert StoreConfig.from_mapping({"levels": [COLD], "warm_dir": "", "warm_mib": 0}).levels


@pytest.mark.parametrize(
    ("flat", "match"),
    [
        ({"cold_mib": 5}, r"cold_mib=5 and levels\[1\] \(cold\) mib=1048576"),
        ({"disk_mib": 5}, r"disk_mib=5 and levels\[1\] \(cold\) mib=1048576"),
        ({"warm_dir": "/x"}, r"warm_dir='/x' and levels\[0\] \(warm\) dir='/nvme/strata'"),
        ({"cold_max_age_s": 0}, r"cold_max_age_s=0 and levels\[1\] \(cold\) max_age_s=2592000"),
        ({"warm_mib": 0}, r"warm_mib=0 and levels\[0\] \(warm\) mib=65536"),
    ],
)
def test_list_with_a_conflicting_flat_setting_names_both(flat: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match + ".*keep one"):
        StoreConfig.from_mapping({"levels": [WARM, COLD], **flat})


def test_flat_setting_of_a_level_the_list_lacks() -> None:
    with pytest.raises(
        ConfigError,
        match=r"cold_dir='/c' names the cold level.*no level named "
        r"'cold'.*add it to levels, or remove cold_dir",
    ):
        StoreConfig.from_mapping({"levels": [WARM], "cold_dir": "/c", "cold_mib": 3})
    with pytest.raises(ConfigError, match=r"cold_mib=3 and levels\[1\] \(cold\) mib="):
        StoreConfig(levels=(LevelSpec(**WARM), LevelSpec(**COLD)), cold_mib=3)


@pytest.mark.parametrize(
    ("level", "match"),
    [
        ({"name": "", "dir": "/a", "mib": 1}, r"levels\[0\] \(''\): name='' must be a non-empty"),
        ({"name": "Warm", "dir": "/a", "mib": 1}, "name='Warm' must be a non-empty name of a-z"),
        ({"name": "a b", "dir": "/a", "mib": 1}, "name='a b'"),
        ({"name": 3, "dir": "/a", "mib": 1}, "name=3"),
        ({"dir": "/a", "mib": 1}, r"levels\[0\] has no name"),
        ({"name": "a", "dir": "", "mib": 1}, "dir='' must be a non-empty string"),
        ({"name": "a", "dir": 7, "mib": 1}, "dir=7 must be a non-empty string"),
        ({"name": "a", "dir": "/a", "mib": -1}, r"mib=-1 must be an integer in 0\.\."),
        ({"name": "a", "dir": "/a", "mib": MAX_SETTING + 1}, "mib=1099511627777 must be"),
        ({"name": "a", "dir": "/a", "mib": "64G"}, "mib='64G' must be an integer"),
        ({"name": "a", "dir": "/a", "mib": True}, "mib=True must be an integer"),
        ({"name": "a", "dir": "/a", "mib": 1, "max_age_s": -5}, "max_age_s=-5 must be"),
        ({"name": "a", "dir": "/a", "mib": 1, "size": 2}, r"levels\[0\]: unknown key 'size'"),
        ({"name": "a", "dir": "/a", "mib": 1, "Mib": 2}, "a level has name, dir, mib, max_age_s"),
        ({"name": "a", "dir": "/a"}, r"levels\[0\] \('a'\) has dir but no mib.*set mib"),
        ({"name": "a", "mib": 1}, r"levels\[0\] \('a'\) has no dir.*set dir, or remove"),
        ({"name": "a"}, "has no dir.*set dir and mib"),
    ],
)
def test_a_bad_level_names_the_key(level: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StoreConfig.from_mapping({"levels": [level]})


def test_bad_lists() -> None:
    with pytest.raises(
        ConfigError, match=r"setting levels \(a str\) must be a list.*\[\[levels\]\]"
    ):
        StoreConfig.from_mapping({"levels": "/a"})
    with pytest.raises(ConfigError, match="must be a list"):  # TOML [levels]: one table
        StoreConfig.from_toml_bytes(b'[levels]\nname = "a"\ndir = "/a"\nmib = 1\n')
    with pytest.raises(ConfigError, match=r"levels\[1\] \(a int\) must be a level"):
        StoreConfig.from_mapping({"levels": [WARM, 5]})
    many = [{"name": f"l{i}", "dir": f"/{i}", "mib": 1} for i in range(MAX_LEVELS + 1)]
    assert len(StoreConfig.from_mapping({"levels": many[:MAX_LEVELS]}).disk_levels()) == 8
    with pytest.raises(ConfigError, match="levels has 9 levels; at most 8"):
        StoreConfig.from_mapping({"levels": many})


def test_duplicate_names_and_directories() -> None:
    with pytest.raises(ConfigError, match=r"levels\[0\] and levels\[1\] are both named 'warm'"):
        StoreConfig.from_mapping({"levels": [WARM, {**COLD, "name": "warm"}]})
    with pytest.raises(
        ConfigError,
        match=r"levels\[0\] \(warm\) and levels\[1\] \(cold\) name "
        "one directory '/nvme/strata/'.*a directory of its own",
    ):
        StoreConfig.from_mapping({"levels": [WARM, {**COLD, "dir": "/nvme/strata/"}]})


def test_level_spec_checks_itself() -> None:
    assert LevelSpec("a", "/a", 0).on is False and LevelSpec("a", "/a", 1).on
    with pytest.raises(ConfigError, match="level 'a': dir='' must be"):
        LevelSpec("a", "", 1)
    with pytest.raises(ConfigError, match="level 'A'"):
        LevelSpec("A", "/a", 1)


@pytest.mark.parametrize(
    "cfg",
    [
        StoreConfig(),
        StoreConfig(cold_dir="/c", cold_mib=3, warm_dir="/w", warm_mib=1, warm_max_age_s=5),
        StoreConfig.from_toml_bytes(WARM_COLD_TOML),
        StoreConfig(levels=THREE, park="disk"),
    ],
    ids=["defaults", "flat", "warm-cold", "three"],
)
def test_round_trips(cfg: StoreConfig) -> None:
    mapping = cfg.to_mapping()
    assert mapping["levels"] == tuple(lv.to_mapping() for lv in cfg.levels)
    assert StoreConfig.from_mapping(mapping) == cfg
    assert StoreConfig.from_toml_bytes(to_toml(cfg).encode()) == cfg


def test_level_byte_is_what_1x_writers_wrote() -> None:
    """F-SC-5: warm 1, cold 2, with or without the other; a list's first level of two or more
    is 1, every later level 2; a lone level is 1 only when named warm."""
    pair = [level_byte(i, 2, n) for i, n in enumerate(("warm", "cold"))]
    assert pair == [Level.WARM, Level.COLD]
    assert level_byte(0, 1, "warm") is Level.WARM  # warm only: tiers writes Level.WARM
    assert level_byte(0, 1, "cold") is Level.COLD  # cold only (spill_dir): Level.COLD
    assert level_byte(0, 1, "nvme") is Level.COLD
    assert [level_byte(i, 3, "x") for i in range(3)] == [Level.WARM, Level.COLD, Level.COLD]
    with pytest.raises(ValueError, match=r"not in 0\.\.1"):
        level_byte(2, 2, "cold")
