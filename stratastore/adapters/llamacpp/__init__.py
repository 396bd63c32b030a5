"""stratastore under llama.cpp (llama-cpp-python 0.3.36, the ``llamacpp`` extra): a sequence's
K/V parked as pages of the store's format, the deepest stored prefix of a prompt restored into a
sequence (docs/engine.md, "llama.cpp")."""

from stratastore.adapters.llamacpp.cache import StrataLlamaCache
from stratastore.adapters.llamacpp.chat import cuts_from_chat_template
from stratastore.adapters.llamacpp.identity import context_layout, fingerprint, gguf_digest
from stratastore.adapters.llamacpp.state import (
    Layout,
    StateLayoutError,
    build_context_state,
    build_state,
    read_context_state,
    read_state,
)
from stratastore.adapters.llamacpp.store import LlamaCppStore

__all__ = [
    "Layout",
    "LlamaCppStore",
    "StateLayoutError",
    "StrataLlamaCache",
    "build_context_state",
    "build_state",
    "context_layout",
    "cuts_from_chat_template",
    "fingerprint",
    "gguf_digest",
    "read_context_state",
    "read_state",
]
