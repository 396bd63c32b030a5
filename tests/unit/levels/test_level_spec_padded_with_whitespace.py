"""A level spec (a directory or a URL) that begins or ends with whitespace (any Unicode space,
a tab, a line break) or a control character is refused with a ConfigError, wherever it is
given: a Store's directory settings and ``[[levels]]`` tables, a chunk store's levels,
``open_level``, and the CLI (``--config`` or a path argument). Such a URL has no scheme, so it
would pass for a relative path: the error showed its password, and with ``create_dirs`` a
directory ``./ redis:/alice:<password>@host:1`` was made and used. The error names the URL by
its scheme alone, and nothing is made on disk."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stratastore import ChunkLevel, ConfigError, LevelSpec, Store, StoreConfig
from stratastore.cli import main
from stratastore.levels import open_level
from tests.conftest import tiny_fp

SECRET = "s3cretZQ"
URL = f"redis://alice:{SECRET}@host:1/0"
#: what a pasted spec carries before or after it
PADS = [" ", "\t", "\n", "\r\n", "\u00a0", "\u2003", "\u3000", "\x00", "\x1b", "\ufeff", "\u200b"]
SPECS = [pad + URL for pad in PADS] + [URL + pad for pad in PADS] + [f" file://alice:{SECRET}@h/x"]


def _refused(build: Callable[[], Any], where: Path) -> str:
    """``build()`` raises a ConfigError that shows no credential, and makes nothing."""
    with pytest.raises(ConfigError) as e:
        build()
    text = str(e.value)
    assert SECRET not in text and "alice" not in text, text
    assert "whitespace or a control character" in text, text
    assert os.listdir(where) == [], f"something was made on disk: {os.listdir(where)}"
    return text


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: a relative path would be made here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("create_dirs", [False, True])
def test_a_store_refuses_a_padded_level_spec(here: Path, spec: str, create_dirs: bool) -> None:
    configs: list[dict[str, Any]] = [
        {"cold_dir": spec, "cold_mib": 8},
        {"cold_dir": str(here / "c"), "cold_mib": 8, "warm_dir": spec, "warm_mib": 8},
        {"spill_dir": spec, "disk_mib": 8},
        {"prompt_cache_dir": spec, "prompt_cache_mib": 8},
        {"levels": [{"name": "cold", "dir": spec, "mib": 8}]},
        {"levels": [{"name": "cold", "url": spec, "mib": 8}]},
    ]
    for values in configs:
        cfg = values | {"create_dirs": create_dirs}
        text = _refused(lambda cfg=cfg: Store.open(tiny_fp(), cfg), here)
        assert "://..." in text, text  # named by its scheme alone
        _refused(lambda values=values: StoreConfig(**values), here)
    _refused(lambda: LevelSpec("cold", spec, 8), here)


@pytest.mark.parametrize("spec", SPECS)
def test_a_chunk_store_refuses_a_padded_level_spec(here: Path, spec: str) -> None:
    _refused(lambda: ChunkLevel(spec, 1 << 20), here)
    _refused(lambda: open_level(spec, tiny_fp()), here)


def test_a_padded_path_is_refused_too(here: Path) -> None:
    """A path padded the same way is refused as well (shown as given: a path is no secret)."""
    for spec in (" cold", "cold\n", "\tcold"):
        text = _refused(
            lambda spec=spec: Store.open(
                tiny_fp(), {"cold_dir": spec, "cold_mib": 8, "create_dirs": True}
            ),
            here,
        )
        assert repr(spec) in text
        _refused(lambda spec=spec: ChunkLevel(spec, 1 << 20), here)


@pytest.mark.parametrize("spec", [" " + URL, "\t" + URL, URL + "\n", "\u00a0" + URL, "\x00" + URL])
@pytest.mark.parametrize("command", ["fsck", "inspect"])
def test_the_cli_refuses_a_padded_level_spec_cleanly(
    tmp_path: Path, spec: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "strata.toml"
    config.write_text(f"cold_dir = {json.dumps(spec)}\ncold_mib = 8\n")
    for argv in (["--config", str(config), command], [command, spec]):
        code = main(argv)
        got = capsys.readouterr()
        assert code == 2, (argv, got)
        assert "whitespace or a control character" in got.err, got.err
        assert "Traceback" not in got.err
        assert SECRET not in got.out + got.err and "alice" not in got.out + got.err
    assert sorted(os.listdir(tmp_path)) == ["strata.toml"]
