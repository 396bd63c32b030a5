"""Bad operator input is one clear line: a CLI argument, a setting or a call argument that
cannot work is refused with a typed error naming it and the fix, never a traceback, a busy
loop or a silent surprise on the filesystem."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stratastore import ConfigError, ModelFingerprint, Store, StoreConfig
from stratastore.cli import main
from stratastore.format.errors import FormatError
from stratastore.levels.local import SegmentStore
from stratastore.ops.installer import to_toml
from tests.conftest import conversation_kv, tiny_fp


def _one_line_error(err: str) -> str:
    """The single ``strata: error: ...`` line of a user error (no traceback, no usage block)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("strata: error: "), err
    return lines[0]


@pytest.mark.parametrize("interval", ["-1", "0", "-0.5", "nan", "inf"])
def test_monitor_refuses_an_interval_that_is_not_a_positive_number(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    interval: str,
) -> None:
    SegmentStore.open(tmp_path / "cold", tiny_fp()).close()
    slept: list[float] = []

    def sleep(s: float) -> None:  # the live view would loop: stop it after two refreshes
        slept.append(s)
        if len(slept) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("time.sleep", sleep)
    assert main(["monitor", str(tmp_path / "cold"), "--interval", interval]) == 2
    assert slept == []  # refused before the first refresh
    line = _one_line_error(capsys.readouterr().err)
    assert f"--interval {interval}" in line and "positive" in line


def _cold(d: Path, **more: object) -> dict[str, object]:
    return {"ram_mib": 0, "cold_dir": str(d), "cold_mib": 4, **more}


def test_store_open_refuses_a_level_directory_under_a_missing_parent(tmp_path: Path) -> None:
    d = tmp_path / "nvme" / "strata"  # a disk not mounted at /nvme: no /nvme
    with pytest.raises(ConfigError) as e:
        Store.open(tiny_fp(), _cold(d))
    msg = str(e.value)
    assert "cold_dir" in msg and str(d) in msg and str(d.parent) in msg
    assert "create_dirs = true" in msg
    assert not d.parent.exists()  # nothing was made on the wrong filesystem
    levels = {
        "ram_mib": 0,
        "levels": [
            {"name": "off", "dir": str(tmp_path / "off"), "mib": 0},
            {"name": "fast", "dir": str(d), "mib": 4},
        ],
    }
    with pytest.raises(ConfigError, match=r"levels\[1\] \(fast\) dir=.*create_dirs = true"):
        Store.open(tiny_fp(), levels)
    assert not d.parent.exists()


def test_create_dirs_makes_the_missing_parents(tmp_path: Path) -> None:
    d = tmp_path / "nvme" / "strata"
    Store.open(tiny_fp(), _cold(d, create_dirs=True)).close()
    assert d.is_dir()


@pytest.mark.parametrize("exists", [True, False])
def test_a_level_directory_that_exists_or_whose_parent_does_opens(
    tmp_path: Path, exists: bool
) -> None:
    d = tmp_path / "cold"
    if exists:
        d.mkdir()
    Store.open(tiny_fp(), _cold(d)).close()
    assert d.is_dir()


def test_create_dirs_is_a_setting_off_by_default() -> None:
    assert StoreConfig().create_dirs is False
    assert "create_dirs = false" in to_toml(StoreConfig())  # strata init --yes: the default
    assert StoreConfig.from_toml_bytes(b"create_dirs = true\n").create_dirs is True
    with pytest.raises(ConfigError, match=r"create_dirs='yes' must be true or false"):
        StoreConfig.from_mapping({"create_dirs": "yes"})


