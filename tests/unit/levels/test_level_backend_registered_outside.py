"""A level backend written outside the package: registered under a scheme of its own (by
``register_backend``, or found in the ``stratastore.levels`` entry-point group the first time a
spec names its scheme), configured as a ``[[levels]]`` entry with its own settings table checked
against the schema its row carries, and used as a Store's level: a park lands on it and a
restore reads it back. Nothing of the package is changed for it: everything is in this module.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from stratastore import ConfigError, Store, StoreConfig
from stratastore.cli import main
from stratastore.format import Level, ModelFingerprint
from stratastore.levels import (
    ENTRY_POINTS,
    BackendEntry,
    LevelContext,
    SegmentBackend,
    Setting,
    open_level,
    register_backend,
    unregister_backend,
)
from stratastore.levels.memory import MemoryBackend
from stratastore.levels.shared_check import NamespaceCheck, SharedLevelCheck
from tests.conftest import conversation_kv, tiny_fp

TOKEN = "tok-ZQXJ"  #: a credential of the toy level: never shown


class ToyBackend(MemoryBackend):
    """The shipped memory level under another name, remembering what it was opened with."""

    opened: ClassVar[list[ToyBackend]] = []

    def __init__(
        self, name: str, fingerprint: ModelFingerprint, level: Level, args: Mapping[str, Any]
    ) -> None:
        super().__init__(name, fingerprint, level)
        self.args = dict(args)
        ToyBackend.opened.append(self)


def open_toy(
    spec: str, fingerprint: ModelFingerprint, level: Level, args: Mapping[str, Any]
) -> SegmentBackend:
    return ToyBackend(spec.partition("://")[2] or "toy", fingerprint, level, args)


def toy_arguments(table: Mapping[str, Any], context: LevelContext) -> dict[str, Any]:
    return {"shelf": table["shelf"], "token": table["token"], "budget_mib": context.mib}


TOY = BackendEntry(
    "toy",
    open_toy,
    settings={
        s.key: s
        for s in (
            Setting("shelf", "top", choices=("top", "bottom")),
            Setting("token", "", secret=True),
        )
    },
    arguments=toy_arguments,
)


@pytest.fixture
def toy() -> Iterator[str]:
    register_backend("toy", TOY)
    ToyBackend.opened.clear()
    yield "toy"
    unregister_backend("toy")


def _config(tmp_path: Path, scheme: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "ram_mib": 0,
        "park": "disk",
        "levels": [
            {"name": "toy", "url": f"{scheme}://shelf-a", "mib": 8, "settings": dict(settings)},
            {"name": "cold", "dir": str(tmp_path / "cold"), "mib": 8},
        ],
    }


def _park_and_restore(tmp_path: Path, cfg: Mapping[str, Any]) -> None:
    fp = tiny_fp()
    conv, kv = conversation_kv("c", 32, 100, fp=fp)
    with Store.open(fp, cfg) as store:
        store.park(conv, kv)
        store.flush()
        (toy,) = ToyBackend.opened
        assert len(toy) > 0, "the park landed on the toy level"
        out = np.zeros(40 * fp.token_bytes, np.uint8)
        got = store.restore(np.arange(100, 140), out)
        assert got.tokens == 32 and got.source == "disk"
        assert np.array_equal(out[: kv.nbytes], kv)


def test_a_backend_registered_from_outside_is_a_store_level(toy: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, toy, {"shelf": "bottom", "token": TOKEN})
    _park_and_restore(tmp_path, cfg)
    (level,) = ToyBackend.opened
    assert level.args == {"shelf": "bottom", "token": TOKEN, "budget_mib": 8}
    assert level.path == "memory://shelf-a" and level.level == Level.WARM


def test_its_settings_are_checked_by_its_own_schema(toy: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown setting 'color'; a toy level's settings are"):
        StoreConfig.from_mapping(_config(tmp_path, toy, {"color": "red"}))
    with pytest.raises(ConfigError, match="shelf='middle' is not one of top, bottom"):
        StoreConfig.from_mapping(_config(tmp_path, toy, {"shelf": "middle"}))
    with pytest.raises(ConfigError, match=r"settings\.token=<hidden> must be a string"):
        StoreConfig.from_mapping(_config(tmp_path, toy, {"token": 5}))
    cfg = StoreConfig.from_mapping(_config(tmp_path, toy, {"token": TOKEN}))
    assert TOKEN not in repr(cfg) and "token=<hidden>" in repr(cfg)
    spec = cfg.disk_levels()[0]
    assert not spec.shared and cfg.level_settings(spec)["shelf"] == "top"  # the default


def test_a_scheme_is_served_once(toy: str) -> None:
    with pytest.raises(ConfigError, match="already served"):
        register_backend("toy", TOY)
    with pytest.raises(ConfigError, match="already served"):
        register_backend("redis", TOY, replace=True)
    with pytest.raises(ConfigError, match="not a lower-case URL scheme"):
        register_backend("Toy Box", TOY)
    register_backend("toy", TOY, replace=True)


def test_an_unknown_scheme_is_looked_up_in_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed, a backend is an entry point of ``stratastore.levels`` named by its scheme; it
    is loaded the first time a spec names that scheme, not before."""
    loaded: list[str] = []

    class EntryPoint:
        name, value, group = "toyep", "tests.toy:TOY", ENTRY_POINTS

        def load(self) -> Any:
            loaded.append(self.name)
            return lambda: TOY  # a callable that gives the row is taken too

    def entry_points(group: str) -> list[EntryPoint]:
        return [EntryPoint()] if group == ENTRY_POINTS else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    ToyBackend.opened.clear()
    try:
        assert not loaded
        _park_and_restore(tmp_path, _config(tmp_path, "toyep", {}))
        assert loaded == ["toyep"]
        open_level("toyep://again", tiny_fp()).close()
        assert loaded == ["toyep"]  # registered once found
    finally:
        unregister_backend("toyep")


