"""``Llama.set_cache`` on stratastore: a ``BaseLlamaCache`` beside llama-cpp-python's
``LlamaRAMCache`` and ``LlamaDiskCache``, for code that uses the high-level API.

Where those keep a whole context state per prompt and find the longest stored prefix by a scan
of every key, this one stores a state as pages (:class:`~.store.LlamaCppStore`): a prompt that
shares only its first N tokens with what was stored gets those N back, conversations that
share a prefix share its pages, every page is validated before it is used, and a damaged page
gives the prefix before it. What ``Llama`` hands it (``cache[tokens] = llm.save_state()``)
is parked, cut at every :data:`CUT_TOKENS` tokens so that the next turn's state shares the
segments of this one; what it asks for (``cache[prompt]``) is the deepest stored prefix of the
prompt, at most ``len(prompt) - 1`` tokens, as a ``LlamaState`` for ``Llama.load_state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import blake3
import numpy as np

from stratastore.adapters.llamacpp.state import read_context_state
from stratastore.adapters.llamacpp.store import LlamaCppStore
from stratastore.config import StoreConfig

__all__ = ["CUT_TOKENS", "StrataLlamaCache"]

#: each state is cut into segments at the multiples of this many tokens (and at its end): a
#: key is a new conversation to the store, so equal prefixes share segments up to the last
#: multiple they share, and a turn writes its new tokens and at most this many before them
CUT_TOKENS = 64

try:
    from llama_cpp.llama_cache import BaseLlamaCache as _Base
except ImportError:  # the package imports without the extra; the class needs it
    _Base = object


class StrataLlamaCache(_Base):  # type: ignore[misc]
    """A ``BaseLlamaCache`` for ``llm`` (``llm.set_cache(StrataLlamaCache(llm, config))``)
    on a store opened for its fingerprint (:meth:`LlamaCppStore.open`'s arguments). Use it
    from the thread that drives ``llm``; close it (or use it as a context manager) to close
    the store."""

    def __init__(
        self,
        llm: Any,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        **open_kw: Any,
    ) -> None:
        if _Base is object:
            from stratastore.errors import ConfigError

            raise ConfigError(
                "StrataLlamaCache needs llama-cpp-python: pip install 'stratastore[llamacpp]'"
            )
        self.store = LlamaCppStore.open(llm, store_config, **open_kw)
        super().__init__(capacity_bytes=self._budget())
        self._llm = llm
        self._arch = str(llm.metadata.get("general.architecture", ""))

    def _budget(self) -> int:
        levels = self.store.store.stats()["levels"].values()
        return int(sum(level.get("budget") or 0 for level in levels))

    @property
    def cache_size(self) -> int:
        """Bytes the store's levels hold."""
        levels = self.store.store.stats()["levels"].values()
        return int(sum(level.get("bytes") or 0 for level in levels))

    def __contains__(self, key: Sequence[int]) -> bool:
        return self.store.lookup(list(key)) > 0

    def __getitem__(self, key: Sequence[int]) -> Any:
        """The deepest stored prefix of ``key`` (at most ``len(key) - 1`` tokens) as a
        ``LlamaState``; ``KeyError`` when nothing is stored for it."""
        from llama_cpp.llama import LlamaState

        ids = list(key)
        n, data = self.store.prefix_state(ids, arch=self._arch)
        if n == 0:
            raise KeyError(f"no stored prefix of these {len(ids)} tokens")
        input_ids = np.full(self._llm.n_ctx(), -1, dtype=np.intc)  # -1: no token matches
        input_ids[:n] = ids[:n]
        # Llama.load_state copies these into its own scores; the next decode replaces them
        scores = np.zeros((min(n, self._llm.scores.shape[0]), self._llm.n_vocab()), np.single)
        seed = int(getattr(self._llm, "_seed", 0) or 0)
        return LlamaState(input_ids, scores, n, data, len(data), seed)

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        """Park the state ``Llama.save_state`` gave (its sequence's tokens are
        ``value.input_ids[:value.n_tokens]``), under a name derived from those tokens."""
        n = int(value.n_tokens)
        if n <= 0:
            return
        ids = np.asarray(value.input_ids[:n], dtype=np.int64)
        rows = read_context_state(
            memoryview(value.llama_state)[: value.llama_state_size], self.store.layout, self._arch
        )
        conv_id = "llama-cache-" + blake3.blake3(ids.tobytes()).hexdigest()[:32]
        grid = list(range(CUT_TOKENS, n, CUT_TOKENS))
        self.store.park_rows(conv_id, ids, rows, checkpoints=grid, tail=False)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> StrataLlamaCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
