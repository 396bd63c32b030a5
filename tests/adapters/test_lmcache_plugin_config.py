"""The plugin's settings from LMCache's ``extra_config``: the one-directory shorthand (``dir`` +
``budget_mib``) or the chunk store's ``levels`` (inline, or in the TOML file ``strata_config``
names), ``when_full`` and ``name``; anything contradictory or unknown is a ConfigError naming the
key and the fix. A budget smaller than one chunk, on any level, would refuse every put (or stop
the cascade) for the life of the engine; the chunk size is known at start (``metadata.kv_shape``
x dtype), so it is a ConfigError naming the level's budget and the size needed. engine.md's YAML
with levels reads as documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
torch = pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

from stratastore.adapters.lmcache import PluginSettings, StrataStoragePlugin  # noqa: E402
from stratastore.errors import ConfigError  # noqa: E402


def engine_config(extra: dict[str, object]) -> LMCacheEngineConfig:
    """LMCache's config of an engine with the stratastore plugin and ``extra`` as its
    ``extra_config`` (no local CPU backend)."""
    return LMCacheEngineConfig.from_defaults(
        chunk_size=256,
        local_cpu=False,
        max_local_cpu_size=0.03,
        storage_plugins=["stratastore"],
        extra_config=extra,
    )


def big_chunks() -> LMCacheMetadata:
    """Metadata of 32 MiB chunks: 32 layers x 2 x 256 tokens x 8 heads x 128 x fp16."""
    return LMCacheMetadata(
        model_name="m",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float16,
        kv_shape=(32, 2, 256, 8, 128),
        chunk_size=256,
    )


def test_a_budget_below_one_chunk_is_a_config_error(tmp_path: Path) -> None:
    p = "storage_plugin.stratastore."
    cfg = engine_config(
        {
            p + "module_path": "stratastore.adapters.lmcache",
            p + "class_name": "StrataStoragePlugin",
            p + "dir": str(tmp_path / "d"),
            p + "budget_mib": 1,
        }
    )
    meta = big_chunks()  # a chunk of 32 MiB, over 1 MiB
    plugin = None
    try:
        with pytest.raises(ConfigError, match="budget_mib"):
            plugin = StrataStoragePlugin(config=cfg, metadata=meta, local_cpu_backend=None)
    finally:
        if plugin is not None:
            plugin.close()


# -- the chunk store's levels from LMCache's extra_config --------------------------------------
P = "storage_plugin.stratastore."
LOAD = {P + "module_path": "stratastore.adapters.lmcache", P + "class_name": "StrataStoragePlugin"}
LEVELS = [
    {"spec": "/nvme/strata-lmcache", "budget_gib": 100},
    {"spec": "redis://kv-cache:6379/0", "budget_bytes": 1 << 30, "settings": {"name": "lmc"}},
]


def settings(**given: object) -> PluginSettings:
    return PluginSettings.from_config({**LOAD, **{P + k: v for k, v in given.items()}}, None)


def test_levels_are_the_chunk_stores_first_to_last() -> None:
    s = settings(levels=LEVELS, when_full="reject", name="LMCache page", put_threads=2)
    assert [(lv.spec, lv.budget_bytes) for lv in s.chunks.levels] == [
        ("/nvme/strata-lmcache", 100 << 30),
        ("redis://kv-cache:6379/0", 1 << 30),
    ]
    assert s.chunks.levels[1].settings == {"name": "lmc"}
    assert (s.chunks.when_full, s.chunks.name, s.put_threads, s.read_threads) == (
        "reject",
        "LMCache page",
        2,
        4,
    )
    one = settings(dir="/x", budget_mib=3)  # the shorthand: one directory level
    assert [(lv.spec, lv.budget_bytes) for lv in one.chunks.levels] == [("/x", 3 << 20)]
    assert (one.chunks.when_full, one.chunks.name) == ("evict", "LMCache chunk")


def test_a_strata_config_file_holds_the_same_settings(tmp_path: Path) -> None:
    toml = tmp_path / "lmcache.toml"
    toml.write_text(
        'when_full = "reject"\nread_threads = 8\n'
        '[[levels]]\nspec = "/nvme/strata-lmcache"\nbudget_gib = 100\n'
        '[[levels]]\nspec = "redis://kv-cache:6379/0"\nbudget_bytes = 1073741824\n'
        'settings = { name = "lmc" }\n'
    )
    s = settings(strata_config=str(toml))
    assert s.chunks == settings(levels=LEVELS, when_full="reject").chunks
    assert s.read_threads == 8 and str(toml) in s.source


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"dir": "/x", "budget_mib": 3, "levels": LEVELS}, f"{P}dir and {P}levels are both set"),
        ({"budget_mib": 3, "levels": LEVELS}, f"{P}budget_mib and {P}levels are both set"),
        ({}, f"{P}dir is not set: .* or give {P}levels"),
        ({"dir": "/x", "budget_mib": 3, "budget_gib": 1}, f"{P}budget_gib: not a setting of"),
        ({"levels": []}, '"levels" must list at least one level'),
        ({"levels": [{"spec": "/x", "budget_gib": -1}]}, r"levels\[0\]: budget_gib = -1"),
        ({"levels": [{"spec": "/x"}]}, r"levels\[0\]: give exactly one of budget_bytes"),
        ({"levels": [{"spec": "/x", "budget_gib": 1, "size": 2}]}, r"unknown key\(s\) size"),
        ({"levels": LEVELS, "when_full": "drop"}, "when_full = 'drop'; use 'evict' or 'reject'"),
        ({"levels": LEVELS, "name": ""}, f"{P}name = '': give a non-empty string"),
        ({"levels": LEVELS * 2}, "two levels of one chunk store name the same spec"),
        ({"strata_config": 5}, f"{P}strata_config = 5: name a TOML file"),
        ({"strata_config": "/no/such/file.toml"}, "/no/such/file.toml cannot be read"),
    ],
)
def test_a_contradictory_or_unknown_setting_names_the_key_and_the_fix(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        settings(**given)


def test_a_strata_config_file_refuses_unknown_and_doubled_settings(tmp_path: Path) -> None:
    toml = tmp_path / "lmcache.toml"
    toml.write_text('dir = "/x"\nbudget_mib = 3\nlevel = []\n')
    with pytest.raises(ConfigError, match=r"lmcache.toml: unknown setting\(s\) level; the"):
        settings(strata_config=str(toml))
    toml.write_text('dir = "/x"\nbudget_mib = 3\n')
    assert [lv.spec for lv in settings(strata_config=str(toml)).chunks.levels] == ["/x"]
    with pytest.raises(ConfigError, match=f"{P}budget_mib given both in extra_config and in"):
        settings(strata_config=str(toml), budget_mib=4)
    toml.write_text('levels = [{spec = "/x", budget_gib = 1}]\n')
    with pytest.raises(ConfigError, match=rf"{P}dir and levels in \S*lmcache\.toml are both set"):
        settings(strata_config=str(toml), dir="/y")
    toml.write_text("levels = [")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        settings(strata_config=str(toml))


def test_every_level_must_hold_one_chunk() -> None:
    """The budget check at start applies to each level: a chunk put on the first moves down into
    the next, so a level smaller than one chunk would stop the cascade (and every put after)."""
    small = [{"spec": "/x", "budget_gib": 1}, {"spec": "memory://lmc", "budget_bytes": 1000}]
    with pytest.raises(ConfigError, match=r"levels\[1\] \(memory://\.\.\.\) has a budget of 1,000"):
        settings(levels=small).check_room(1 << 20, "kv_shape (1,)")
    settings(levels=small[:1]).check_room(1 << 20, "kv_shape (1,)")
    with pytest.raises(ConfigError, match=f"{P}budget_mib = 1 is smaller than one chunk"):
        settings(dir="/x", budget_mib=1).check_room(2 << 20, "kv_shape (1,)")


def test_the_plugin_refuses_a_second_level_below_one_chunk(tmp_path: Path) -> None:
    cfg = engine_config(
        {
            **LOAD,
            P + "levels": [
                {"spec": str(tmp_path / "a"), "budget_gib": 1},
                {"spec": str(tmp_path / "b"), "budget_bytes": 1 << 20},
            ],
        }
    )
    meta = big_chunks()
    with pytest.raises(ConfigError, match=r"levels\[1\] .* smaller than one chunk"):
        StrataStoragePlugin(config=cfg, metadata=meta, local_cpu_backend=None)
    assert not (tmp_path / "a").exists()  # refused before any level was made


def test_the_engine_md_levels_example_reads_as_documented(tmp_path: Path) -> None:
    """The LMCache section's YAML with ``levels`` (a disk level above a Redis level), loaded by
    LMCache's own config reader: the plugin's settings are those two levels, in that order."""
    engine_md = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
    text = engine_md.read_text().split("## LMCache and vLLM: the stratastore storage plugin")[1]
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if f"{P}levels" in b]
    assert len(blocks) == 1, "engine.md's LMCache section has no YAML example with levels"
    (tmp_path / "lmcache.yaml").write_text(
        "chunk_size: 256\nstorage_plugins: [stratastore]\n" + blocks[0]
    )
    cfg = LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
    s = PluginSettings.from_config(cfg.extra_config, cfg.storage_plugins)
    assert [(lv.spec, lv.budget_bytes) for lv in s.chunks.levels] == [
        ("/nvme/strata-lmcache", 100 << 30),
        ("redis://kv-cache:6379/0", 64 << 30),
    ]
    assert s.chunks.levels[1].settings == {"name": "lmcache"}
    assert (s.chunks.when_full, s.chunks.name) == ("evict", "LMCache chunk")
