"""A blocking get of a prefix larger than LMCache's CPU buffer never returns.

``StrataStoragePlugin._get_prefix`` allocates a memory object for every chunk of the prefix before
copying any, with ``busy_loop=True`` on the blocking path (``get_blocking`` /
``batched_get_blocking``): once the chunks it already holds fill the buffer (``local_cpu`` off:
nothing else to evict), LMCache's ``allocate`` sleeps and retries forever, waiting for memory that
only this call would free. A shorter prefix (what ``allocate`` returning None already gives) was the
answer; the bar is "no hangs"."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402

from stratastore.adapters.lmcache.cpu import cpu_engine  # noqa: E402
from tests.adapters.lmcache_worker import (  # noqa: E402
    CHUNK,
    HEAD_DIM,
    HEADS,
    LAYERS,
    MODEL,
    PROMPT,
    engine,
    kv,
    plugin,
    prompt,
)


def small_engine(path: Path, name: str, cpu_gb: float) -> Any:
    p = "storage_plugin.stratastore."
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK,
        local_cpu=False,
        max_local_cpu_size=cpu_gb,
        storage_plugins=["stratastore"],
        extra_config={
            p + "module_path": "stratastore.adapters.lmcache",
            p + "class_name": "StrataStoragePlugin",
            p + "dir": str(path),
            p + "budget_mib": 64,
        },
    )
    return cpu_engine(
        name, cfg, model_name=MODEL, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, chunk=CHUNK
    )


def test_a_blocking_get_longer_than_the_cpu_buffer_returns(tmp_path: Path) -> None:
    d = tmp_path / "d"
    eng = engine(str(d), "large-prefix-store")
    eng.store(prompt(0), kvcaches=kv(0))  # 8 chunks of 64 KiB
    plugin(eng).flush()
    keys = [k for _, _, k in eng.token_database.process_tokens(tokens=prompt(0, PROMPT))]
    LMCacheEngineBuilder.destroy("large-prefix-store")
    small = small_engine(d, "large-prefix-get", 0.0003)  # ~320 KB: 4 chunks, not 8
    got: list[Any] = []
    t = threading.Thread(
        target=lambda: got.append(plugin(small).batched_get_blocking(keys)), daemon=True
    )
    t.start()
    t.join(20)
    hung = t.is_alive()
    if not hung:
        for obj in got[0]:
            if obj is not None:
                obj.ref_count_down()
        LMCacheEngineBuilder.destroy("large-prefix-get")
    assert not hung, "batched_get_blocking is still busy-looping in LMCache's allocate after 20 s"
