"""Storage backends driven as SGLang 0.5.23's ``HiCacheController`` drives them
(``managers/cache_controller.py``), built by SGLang's own ``StorageBackendFactory``: page
hashes from ``get_hash_str`` (a SHA-256 chain over each page's tokens and every token before
it), then ``batch_exists`` for the leading pages held, and the pages moved between the backend
and a host pool: ``batch_set_v1`` / ``batch_get_v1`` on host indices where the backend takes
SGLang's zero-copy interface (a dynamic backend with ``interface_v1``), else ``batch_set`` of
``get_data_page`` and ``batch_get`` into ``get_dummy_flat_data_page`` pages copied in with
``set_from_flat_data_page`` (the ``file`` backend's path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from strata_harness.sglang_host_pool import CpuHostPool

STRATA = {
    "backend_name": "strata",
    "module_path": "stratastore.adapters.sglang",
    "class_name": "StrataHiCacheStorage",
    "interface_v1": 1,
}


def storage_config(
    extra: dict[str, Any], model: str, *, page_first: bool = True, tp: tuple[int, int] = (0, 1)
) -> Any:
    """SGLang's storage config of a rank (``tp``: its TP rank and size)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp[0],
        tp_size=tp[1],
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=page_first,
        model_name=model,
        extra_config=extra,
    )


def backend(
    kind: str,
    where: Path | list[dict[str, Any]],
    pool: CpuHostPool,
    model: str,
    *,
    tp: tuple[int, int] = (0, 1),
    **extra: Any,
) -> Any:
    """SGLang's factory's backend ``kind`` (``strata``: this project's, on the levels
    ``where``, with the further settings ``extra``; ``file``: SGLang's, in the directory
    ``where``), its host pool registered as the controller registers it."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    page_first = pool.layout == "page_first"
    if kind == "strata":
        settings = {**STRATA, "levels": where, **extra}
        cfg = storage_config(settings, model, page_first=page_first, tp=tp)
        made = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    else:
        cfg = storage_config({"file_storage_path": str(where)}, model, page_first=page_first)
        made = StorageBackendFactory.create_backend("file", cfg, pool)
    made.register_mem_pool_host(pool)
    made.on_host_pools_registered()
    return made


def hashes(tokens: list[int], page_size: int) -> list[str]:
    from sglang.srt.mem_cache.utils import get_hash_str

    out = get_hash_str(tokens, None, page_size=page_size)
    assert isinstance(out, list)
    return out


def zero_copy(b: Any) -> bool:
    return bool(
        ((getattr(b, "storage_config", None) and b.storage_config.extra_config) or {}).get(
            "interface_v1"
        )
    )


def indices(first_page: int, pages: int, page_size: int) -> torch.Tensor:
    return torch.arange(first_page * page_size, (first_page + pages) * page_size)


def backup(b: Any, pool: CpuHostPool, keys: list[str], first_page: int = 0) -> bool:
    """Write the pool's pages ``first_page..`` under ``keys``, as the controller's backup."""
    host = indices(first_page, len(keys), pool.page_size)
    if zero_copy(b):
        return all(b.batch_set_v1(keys, host))
    pages = [pool.get_data_page(int(host[i * pool.page_size])) for i in range(len(keys))]
    return bool(b.batch_set(keys, pages))


def prefetch(b: Any, pool: CpuHostPool, keys: list[str], first_page: int = 0) -> int:
    """Read the leading pages of ``keys`` the backend holds into the pool's pages
    ``first_page..``, as the controller's prefetch: how many were read."""
    hit = b.batch_exists(keys)
    keys = keys[:hit]
    host = indices(first_page, len(keys), pool.page_size)
    if zero_copy(b):
        done = b.batch_get_v1(keys, host)
    else:
        dummies = [pool.get_dummy_flat_data_page() for _ in keys]
        pages = b.batch_get(keys, dummies)
        done = []
        for i, page in enumerate(pages):
            if page is None:
                break
            pool.set_from_flat_data_page(int(host[i * pool.page_size]), page)
            done.append(True)
    n = 0
    for ok in done:
        if not ok:
            break
        n += 1
    return n