def test_an_entry_point_that_gives_no_backend_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class EntryPoint:
        name, value, group = "broken", "tests.broken:NOTHING", ENTRY_POINTS

        def load(self) -> Any:
            return 42

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [EntryPoint()])
    with pytest.raises(ConfigError, match="gives a int, not a BackendEntry"):
        open_level("broken://x", tiny_fp())
    with pytest.raises(ConfigError, match=r"nowhere://\.\.\. names no backend"):
        open_level("nowhere://x", tiny_fp())


def test_fsck_of_a_shared_level_goes_through_its_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``strata fsck --remote`` checks the shared level of ``--config`` by its backend's
    ``fsck`` hook, whatever the backend; one without the hook is a usage error."""
    seen: list[tuple[str, dict[str, Any], bool, bool]] = []

    def fsck(url: str, args: Mapping[str, Any], repair: bool, deep: bool) -> SharedLevelCheck:
        seen.append((url, dict(args), repair, deep))
        bad = NamespaceCheck("toy/a/", "m", False, counts={"segments": 3, "lost": 1})
        return SharedLevelCheck("toyshared://host", "a", (bad,))

    shared = BackendEntry("toy shared", open_toy, shared=True, fsck=fsck)
    config = tmp_path / "strata.toml"
    config.write_text(
        f'[[levels]]\nname = "cold"\ndir = "{tmp_path / "c"}"\nmib = 8\n\n'
        '[[levels]]\nname = "remote"\nurl = "toyshared://host"\nmib = 8\n'
    )
    register_backend("toyshared", shared)
    try:
        assert main(["--config", str(config), "fsck", "--remote", "--deep"]) == 1
        assert seen == [("toyshared://host", {}, False, True)]
        out = capsys.readouterr().out
        assert "NOT CLEAN: toy/a/ (m): segments=3, lost=1, repaired=False" in out
        register_backend(
            "toyshared", BackendEntry("toy shared", open_toy, shared=True), replace=True
        )
        assert main(["--config", str(config), "fsck", "--remote"]) == 2
        assert "has no check of a shared level's store" in capsys.readouterr().err
    finally:
        unregister_backend("toyshared")


def test_a_backends_unreachable_error_exits_as_an_unreachable_level() -> None:
    """A backend's "cannot reach the level" error derives from LevelUnavailable, and the CLI
    gives it the unreachable level's exit code without knowing the backend."""
    from stratastore import LevelUnavailable, StrataError
    from stratastore.cli.exit_codes import ExitCode, exit_code
    from stratastore.levels.redis.client import RemoteError

    class ToyDown(LevelUnavailable):
        """toy://... did not answer."""

    assert exit_code(ToyDown("toy://shelf-a did not answer; start it")) is ExitCode.REMOTE
    assert (
        exit_code(ToyDown("toy://shelf-a"), "fsck") is ExitCode.USAGE
    )  # a check that could not run
    assert issubclass(RemoteError, LevelUnavailable) and issubclass(LevelUnavailable, StrataError)
    assert exit_code(RemoteError("read", "redis://h:1/0", "refused")) is ExitCode.REMOTE
