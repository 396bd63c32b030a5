"""A configuration in sections: each level a ``[[levels]]`` table with its directory or URL, its
budget, its age limit and its own settings table (the Redis settings belong to the Redis level);
the flat names (``warm_dir``, ``cold_mib``, ``spill_dir``, ``remote_url``, ``remote_*``) are
aliases folded into the levels when parsed, held once, read back as properties, and a conflict
between two names of one setting is a ConfigError."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from stratastore import ConfigError, LevelSpec, StoreConfig
from stratastore.levels.redis.settings import RemoteSettings
from stratastore.ops.installer import to_toml

SECRET = "S3ctions-canary-pw"
SECTIONS = b"""
ram_mib = 1024

[[levels]]
name = "warm"
dir = "/nvme/strata"
mib = 64

[[levels]]
name = "cold"
dir = "/hdd/strata"
mib = 512
max_age_s = 3600

[[levels]]
name = "remote"
url = "rediss://redis.internal:6380/0"
mib = 256

[levels.settings]
name = "llama-prod"
timeout_ms = 1500
part_mib = 8
keep_local = false
tls_ca = "/etc/strata/ca.pem"
"""
FLAT = {
    "ram_mib": 1024,
    "warm_dir": "/nvme/strata",
    "warm_mib": 64,
    "cold_dir": "/hdd/strata",
    "cold_mib": 512,
    "cold_max_age_s": 3600,
    "remote_url": "rediss://redis.internal:6380/0",
    "remote_mib": 256,
    "remote_name": "llama-prod",
    "remote_timeout_ms": 1500,
    "remote_part_mib": 8,
    "remote_keep_local": False,
    "remote_tls_ca": "/etc/strata/ca.pem",
}
#: a file as `strata init` wrote it before the levels were sections: every setting flat
OLD_INIT_FILE = b"""
ram_mib = 8192
slots = 4
warm_dir = ""
warm_mib = 0
cold_dir = "/var/cache/strata"
cold_mib = 65536
when_full = "evict"
warm_max_age_s = 0
cold_max_age_s = 0
file_mode = 0o600
create_dirs = false
remote_url = ""
remote_name = "default"
remote_eviction = "store"
remote_mib = 0
remote_keep_local = true
remote_part_mib = 16
remote_timeout_ms = 5000
remote_username = ""
remote_password = ""
remote_tls_ca = ""
remote_tls_cert = ""
remote_tls_key = ""
"""


def test_the_redis_settings_belong_to_the_redis_level() -> None:
    cfg = StoreConfig.from_toml_bytes(SECTIONS)
    remote = cfg.remote
    assert remote is not None and remote.shared and remote.url.startswith("rediss://")
    assert remote.mib == 256 and remote.setting("timeout_ms") == 1500
    assert remote.setting("eviction") == "store"  # a setting not in the table: its default
    assert [lv.name for lv in cfg.disk_levels()] == ["warm", "cold"]  # not in the cascade
    assert [lv.name for lv in cfg.levels] == ["warm", "cold"]
    # the flat names read the levels
    assert (cfg.cold_dir, cfg.cold_mib, cfg.cold_max_age_s) == ("/hdd/strata", 512, 3600)
    assert (cfg.remote_url, cfg.remote_mib, cfg.remote_name) == (remote.url, 256, "llama-prod")
    assert (cfg.remote_timeout_ms, cfg.remote_part_mib, cfg.remote_keep_local) == (1500, 8, False)
    assert cfg.remote_tls_ca == "/etc/strata/ca.pem" and cfg.remote_username == ""


def test_the_flat_form_is_the_same_config_held_once() -> None:
    sections, flat = StoreConfig.from_toml_bytes(SECTIONS), StoreConfig.from_mapping(FLAT)
    assert flat == sections and hash(flat) == hash(sections)
    assert StoreConfig(**FLAT) == sections  # keyword arguments too
    held = {f.name for f in dataclasses.fields(StoreConfig)}
    assert not held & {*FLAT, "spill_dir", "disk_mib"} - {"ram_mib"}  # no flat field
    assert flat.levels == () and flat.specs == sections.specs  # the list as written
    assert RemoteSettings.from_config(flat, env={}) == RemoteSettings.from_config(sections, env={})


def test_a_file_written_by_the_flat_strata_init_still_loads() -> None:
    cfg = StoreConfig.from_toml_bytes(OLD_INIT_FILE)
    assert cfg == StoreConfig(cold_dir="/var/cache/strata", cold_mib=65536)
    assert cfg.remote is None and [lv.name for lv in cfg.disk_levels()] == ["cold"]
    assert StoreConfig.from_toml_bytes(to_toml(cfg).encode()) == cfg


def test_strata_init_writes_sections_that_read_back() -> None:
    cfg = StoreConfig.from_mapping(FLAT)
    text = to_toml(cfg)
    assert "warm_dir" not in text and "remote_url" not in text
    assert text.count("[[levels]]") == 3 and "[levels.settings]" in text
    assert StoreConfig.from_toml_bytes(text.encode()) == cfg
    assert "levels" not in to_toml(StoreConfig())  # the defaults: no level at all


@pytest.mark.parametrize(
    "cfg",
    [
        StoreConfig(cold_mib=5, cold_dir=""),  # a flat level that is off: an empty directory
        StoreConfig(warm_max_age_s=7, cold_dir="/c", cold_mib=1),
        StoreConfig(remote_name="ns-a"),  # remote settings without a URL
        StoreConfig(levels=[LevelSpec("a", "/a", 1)], remote_timeout_ms=9, remote_name="x"),
        StoreConfig(levels=[LevelSpec("m", url="memory://m", mib=2)]),
    ],
    ids=["off", "half-off", "remote-off", "list-and-flat-remote", "memory"],
)
def test_every_form_round_trips(cfg: StoreConfig) -> None:
    assert StoreConfig.from_mapping(cfg.to_mapping()) == cfg
    assert StoreConfig.from_toml_bytes(to_toml(cfg).encode()) == cfg
    assert dataclasses.replace(cfg, slots=2).specs == cfg.specs


def test_a_memory_level_is_a_disk_level_of_the_cascade() -> None:
    cfg = StoreConfig(
        levels=[
            {"name": "ram2", "url": "memory://x", "mib": 4},
            {"name": "cold", "dir": "/c", "mib": 8},
        ]
    )
    assert [lv.name for lv in cfg.disk_levels()] == ["ram2", "cold"] and cfg.remote is None
    assert cfg.level_settings(cfg.disk_levels()[0]) == {}


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"spill_dir": "/a", "cold_dir": "/b", "cold_mib": 1}, "spill_dir='/a' and cold_dir='/b'"),
        (
            {"levels": [{"name": "cold", "dir": "/c", "mib": 1}], "cold_dir": "/x"},
            r"cold_dir='/x' and levels\[0\] \(cold\) dir='/c'",
        ),
        (
            {"levels": [{"name": "r", "url": "redis://h:1/0", "mib": 1}], "remote_mib": 2},
            r"remote_mib=2 and levels\[0\] \(r\) mib=1",
        ),
        (
            {
                "levels": [
                    {"name": "r", "url": "redis://h:1/0", "mib": 1, "settings": {"timeout_ms": 10}}
                ],
                "remote_timeout_ms": 5000,
            },
            r"remote_timeout_ms=5000 and levels\[0\] \(r\) settings.timeout_ms=10",
        ),
        (
            {
                "levels": [
                    {
                        "name": "r",
                        "url": "redis://h:1/0",
                        "mib": 1,
                        "settings": {"password": SECRET},
                    }
                ],
                "remote_password": "other",
            },
            r"remote_password=<hidden> and levels\[0\] \(r\) settings.password=<hidden>",
        ),
    ],
)
def test_two_names_of_one_setting_with_different_values(values: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        StoreConfig.from_mapping(values)
    assert SECRET not in str(e.value)


def test_keyword_aliases_conflict_too() -> None:
    with pytest.raises(ConfigError, match="cold_dir='/b' and spill_dir='/a' name the same"):
        StoreConfig(cold_dir="/b", spill_dir="/a", cold_mib=1)
    redis = LevelSpec("r", url="redis://h:1/0", mib=1)
    with pytest.raises(ConfigError, match=r"remote_mib=3 and levels\[0\] \(r\) mib=1"):
        StoreConfig(levels=[redis], remote_mib=3)
    assert StoreConfig(levels=[redis], remote_mib=1).remote == redis  # agreeing: fine
    with pytest.raises(ConfigError, match=r"unknown setting .cold_dirr."):
        StoreConfig(cold_dirr="/c")


@pytest.mark.parametrize(
    ("level", "match"),
    [
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 1, "settings": {"timeout": 5}},
            "unknown setting 'timeout'; a Redis level's settings are name, username",
        ),
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 1, "settings": {"timeout_ms": 0}},
            r"levels\[0\] \(r\) settings.timeout_ms must be at least 1",
        ),
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 1, "settings": {"eviction": "lru"}},
            "eviction='lru' is not one of store, redis",
        ),
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 1, "settings": {"password": 5}},
            "settings.password=<hidden> must be a string",
        ),
        (
            {"name": "c", "dir": "/c", "mib": 1, "settings": {"timeout_ms": 5}},
            "unknown setting .timeout_ms.; a directory level.s settings are key_file, key_env",
        ),
        ({"name": "c", "dir": "/c", "url": "memory://c", "mib": 1}, "has dir and url"),
        ({"name": "c", "url": f"s3://u:{SECRET}@b", "mib": 1}, "s3://... names no level backend"),
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 0},
            r"levels\[0\] \(r\): setting url is set with settings.eviction=store but mib=0",
        ),
        (
            {"name": "r", "url": "redis://h:1/0", "mib": 4, "settings": {"eviction": "redis"}},
            r"levels\[0\] \(r\): setting mib=4 is not used with settings.eviction=redis",
        ),
        (
            {"name": "r", "url": f"redis://:{SECRET}@h:x/0", "mib": 1},
            r"levels\[0\] \(r\): setting remote_url=.* host:port",
        ),
    ],
)
def test_a_level_settings_table_is_checked(level: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        StoreConfig.from_mapping({"levels": [level]})
    assert SECRET not in str(e.value)


def test_one_remote_level_at_most() -> None:
    two = [
        {"name": "a", "url": "redis://h:1/0", "mib": 1},
        {"name": "b", "url": "redis+cluster://h:1,h:2", "mib": 1},
    ]
    with pytest.raises(ConfigError, match=r"levels\[0\] and levels\[1\] are both shared"):
        StoreConfig.from_mapping({"levels": two})


def test_level_settings_are_what_the_backend_opens_with(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = StoreConfig.from_mapping({**FLAT, "remote_password": SECRET, "file_mode": 0o640})
    remote = cfg.remote
    assert remote is not None
    kw = cfg.level_settings(remote)
    assert kw["password"] == SECRET and kw["timeout_s"] == 1.5 and kw["part_bytes"] == 8 << 20
    assert kw["budget_bytes"] == 256 << 20 and kw["keep_local"] is False
    assert RemoteSettings(remote.url, **kw) == RemoteSettings.from_config(cfg, env={})
    assert cfg.level_settings(cfg.disk_levels()[0]) == {"file_mode": 0o640}
    with pytest.raises(ValueError, match="not a level of this configuration"):
        cfg.level_settings(LevelSpec("x", "/x", 1))
    # credentials the config does not give come from the environment, then the URL
    monkeypatch.setenv("STRATA_REMOTE_PASSWORD", "from-env")
    plain = StoreConfig(remote_url="redis://h:1/0", remote_mib=1)
    assert RemoteSettings.from_config(plain).password == "from-env"
    assert RemoteSettings.from_config(cfg).password == SECRET


def test_credentials_are_never_shown() -> None:
    cfg = StoreConfig.from_mapping(
        {
            "levels": [
                {"name": "cold", "dir": "/c", "mib": 1},
                {
                    "name": "r",
                    "url": f"redis://bob:{SECRET}@h:1/0",
                    "mib": 1,
                    "settings": {"username": "alice", "password": SECRET},
                },
            ]
        }
    )
    shown = repr(cfg) + str(cfg) + repr(cfg.specs) + repr(cfg.remote)
    assert SECRET not in shown and "alice" not in shown and "bob" not in shown
    assert "redis://..." in shown  # the scheme alone


def test_setting_names_follow_how_the_config_was_written() -> None:
    flat = StoreConfig(cold_dir="/c", cold_mib=1)
    listed = StoreConfig(levels=[LevelSpec("warm", "/w", 1), LevelSpec("cold", "/c", 1)])
    assert flat.setting_name(flat.disk_levels()[0], "mib") == "cold_mib"
    assert listed.setting_name(listed.disk_levels()[1], "mib") == "levels[1] (cold) mib"
