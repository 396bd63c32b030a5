"""The Store of a vLLM engine, one per process, shared by the connector's roles there (a store
is shared by processes, spec F-CAT), and the fingerprint of the K/V the engine keeps."""

from __future__ import annotations

import atexit
import logging
import threading
from typing import TYPE_CHECKING, Any

from stratastore.adapters.vllm.identity import weights_identity
from stratastore.adapters.vllm.plan import fingerprint, store_config
from stratastore.adapters.weights_digest import explain_refusal
from stratastore.errors import StrataError
from stratastore.facade import Store
from stratastore.format import IncompatibleFingerprint, ModelFingerprint
from stratastore.io.system import this_process

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = ["cpu_isa", "engine_fingerprint", "open_store", "release_store"]

log = logging.getLogger("stratastore.vllm")

_STORES: dict[tuple[str, bytes], tuple[Store, int]] = {}  #: this process's open stores
_STORES_LOCK = threading.Lock()


def open_store(
    vllm_config: VllmConfig, fp: ModelFingerprint, role: str
) -> tuple[Store, tuple[str, bytes]]:
    """The Store of this engine's settings, opened once per process (both roles share it);
    the start-up line, once per process, names its levels and the model."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    cfg, said = store_config(extra)
    key = (repr(cfg), fp.digest())
    with _STORES_LOCK:
        if key in _STORES:
            store, users = _STORES[key]
            _STORES[key] = (store, users + 1)
            return store, key
        try:
            store = Store.open(fp, cfg, warn=lambda msg: log.warning("stratastore: %s", msg))
        except IncompatibleFingerprint as e:
            raise explain_refusal(e) from None
        _STORES[key] = (store, 1)
        atexit.register(_close_all)
    levels = ", ".join(
        f"{lv.name} {lv.path} ({lv.budget >> 20} MiB)" for lv in store.describe().levels
    )
    log.warning(
        "stratastore: StrataConnector (%s, pid %d) on %s: %s; for %s of %s",
        role,
        this_process(),
        said,
        levels or "no disk level",
        fp.describe(),
        vllm_config.model_config.model,
    )
    return store, key


def release_store(key: tuple[str, bytes]) -> None:
    with _STORES_LOCK:
        found = _STORES.pop(key, None)
        if found is None:
            return
        store, users = found
        if users > 1:
            _STORES[key] = (store, users - 1)
            return
    store.close()  # waits for the parks in flight: each durable once it returns


def _close_all() -> None:
    with _STORES_LOCK:
        stores = [s for s, _ in _STORES.values()]
        _STORES.clear()
    for store in stores:
        try:
            store.close()
        except StrataError as e:
            log.warning("stratastore: closing the store: %s", e)


def engine_fingerprint(vllm_config: VllmConfig, page: int) -> ModelFingerprint:
    """The fingerprint of the K/V this vLLM engine keeps, in pages of ``page`` tokens
    (:func:`.plan.fingerprint`; the weights by :func:`.identity.weights_identity`)."""
    mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    dtype = mc.dtype if cc.cache_dtype in ("auto", None) else cc.cache_dtype
    return fingerprint(
        weights_identity(str(mc.model), mc.revision),
        mc.revision,
        mc.hf_config.to_dict(),
        n_layers=mc.get_num_layers(pc),
        n_kv_heads=mc.get_num_kv_heads(pc),
        head_dim=mc.get_head_size(),
        page_tokens=page,
        dtype=dtype,
        tp_size=pc.tensor_parallel_size,
        backend=_backend(mc.dtype, cc.block_size, mc.get_head_size(), cc.cache_dtype),
    )


def _backend(dtype: Any, block_size: int, head_size: int, cache_dtype: Any) -> str:
    """The platform, and on the CPU the attention ISA vLLM picks (its kernels compute the
    K/V a store keeps: a store is kept to one ISA's)."""
    from vllm.platforms import current_platform

    kind = str(current_platform.device_type)
    if kind != "cpu":
        return kind
    isa = _cpu_isa(dtype, block_size, head_size, cache_dtype)
    return f"cpu/{isa}" if isa else "cpu"


def cpu_isa(vllm_config: VllmConfig) -> str | None:
    """The attention ISA of vLLM's CPU backend for this engine (``amx``, ``vec``, ...), or
    None where vLLM does not say."""
    mc, cc = vllm_config.model_config, vllm_config.cache_config
    return _cpu_isa(mc.dtype, cc.block_size, mc.get_head_size(), cc.cache_dtype)


def _cpu_isa(dtype: Any, block_size: int, head_size: int, cache_dtype: Any) -> str | None:
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

        return str(_get_attn_isa(dtype, block_size, head_size, str(cache_dtype)))
    except (ImportError, NotImplementedError, AttributeError, TypeError):
        return None  # (a private function of vLLM's: another version may take other arguments)
