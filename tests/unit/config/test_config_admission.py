"""Settings (aliases, conflicts, types, TOML) and the admission rule (the two RAM floors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratastore import ConfigError
from stratastore.config import StoreConfig
from stratastore.tiers import Admission, admit

MIB = 1 << 20


def test_defaults_are_ram_only_with_everything_opt_in_off() -> None:
    cfg = StoreConfig()
    assert (cfg.park, cfg.min_free_mib, cfg.park_min_free_mib) == ("ram", 2560, 512)
    assert not cfg.warm_on and not cfg.cold_on and not cfg.park_truncate
    assert cfg.retention == "lru" and cfg.when_full == "evict"
    assert StoreConfig.from_mapping({}) == cfg


def test_aliases_name_the_cold_level() -> None:
    cfg = StoreConfig.from_mapping({"spill_dir": "/d", "disk_mib": 100})
    assert cfg.cold_dir == "/d" and cfg.cold_mib == 100 and cfg.cold_on
    same = StoreConfig.from_mapping({"spill_dir": "/d", "cold_dir": "/d", "cold_mib": 100})
    assert same.cold_dir == "/d"


def test_two_names_with_different_values_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"cold_dir='/a' and spill_dir='/b'.*keep one"):
        StoreConfig.from_mapping({"cold_dir": "/a", "spill_dir": "/b"})
    with pytest.raises(ConfigError, match="disk_mib"):
        StoreConfig.from_mapping({"cold_mib": 1, "disk_mib": 2})


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"colddir": "/x"}, "unknown setting 'colddir'"),
        ({"park": "ssd"}, "park='ssd' is not one of ram, disk, auto"),
        ({"ram_mib": -1}, r"ram_mib=-1 must be an integer in 0\.\.1099511627776"),
        ({"ram_mib": "8G"}, "ram_mib='8G' must be an integer in 0"),
        ({"cold_mib": 1 << 41}, "cold_mib=2199023255552 must be an integer in 0"),
        ({"slots": 0}, "slots must be at least 1"),
        ({"park_truncate": "yes"}, "true or false"),
        ({"warm_dir": 3}, "string"),
        ({"when_full": "drop"}, "evict, reject"),
    ],
)
def test_bad_settings_name_the_key(values: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StoreConfig.from_mapping(values)


def test_a_level_is_on_only_with_dir_and_budget() -> None:
    assert not StoreConfig(warm_dir="/w").warm_on
    assert not StoreConfig(warm_mib=10).warm_on
    assert StoreConfig(warm_dir="/w", warm_mib=10).warm_on


def test_toml(tmp_path: Path) -> None:
    f = tmp_path / "strata.toml"
    f.write_text('cold_dir = "/var/lib/strata"\ncold_mib = 20480\npark = "auto"\n')
    cfg = StoreConfig.from_toml(str(f))
    assert cfg.cold_on and cfg.park == "auto"
    f.write_text("cold_dir = \n")
    with pytest.raises(ConfigError, match="cannot be read"):
        StoreConfig.from_toml(str(f))
    with pytest.raises(ConfigError, match="strata init"):
        StoreConfig.from_toml(str(tmp_path / "missing.toml"))


GIB = 1 << 30


@pytest.mark.parametrize(
    ("available_mib", "stays", "disk", "where", "floor"),
    [
        (10_000, True, True, "ram", "parking"),  # room beside the parking floor
        (3_000, True, True, "disk", "transient"),  # the floor fails: spill, do not discard
        (3_000, True, False, "discard", "none"),  # no disk level: nothing to spill to
        (2_000, True, True, "discard", "none"),  # neither floor holds
        (3_000, False, True, "disk", "transient"),  # a disk hit under the transient floor
        (10_000, False, True, "disk", "parking"),  # a disk hit never lands in RAM
    ],
)
def test_admission_rule(
    available_mib: int, stays: bool, disk: bool, where: str, floor: str
) -> None:
    need = 2 * GIB  # a 2 GiB snapshot; floors 2560 and 512 MiB
    p = admit(need, available_mib * MIB, 2560 * MIB, 512 * MIB, stays_in_ram=stays, disk=disk)
    assert (p.where, p.floor) == (where, floor)
    assert str(need // MIB) in p.describe().replace(",", "")


def test_admission_probe_is_injectable() -> None:
    free = [100 * GIB]
    adm = Admission(StoreConfig(), probe=lambda: free[0])
    assert adm.admit(GIB, stays_in_ram=True, disk=True).where == "ram"
    free[0] = GIB + 600 * MIB
    assert adm.admit(GIB, stays_in_ram=True, disk=True).where == "disk"
    free[0] = GIB
    assert adm.admit(GIB, stays_in_ram=True, disk=True).where == "discard"


def test_toml_bytes_refuses_oversized_and_undecodable_input() -> None:
    from stratastore.config import MAX_CONFIG_BYTES

    with pytest.raises(ConfigError, match="not a config file"):
        StoreConfig.from_toml_bytes(b"#" * (MAX_CONFIG_BYTES + 1), "big.toml")
    with pytest.raises(ConfigError, match=r"big\.toml cannot be read"):
        StoreConfig.from_toml_bytes(b"\xff\xfe ram_mib = 1", "big.toml")
    assert StoreConfig.from_toml_bytes(b"slots = 2\n").slots == 2
