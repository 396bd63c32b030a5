"""A budget smaller than one chunk is accepted at start, then every put is refused (one warning a
put) for the life of the engine. The chunk size is known at start (``metadata.kv_shape`` x dtype),
so it is a configuration error that ``PluginSettings`` / ``StrataStoragePlugin.__init__`` could
raise as a ConfigError naming ``storage_plugin.stratastore.budget_mib`` and the size needed."""

from __future__ import annotations

from pathlib import Path

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
torch = pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

from stratastore.adapters.lmcache import StrataStoragePlugin  # noqa: E402
from stratastore.errors import ConfigError  # noqa: E402


def test_a_budget_below_one_chunk_is_a_config_error(tmp_path: Path) -> None:
    p = "storage_plugin.stratastore."
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=256,
        local_cpu=False,
        max_local_cpu_size=0.03,
        storage_plugins=["stratastore"],
        extra_config={
            p + "module_path": "stratastore.adapters.lmcache",
            p + "class_name": "StrataStoragePlugin",
            p + "dir": str(tmp_path / "d"),
            p + "budget_mib": 1,
        },
    )
    # a chunk: 32 layers x 2 x 256 tokens x 8 heads x 128 x fp16 = 32 MiB, over 1 MiB
    meta = LMCacheMetadata(
        model_name="m",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float16,
        kv_shape=(32, 2, 256, 8, 128),
        chunk_size=256,
    )
    plugin = None
    try:
        with pytest.raises(ConfigError, match="budget_mib"):
            plugin = StrataStoragePlugin(config=cfg, metadata=meta, local_cpu_backend=None)
    finally:
        if plugin is not None:
            plugin.close()
