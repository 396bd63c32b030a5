"""A URL given where a directory belongs (``cold_dir``, ``warm_dir``, ``spill_dir``, a
``[[levels]]`` entry's ``dir``, ``prompt_cache_dir``) is a ConfigError that names it by its
scheme alone: no byte of its credential reaches an error, a ``repr``, a warning or the CLI's
output, with ``create_dirs`` on or off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stratastore import ConfigError, LevelSpec, Store, StoreConfig
from stratastore.cli import main
from tests.conftest import tiny_fp

SECRET = "s3cretZQ"
URL = f"redis://alice:{SECRET}@host:6379/0"
URLS = [URL, f"rediss://:{SECRET}@h:1/0", f"memory://{SECRET}", f"file://u:{SECRET}@h/x"]


def _shows_no_credential(text: str) -> None:
    assert SECRET not in text and "alice" not in text, text


def _flat(key: str, url: str) -> dict[str, Any]:
    budget = {"cold_dir": "cold_mib", "spill_dir": "disk_mib", "warm_dir": "warm_mib"}
    if key == "prompt_cache_dir":
        return {key: url, "prompt_cache_mib": 8}
    return {key: url, budget[key]: 8} | (
        {"cold_dir": "/c", "cold_mib": 8} if key == "warm_dir" else {}
    )


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("key", ["cold_dir", "warm_dir", "spill_dir", "prompt_cache_dir"])
@pytest.mark.parametrize("create_dirs", [False, True])
def test_a_url_in_a_directory_setting_is_a_config_error_without_its_credential(
    key: str, url: str, create_dirs: bool
) -> None:
    values = _flat(key, url) | {"create_dirs": create_dirs}
    for build in (lambda: StoreConfig.from_mapping(values), lambda: StoreConfig(**values)):
        with pytest.raises(ConfigError, match=r"not a (directory|local path)") as e:
            build()
        _shows_no_credential(str(e.value))


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("create_dirs", [False, True])
def test_a_url_as_a_level_dir_is_a_config_error_not_a_type_error(
    tmp_path: Path, url: str, create_dirs: bool
) -> None:
    said: list[str] = []
    cfg = {
        "create_dirs": create_dirs,
        "levels": [{"name": "cold", "dir": url, "mib": 8}],
    }
    with pytest.raises(ConfigError, match=r"levels\[0\] \('cold'\): dir=\w+://\.\.\.") as e:
        Store.open(tiny_fp(), cfg, warn=said.append)
    _shows_no_credential(str(e.value) + repr(said))
    with pytest.raises(ConfigError) as e:
        LevelSpec("cold", url, 8)
    _shows_no_credential(str(e.value))


@pytest.mark.parametrize(
    "values",
    [
        {"cold_dir": URL, "spill_dir": "/a", "cold_mib": 1},
        {"spill_dir": URL, "cold_dir": "/a", "cold_mib": 1},
        {"levels": [{"name": "cold", "dir": "/c", "mib": 1}], "cold_dir": URL},
        {"levels": [{"name": "cold", "dir": "/c", "mib": 1}], "spill_dir": URL},
    ],
)
def test_an_alias_conflict_shows_no_credential(values: dict[str, Any]) -> None:
    for build in (lambda: StoreConfig.from_mapping(values), lambda: StoreConfig(**values)):
        with pytest.raises(ConfigError) as e:
            build()
        _shows_no_credential(str(e.value))


def test_the_repr_of_a_config_shows_no_credential(tmp_path: Path) -> None:
    cfg = StoreConfig.from_mapping(
        {
            "prompt_cache_dir": f"file://{tmp_path}/pc",
            "prompt_cache_mib": 8,
            "levels": [
                {"name": "cold", "dir": str(tmp_path / "c"), "mib": 8},
                {
                    "name": "r",
                    "url": URL,
                    "mib": 8,
                    "settings": {"password": SECRET, "username": "alice"},
                },
            ],
        }
    )
    shown = repr(cfg) + str(cfg) + repr(cfg.specs) + repr(cfg.remote)
    _shows_no_credential(shown)
    assert f"file://{tmp_path}/pc" in shown and str(tmp_path / "c") in shown  # paths are shown


@pytest.mark.parametrize("command", ["fsck", "inspect", "monitor"])
def test_the_cli_shows_no_credential_of_a_url_given_as_a_directory(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "strata.toml"
    config.write_text(f'cold_dir = "{URL}"\ncold_mib = 8\n')
    for argv in (["--config", str(config), command], [command, URL]):
        code = main(argv)
        got = capsys.readouterr()
        assert code == 2, (argv, got)
        assert "URL" in got.err
        _shows_no_credential(got.out + got.err)


def test_no_settings_repr_shows_a_credential() -> None:
    """A URL given as any string setting (a TLS file, say) is shown by its scheme alone, and
    a credential not at all, in every repr that holds settings."""
    from stratastore.levels.redis.settings import RemoteSettings

    remote = RemoteSettings(f"rediss://alice:{SECRET}@h:1/0", tls_ca=URL, password=SECRET)
    cfg = StoreConfig.from_mapping(
        {
            "cold_dir": "/c",
            "cold_mib": 8,
            "remote_url": f"rediss://alice:{SECRET}@h:1/0",
            "remote_mib": 8,
            "remote_tls_ca": URL,
        }
    )
    assert cfg.remote is not None
    for text in (repr(remote), repr(cfg), repr(cfg.remote), repr(cfg.remote.settings)):
        _shows_no_credential(text)
    with pytest.raises(ConfigError) as e:
        StoreConfig(remote_url="redis://h:1/0", remote_mib=1, remote_eviction=URL)
    _shows_no_credential(str(e.value))