def test_a_budget_larger_than_the_levels_volume_is_warned(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    volume_mib = st.f_blocks * st.f_frsize >> 20
    said: list[str] = []
    cfg = {
        "ram_mib": 0,
        "warm_dir": str(tmp_path / "warm"),
        "warm_mib": 4,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": volume_mib + 1,
    }
    Store.open(tiny_fp(), cfg, warn=said.append).close()
    (line,) = [m for m in said if "volume" in m]  # the cold level only: warm fits
    assert "cold_mib" in line and f"{volume_mib + 1:,} MiB" in line and str(tmp_path) in line
    said.clear()
    Store.open(tiny_fp(), {**cfg, "cold_mib": 4}, warn=said.append).close()
    assert not [m for m in said if "volume" in m]


def _level_config(tmp_path: Path) -> Path:
    SegmentStore.open(tmp_path / "cold", tiny_fp()).close()
    cfg = tmp_path / "strata.toml"
    cfg.write_text(f'cold_dir = "{tmp_path / "cold"}"\ncold_mib = 4\n')
    return cfg


@pytest.mark.parametrize("command", [["fsck"], ["conformance"], ["monitor", "--once", "--json"]])
def test_the_global_config_option_is_accepted_after_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    cfg = str(_level_config(tmp_path))
    assert main(["--config", cfg, *command]) == 0  # before the command, as always
    before = capsys.readouterr().out
    assert main([*command, "--config", cfg]) == 0
    assert capsys.readouterr().out.splitlines()[0] == before.splitlines()[0]


def test_the_config_given_after_the_command_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(_level_config(tmp_path))
    missing = str(tmp_path / "none.toml")
    assert main(["--config", missing, "fsck", "--config", cfg]) == 0
    assert main(["--config", cfg, "fsck", "--config", missing]) == 2
    assert "none.toml does not exist" in _one_line_error(capsys.readouterr().err)


def _warm_cold_root(tmp_path: Path) -> Path:
    """A store root (``strata demo --dir``'s layout: warm/ and cold/) with one conversation:
    its segments in warm, its chain manifest in cold (which holds no segment)."""
    root = tmp_path / "store"
    root.mkdir()
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "warm_dir": str(root / "warm"),
        "warm_mib": 64,
        "cold_dir": str(root / "cold"),
        "cold_mib": 64,
    }
    with Store.open(tiny_fp(), cfg) as store:
        conv, kv = conversation_kv("c", 48, 0)
        store.park(conv, kv)
        store.flush()
    (root / "strata.toml").write_text(to_toml(StoreConfig.from_mapping(cfg)))
    return root


@pytest.mark.parametrize("named", ["root", "config", "--config", "level"])
def test_inspect_takes_the_paths_fsck_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], named: str
) -> None:
    root = _warm_cold_root(tmp_path)
    warm, cold = str(root / "warm"), str(root / "cold")
    args = {
        "root": [str(root)],
        "config": [str(root / "strata.toml")],
        "--config": ["--config", str(root / "strata.toml")],
        "level": [warm],
    }[named]
    assert main(["fsck", *args]) == 0  # fsck accepts it ...
    capsys.readouterr()
    assert main(["inspect", *args, "--json"]) == 0  # ... and so does inspect
    doc = json.loads(capsys.readouterr().out)
    assert doc["levels"] == ([warm] if named == "level" else [warm, cold])
    assert doc["entries"] == 3 == len(doc["segments"])  # 3 segments, all in warm
    assert {s["level"] for s in doc["segments"]} == {warm}
    assert main(["inspect", *args]) == 0
    out = capsys.readouterr().out
    assert f"{warm}: 3 segments" in out
    assert (f"{cold}: 0 segments" in out) == (named != "level")


_GEOMETRY = {"n_layers": 2, "n_kv_heads": 2, "head_dim": 4, "page_tokens": 4}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"extra": "rope=yarn"}, "extra"),
        ({"extra": 7}, "extra"),
        ({"model_id": b"org/model"}, "model_id"),
        ({"model_id": None}, "model_id"),
        ({"n_layers": "32"}, "n_layers"),
        ({"n_kv_heads": 2.0}, "n_kv_heads"),
        ({"head_dim": True}, "head_dim"),
        ({"page_tokens": None}, "page_tokens"),
        ({"dtype": 1}, "dtype"),
        ({"dtype": None}, "dtype"),
    ],
)
def test_fingerprint_create_refuses_an_argument_of_the_wrong_type(
    args: dict[str, object], named: str
) -> None:
    call = {"model_id": "org/model", **_GEOMETRY, **args}
    with pytest.raises(FormatError) as e:
        ModelFingerprint.create(**call)  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg.startswith(f"ModelFingerprint.create: {named}=") and " must be " in msg, msg


def test_fingerprint_create_takes_what_its_types_say() -> None:
    import numpy as np

    base = ModelFingerprint.create("org/model", **_GEOMETRY, extra=b"rope=yarn")
    same = ModelFingerprint.create(
        "org/model",
        n_layers=np.int64(2),
        n_kv_heads=2,
        head_dim=4,
        page_tokens=4,
        extra=bytearray(b"rope=yarn"),
    )
    assert same == base and type(same.n_layers) is int
    assert ModelFingerprint.create("org/model", **_GEOMETRY, dtype="bfloat16").dtype.itemsize == 2
