"""stratastore under llama.cpp (llama-cpp-python 0.3.36, the ``llamacpp`` extra): a sequence's
K/V parked as pages of the store's format, the deepest stored prefix of a prompt restored into a
sequence; for sliding-window, recurrent and hybrid models, the sequence's state kept whole at
checkpoints (docs/engine.md, "llama.cpp")."""

from stratastore.adapters.llamacpp.cache import StrataLlamaCache
from stratastore.adapters.llamacpp.chat import cuts_from_chat_template
from stratastore.adapters.llamacpp.checkpoints import LlamaCheckpointStore, checkpoint_lengths
from stratastore.adapters.llamacpp.identity import (
    context_layout,
    fingerprint,
    gguf_digest,
    memory_kind,
    state_fingerprint,
)
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
    "LlamaCheckpointStore",
    "LlamaCppStore",
    "StateLayoutError",
    "StrataLlamaCache",
    "build_context_state",
    "build_state",
    "checkpoint_lengths",
    "context_layout",
    "cuts_from_chat_template",
    "fingerprint",
    "gguf_digest",
    "memory_kind",
    "read_context_state",
    "read_state",
    "state_fingerprint",
]
