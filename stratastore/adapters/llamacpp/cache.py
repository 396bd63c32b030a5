"""``Llama.set_cache`` on stratastore: a ``BaseLlamaCache`` beside llama-cpp-python's
``LlamaRAMCache`` and ``LlamaDiskCache``, for code that uses the high-level API.

Where those keep a whole context state per prompt and find the longest stored prefix by a scan
of every key, this one stores a state as pages (:class:`~.store.LlamaCppStore`): a prompt that
shares only its first N tokens with what was stored gets those N back, conversations that
share a prefix share its pages, every page is validated before it is used, and a damaged page
gives the prefix before it. What ``Llama`` hands it (``cache[tokens] = llm.save_state()``)
is parked, cut at every :data:`CUT_TOKENS` tokens so that the next turn's state shares the
segments of this one; what it asks for (``cache[prompt]``) is the deepest stored prefix of the
prompt, at most ``len(prompt) - 1`` tokens, which it loads into the ``Llama``'s context itself
(:meth:`LlamaCppStore.restore <.store.LlamaCppStore.restore>`: one sequence state, built in the
memory the pages were validated in and read by llama.cpp from there) before it raises
``KeyError``: the ``Llama`` then holds that prefix and ``generate`` goes on from it. Handing
``Llama`` a ``LlamaState`` instead would cost a copy of the whole state (``Llama.load_state``
copies it into a ctypes buffer before llama.cpp reads it: a third buffer of the context's size
beside the K/V cache and the restored state, 4 GiB each at 32K tokens of an 8B model's K/V).

A model whose memory is not a plain K/V cache (sliding-window, recurrent, hybrid:
:func:`~.identity.memory_kind`) has no prefix to cut out of a state, so its states are kept
whole at checkpoints (:class:`~.checkpoints.LlamaCheckpointStore`): ``cache[prompt]`` loads the
deepest stored checkpoint of the prompt into the ``Llama`` itself, evaluates the prompt on to
its last checkpoint (the end of each message, every ``checkpoint_tokens`` tokens), parking the
state at each, and raises ``KeyError``: the ``Llama`` then holds that prefix and has nothing to
load, and ``generate`` goes on from it. ``cache[tokens] = state`` parks the state at the end of
the completion.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NoReturn

import blake3

from stratastore.adapters.llamacpp.checkpoints import LlamaCheckpointStore
from stratastore.adapters.llamacpp.identity import memory_kind
from stratastore.adapters.llamacpp.state import read_context_state
from stratastore.adapters.llamacpp.store import LlamaCppStore
from stratastore.chain import as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError

__all__ = ["CHECKPOINT_TOKENS", "CUT_TOKENS", "StrataLlamaCache"]

#: each state is cut into segments at the multiples of this many tokens (and at its end): a
#: key is a new conversation to the store, so equal prefixes share segments up to the last
#: multiple they share, and a turn writes its new tokens and fewer than this many before them
#: (64 made a turn write less and a restore of 2K tokens of 8B's K/V geometry read at half the
#: rate: a segment is a file opened and checked)
CUT_TOKENS = 256

#: a model kept at checkpoints (see the module) gets one every this many tokens of a prompt
#: besides the end of each message: an edit inside a long message re-evaluates at most this
#: many tokens before it, and each checkpoint stores the model's whole state again
CHECKPOINT_TOKENS = 1024

log = logging.getLogger(__name__)

try:
    from llama_cpp.llama_cache import BaseLlamaCache as _Base
except ImportError:  # the package imports without the extra; the class needs it
    _Base = object


class StrataLlamaCache(_Base):  # type: ignore[misc]
    """A ``BaseLlamaCache`` for ``llm`` (``llm.set_cache(StrataLlamaCache(llm, config))``)
    on a store opened for its fingerprint (:meth:`LlamaCppStore.open`'s arguments; for a
    sliding-window, recurrent or hybrid model :meth:`LlamaCheckpointStore.open`'s, with a
    checkpoint every ``checkpoint_tokens`` tokens of a prompt, 0 for the message ends only).
    Use it from the thread that drives ``llm``; close it (or use it as a context manager) to
    close the store."""

    store: LlamaCppStore | LlamaCheckpointStore

    def __init__(
        self,
        llm: Any,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        *,
        checkpoint_tokens: int = CHECKPOINT_TOKENS,
        **open_kw: Any,
    ) -> None:
        if _Base is object:
            raise ConfigError(
                "StrataLlamaCache needs llama-cpp-python: pip install 'stratastore[llamacpp]'"
            )
        if (
            isinstance(checkpoint_tokens, bool)
            or not isinstance(checkpoint_tokens, int)
            or checkpoint_tokens < 0
        ):
            raise ConfigError(
                f"StrataLlamaCache: checkpoint_tokens={checkpoint_tokens!r}: give a token count "
                ">= 0 (0: a checkpoint at each message's end only)"
            )
        self.checkpoint_tokens = checkpoint_tokens
        if memory_kind(llm) is None:
            self.store = LlamaCppStore.open(llm, store_config, **open_kw)
        else:
            self.store = LlamaCheckpointStore.open(llm, store_config, **open_kw)
        try:
            super().__init__(capacity_bytes=self._budget())
        except BaseException:
            self.store.close()
            raise
        self._llm = llm
        self._arch = str(llm.metadata.get("general.architecture", ""))
        #: parks and restores that failed (logged, never raised: a completion is not failed by
        #: its cache)
        self.errors = 0

    def _levels(self, counter: str) -> int:
        """``counter`` (``budget``, ``bytes``) summed over the store's levels."""
        levels = self.store.store.stats()["levels"].values()
        return int(sum(level.get(counter) or 0 for level in levels))

    def _budget(self) -> int:
        return self._levels("budget")

    @property
    def cache_size(self) -> int:
        """Bytes the store's levels hold."""
        return self._levels("bytes")

    def __contains__(self, key: Sequence[int]) -> bool:
        return self.store.lookup(list(key)) > 0

    def __getitem__(self, key: Sequence[int]) -> NoReturn:
        """Load the deepest stored prefix of ``key`` (at most ``len(key) - 1`` tokens, every
        page validated) into the ``Llama``'s context (logged at INFO: how many of the prompt's
        tokens it holds), then raise ``KeyError``: the ``Llama`` holds the prefix and has
        nothing to load, and ``generate`` goes on from it. Nothing is read when the ``Llama``
        holds as long a prefix already. A restore that fails is logged and counted
        (:attr:`errors`): a read error leaves the ``Llama`` holding what it held, a state
        llama.cpp refuses leaves it holding no tokens (the prompt is evaluated whole, as
        without a cache). A model kept at checkpoints: see the module."""
        ids = as_tokens(list(key))
        if isinstance(self.store, LlamaCheckpointStore):
            self._checkpoints(ids)
        try:
            n = self.store.restore(ids)
        except StrataError as e:
            self.errors += 1
            log.warning("StrataLlamaCache: the prompt's stored prefix was not restored: %s", e)
            n = 0
        if n:
            log.info("stratastore: restored %d of %d prompt tokens from the store", n, len(ids))
        raise KeyError(f"the Llama holds the first {self.store.held(ids)} tokens of the prompt")

    def _checkpoints(self, ids: Any) -> NoReturn:
        """``cache[prompt]`` for a model kept at checkpoints (see the module): always raises
        ``KeyError``, the ``Llama`` holding the restored and evaluated prefix itself."""
        assert isinstance(self.store, LlamaCheckpointStore)
        n = self.store.restore(ids)
        if n:
            log.info("stratastore: restored %d of %d prompt tokens from the store", n, len(ids))
        try:
            self.store.prefill(ids, every=self.checkpoint_tokens)
        except StrataError as e:  # the prompt is evaluated on by generate: a park failed
            self.errors += 1
            log.warning("StrataLlamaCache: a checkpoint of the prompt was not stored: %s", e)
        raise KeyError(f"the Llama holds the first {self.store.held(ids)} tokens of the prompt")

    def __setitem__(self, key: Sequence[int], value: Any) -> None:
        """Park the state ``Llama.save_state`` gave (its sequence's tokens are
        ``value.input_ids[:value.n_tokens]``), under a name derived from those tokens. A park
        that fails is logged and counted (:attr:`errors`), never raised: ``Llama`` calls this
        after the completion it served."""
        n = int(value.n_tokens)
        if n <= 0:
            return
        ids = as_tokens(value.input_ids[:n], "the cached state's tokens")
        if isinstance(self.store, LlamaCheckpointStore):
            # the Llama's context holds this state now: its sequence is read from there
            if self._llm.n_tokens != n or self.store.held(ids) != n:
                return
            try:
                self.store.park(ids)
            except StrataError as e:
                self.errors += 1
                log.warning("StrataLlamaCache: the state of %d tokens was not stored: %s", n, e)
            return
        assert isinstance(self.store, LlamaCppStore)
        conv_id = "llama-cache-" + blake3.blake3(ids.tobytes()).hexdigest()[:32]
        grid = list(range(CUT_TOKENS, n, CUT_TOKENS))
        try:
            state = memoryview(value.llama_state)[: value.llama_state_size]
            rows = read_context_state(state, self.store.layout, self._arch)
            self.store.park_rows(conv_id, ids, rows, checkpoints=grid, tail=False)
        except StrataError as e:  # the completion was served: its cache entry is what failed
            self.errors += 1
            log.warning("StrataLlamaCache: the state of %d tokens was not stored: %s", n, e)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> StrataLlamaCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
