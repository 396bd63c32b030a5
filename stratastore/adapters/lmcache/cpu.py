"""LMCache's engine on the CPU, with no GPU and no vLLM: what the plugin's tests, its benchmark
and ``strata bench --peers`` drive it with.

:func:`copy_connector` is a GPU connector that copies bytes (LMCache's own mock connector
copies nothing) between the engine layout ``[layers, 2, tokens, heads, head_dim]``, passed to
``store``/``retrieve`` as ``kvcaches=``, and LMCache's memory objects ``[2, layers, chunk
tokens, heads * head_dim]`` (what a GPU connector does, here in host memory).
:func:`cpu_engine` builds the engine through LMCache's public builder
(``LMCacheEngineBuilder.get_or_create`` + ``post_init``). lmcache and torch are imported inside
the functions: this module imports without them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["copy_connector", "cpu_engine"]


def copy_connector(layers: int, heads: int, head_dim: int) -> Any:
    """A ``GPUConnectorInterface`` that copies between ``kvcaches`` and memory objects."""
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface

    class CopyConnector(GPUConnectorInterface):  # type: ignore[misc]
        """Copies between ``kvcaches`` (the engine layout) and memory objects."""

        def __init__(self) -> None:
            self.kvcaches = None

        def get_shape(self, num_tokens: int) -> Any:
            import torch

            return torch.Size([2, layers, num_tokens, heads * head_dim])

        def from_gpu(self, obj: Any, start: int, end: int, **kw: Any) -> None:
            self.batched_from_gpu([obj], [start], [end], **kw)

        def to_gpu(self, obj: Any, start: int, end: int, **kw: Any) -> None:
            self.batched_to_gpu([obj], [start], [end], **kw)

        def batched_from_gpu(self, objs: Any, starts: Any, ends: Any, **kw: Any) -> None:
            kv = kw["kvcaches"]
            for obj, a, b in zip(objs, starts, ends, strict=True):
                part = kv[:, :, a:b].reshape(layers, 2, b - a, heads * head_dim)
                obj.tensor.copy_(part.transpose(0, 1))

        def batched_to_gpu(
            self, objs: Any = None, starts: Any = None, ends: Any = None, **kw: Any
        ) -> None:
            kv = kw["kvcaches"]
            for obj, a, b in zip(objs, starts, ends, strict=True):
                part = obj.tensor.view(2, layers, b - a, heads, head_dim)
                kv[:, :, a:b].copy_(part.transpose(0, 1))

    return CopyConnector()


def cpu_engine(
    instance_id: str,
    config: Any,
    *,
    model_name: str,
    layers: int,
    heads: int,
    head_dim: int,
    chunk: int,
    dtype: str = "float16",
) -> Any:
    """An LMCache engine for ``config`` (an ``LMCacheEngineConfig``) on the CPU, K/V of
    ``layers x 2 x heads x head_dim`` of ``dtype`` a token, ``chunk`` tokens a chunk; post-
    initialised. Close it with ``LMCacheEngineBuilder.destroy(instance_id)``."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.metadata import LMCacheMetadata

    meta = LMCacheMetadata(
        model_name=model_name,
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=getattr(torch, dtype),
        kv_shape=(layers, 2, chunk, heads, head_dim),
        chunk_size=chunk,
    )
    engine = LMCacheEngineBuilder.get_or_create(
        instance_id,
        config,
        meta,
        copy_connector(layers, heads, head_dim),
        lambda t, r: None,
        lambda o, r: o,
    )
    engine.post_init()
    return engine
