"""A stratastore :class:`~stratastore.Store` under a llama-cpp-python ``Llama`` whose model keeps
more than a plain K/V cache (:func:`~.identity.memory_kind`: a sliding-window cache, a recurrent
state, a hybrid memory): its sequence's state stored whole at checkpoints, restored at the
deepest stored checkpoint that is a prefix of a prompt.

Such a state cannot be cut into per-token pages: a recurrent layer's state after ``n`` tokens
is one vector, not ``n`` rows, and llama.cpp cannot shorten it. What a checkpoint stores is
what the seeds' checkpoint chain keeps for these models: the running state at that length
(llama.cpp's ``llama_state_seq_get_data`` of the sequence, as llama.cpp wrote it; spec
F-KEY-5, a ``STATE`` segment, hashed like a page), and as its pages the tokens it holds (a
token's entry is its id: :data:`~.identity.STATE_TOKEN_BYTES`). A restore finds the deepest
stored checkpoint whose tokens are a prefix of the prompt, reads its state (validated before
it is used: a damaged state is never loaded, and the restore goes on to the deepest stored
checkpoint below it) and loads it into the sequence; llama.cpp evaluates the rest.

Where the checkpoints are (:func:`checkpoint_lengths`): after every end-of-generation token of
the prompt (the end of each message for chat templates that close a message with one, as
``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>`` and ``</s>`` do), every ``every`` tokens of
a long prompt, and the end of each completion (:class:`~.cache.StrataLlamaCache` parks the
state ``Llama`` hands it). Each checkpoint is a conversation of its own in the store (named
from its tokens), so one that is damaged or evicted leaves the others restorable. A state
holds what the model keeps: a recurrent state is the same size at every length; a
sliding-window or hybrid model's attention layers keep their K/V in it (all of it, with
llama-cpp-python's default full-size sliding-window cache), so a checkpoint of a long prompt
stores that prompt's K/V again: ``every`` trades disk for the tokens an edit re-evaluates.

Durability is :class:`~.store.LlamaCppStore`'s: with ``park = "disk"`` (and no remote level or
system-prompt cache) a park is durable when it returns; otherwise after :meth:`flush` or
:meth:`close`.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import blake3
import numpy as np
import numpy.typing as npt

from stratastore.adapters.llamacpp.identity import memory_kind, state_fingerprint
from stratastore.adapters.llamacpp.store import check_seq, held_prefix
from stratastore.adapters.weights_digest import explain_refusal
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.facade import Store
from stratastore.format import IncompatibleFingerprint, ModelFingerprint
from stratastore.restore import LayerKV
from stratastore.tiers.records import ParkReport

__all__ = ["CUT_TOKENS", "LlamaCheckpointStore", "checkpoint_lengths"]

#: a checkpoint's pages are cut into segments at the multiples of this many tokens, so the
#: checkpoints of one conversation share the segments of their common prefix
CUT_TOKENS = 256

TokenIds = Sequence[int] | npt.NDArray[np.integer[Any]]


def checkpoint_lengths(
    ids: npt.NDArray[np.uint32], eog: Sequence[int] | npt.NDArray[np.uint32], every: int
) -> list[int]:
    """The checkpoint lengths of ``ids``, ascending: after each token that is one of ``eog``
    (end of generation: a message's end) and every ``every`` tokens (``0``: none), each in
    ``1 .. len(ids)``."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ConfigError(f"checkpoint every {every!r} tokens: give a token count >= 0 (0: off)")
    ends = np.flatnonzero(np.isin(ids, np.asarray(eog, dtype=np.uint32))) + 1
    grid = range(every, len(ids) + 1, every) if every else range(0)
    return sorted({*(int(x) for x in ends), *grid})


class LlamaCheckpointStore:
    """A Store of one ``llama_cpp.Llama``'s sequence states at checkpoints, for a model that
    keeps more than a plain K/V cache (see the module). As thread-safe as the Store for the
    store's side; llama.cpp's context is not: call it from the thread that drives the
    ``Llama``. Sequence 0 is the one ``Llama`` evaluates: a restore or :meth:`prefill` there
    also tells ``Llama`` which tokens its context holds, so ``generate`` and
    ``create_completion`` go on from them."""

    def __init__(self, llm: Any, store: Store, fp: ModelFingerprint) -> None:
        self.llm, self.store, self.fp = llm, store, fp

    @classmethod
    def open(
        cls,
        llm: Any,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        *,
        page_tokens: int = 16,
        **store_kw: Any,
    ) -> LlamaCheckpointStore:
        """Open the Store for ``llm``'s state fingerprint (:func:`~.identity.state_fingerprint`);
        a store directory holding another model's states refuses it (spec F-DIR-6).
        A state resumes only at its checkpoint, so the store's ``page_resume`` is off here
        whatever the settings say (a page inside a checkpoint has no state to resume with).
        :class:`ConfigError` for a model that keeps a plain K/V cache
        (:class:`~.store.LlamaCppStore` stores those as pages), a ``Llama`` that keeps every
        token's logits (``logits_all``, a draft model: a rejected draft leaves a recurrent
        memory ahead of the tokens it holds) and a sliding-window cache of the window only
        (``swa_full=False``: cut back, it no longer holds the window below the cut)."""
        if memory_kind(llm) is None:
            raise ConfigError(
                "the model keeps a plain K/V cache: LlamaCppStore stores it as pages (any "
                "prefix restores, and equal prefixes share them); LlamaCheckpointStore is for "
                "sliding-window, recurrent and hybrid models"
            )
        if getattr(llm, "_logits_all", False) or getattr(llm, "draft_model", None) is not None:
            raise ConfigError(
                "the Llama keeps every token's logits (logits_all=True, or a draft model): a "
                "restored checkpoint has no logits for its tokens, and a rejected draft cannot "
                "be cut out of a recurrent memory; create it with logits_all=False and no "
                "draft model"
            )
        import llama_cpp

        windowed = int(llama_cpp.llama_model_n_swa(llm.model)) > 0
        if windowed and not bool(getattr(llm.context_params, "swa_full", True)):
            raise ConfigError(
                "the Llama keeps only the sliding window (swa_full=False): a state cut back to "
                "an earlier length lacks the window below it; create it with swa_full=True "
                "(llama-cpp-python's default)"
            )
        fp = state_fingerprint(llm, page_tokens=page_tokens)
        cfg = dataclasses.replace(StoreConfig.of(store_config), page_resume=False)
        try:
            store = Store.open(fp, cfg, **store_kw)
        except IncompatibleFingerprint as e:
            raise explain_refusal(e) from None
        return cls(llm, store, fp)

    def flush(self) -> None:
        """As :meth:`~.store.LlamaCppStore.flush`."""
        self.store.flush()

    def close(self) -> None:
        """As :meth:`~.store.LlamaCppStore.close`."""
        self.store.close()

    def __enter__(self) -> LlamaCheckpointStore:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the sequence's state ------------------------------------------------------------------
    def _check_seq(self, seq: int) -> None:
        check_seq(self.llm, seq)

    def _get(self, seq: int) -> bytes:
        import llama_cpp

        n = int(llama_cpp.llama_state_seq_get_size(self.llm.ctx, seq))
        buf = (ctypes.c_uint8 * n)()
        got = int(llama_cpp.llama_state_seq_get_data(self.llm.ctx, buf, n, seq))
        if got != n:
            raise StrataError(f"llama.cpp wrote {got} of the {n} bytes of sequence {seq}'s state")
        return bytes(buf)

    def _set(self, state: bytes, seq: int) -> bool:
        """Load ``state`` into sequence ``seq``; False when llama.cpp refuses it (the sequence
        is then empty)."""
        import llama_cpp

        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return int(llama_cpp.llama_state_seq_set_data(self.llm.ctx, buf, len(state), seq)) == len(
            state
        )

    def held(self, prompt: TokenIds) -> int:
        """How many leading tokens of ``prompt`` sequence 0 of the ``Llama`` holds now."""
        return held_prefix(self.llm, prompt)

    def _keep(self, n: int) -> int:
        """Cut sequence 0 back to its first ``n`` tokens; where its memory cannot be cut there
        (a recurrent state holds no earlier point), clear it: returns what it holds after."""
        import llama_cpp

        if self.llm.n_tokens <= n:
            return int(self.llm.n_tokens)
        mem = llama_cpp.llama_get_memory(self.llm.ctx)
        if n > 0 and llama_cpp.llama_memory_seq_rm(mem, 0, n, -1):
            self.llm.n_tokens = n
            return n
        llama_cpp.llama_memory_seq_rm(mem, 0, -1, -1)
        self.llm.n_tokens = 0
        return 0

    # -- the engine's calls --------------------------------------------------------------------
    def park(self, token_ids: TokenIds | None = None, *, seq: int = 0) -> ParkReport:
        """Store sequence ``seq``'s state as a checkpoint of the tokens it holds, ``token_ids``
        (default, for sequence 0: the ``Llama``'s evaluated tokens). Durable when it returns
        with ``where == "disk"`` under ``park = "disk"``; otherwise once :meth:`flush` or
        :meth:`close` returns."""
        self._check_seq(seq)
        if token_ids is None:
            if seq != 0:
                raise StrataError(f"park of sequence {seq}: pass its token_ids")
            token_ids = list(self.llm.input_ids[: self.llm.n_tokens])
        ids = as_tokens(token_ids, "park: token_ids")
        if len(ids) == 0:
            raise StrataError("park: the sequence holds no tokens: there is no state to keep")
        return self.park_state(ids, self._get(seq))

    def park_state(self, token_ids: TokenIds, state: bytes) -> ParkReport:
        """Store ``state`` (llama.cpp's state of a sequence holding ``token_ids``, as
        ``llama_state_seq_get_data`` wrote it) as the checkpoint at ``len(token_ids)``, a
        conversation named from the tokens. A state the store refuses to keep (over its
        budget: ``where == "discard"``) is counted by the store, not raised."""
        ids = as_tokens(token_ids, "park: token_ids")
        n = len(ids)
        if n == 0 or not state:
            raise StrataError(f"park: a state of {len(state)} bytes for {n} tokens: none to keep")
        conv_id = "llama-state-" + blake3.blake3(ids.tobytes()).hexdigest()[:32]
        cuts = list(range(0, n, CUT_TOKENS))
        conv = Conversation(conv_id, ids, [Checkpoint(n)], cuts=cuts)
        k, v = _token_halves(ids)
        return self.store.park(conv, LayerKV(self.fp, [k], [v]), states={n: bytes(state)})

    def lookup(self, prompt: TokenIds, *, max_tokens: int | None = None) -> int:
        """The length of the deepest stored checkpoint that is a prefix of ``prompt`` (0:
        none), at most ``max_tokens`` (default ``len(prompt) - 1``)."""
        ids = as_tokens(prompt)
        hit = self.store.lookup(ids[: _cap(len(ids), max_tokens)])
        return hit[1] if hit else 0

    def restore(self, prompt: TokenIds, *, seq: int = 0, max_tokens: int | None = None) -> int:
        """Load the deepest stored checkpoint that is a prefix of ``prompt`` into sequence
        ``seq`` and return its length ``n`` (0: none); evaluate
        ``prompt[n:]`` after it. ``n`` is at most ``max_tokens``, by default ``len(prompt) -
        1`` (the model needs the last prompt token's logits), and for sequence 0 never more.
        A checkpoint whose state or tokens fail validation, or whose state llama.cpp refuses,
        is passed over for the deepest one below it (a refused state leaves the sequence
        empty). For sequence 0 the ``Llama`` is first cut back to the prompt's prefix it holds
        (to nothing, for a memory that cannot be cut there); when it then holds at least as
        long a prefix as the store, nothing is read and 0 is returned."""
        self._check_seq(seq)
        ids = as_tokens(prompt)
        cap = min(_cap(len(ids), max_tokens), int(self.llm.n_ctx()))
        held = 0
        if seq == 0:  # what the Llama holds of the prompt and can keep (cut back to it now)
            cap = min(cap, len(ids) - 1)
            held = self._keep(min(self.held(ids), cap))
        while cap > held:
            want = self.lookup(ids, max_tokens=cap)
            if want <= held:
                return 0
            k = np.empty((want, 2), np.uint8)
            v = np.empty((want, 2), np.uint8)
            got = self.store.restore(ids[:want], LayerKV(self.fp, [k], [v]), max_tokens=want)
            n = int(got.tokens)
            if n > held and got.state is not None and self._set(got.state, seq):
                if seq == 0:  # what Llama evaluates next goes on from these tokens
                    self.llm.input_ids[:n] = ids[:n]
                    self.llm.n_tokens = n
                if got.source in ("ram", "pending"):  # a whole restore from RAM took it out
                    self.park_state(ids[:n], got.state)
                return n
            if seq == 0 and n > held and got.state is not None:  # refused: the sequence is empty
                self.llm.n_tokens = held = 0
            cap = want - 1  # this checkpoint is damaged or refused: the deepest one below it
        return 0

    def prefill(
        self, prompt: TokenIds, *, every: int = 0, max_tokens: int | None = None
    ) -> list[int]:
        """Evaluate ``prompt`` in sequence 0 of the ``Llama`` from what it holds up to its
        last checkpoint (:func:`checkpoint_lengths` with the model's end-of-generation tokens
        and ``every``) at or below ``max_tokens`` (default ``len(prompt) - 1``), parking the
        state at each checkpoint past what it held. Returns the lengths parked. What the
        ``Llama`` held past the prompt's prefix is dropped first (all of it, for a memory that
        cannot be cut back). A park that fails raises; the tokens evaluated stay held."""
        import llama_cpp

        ids = as_tokens(prompt)
        cap = min(_cap(len(ids), max_tokens), len(ids) - 1, int(self.llm.n_ctx()))
        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        eog = [t for t in np.unique(ids[:cap]) if llama_cpp.llama_vocab_is_eog(vocab, int(t))]
        start = self._keep(min(self.held(ids), cap))
        marks = [c for c in checkpoint_lengths(ids[:cap], eog, every) if c > start]
        parked = []
        for c in marks:
            self.llm.eval(ids[self.llm.n_tokens : c].tolist())
            self.park_state(ids[:c], self._get(0))
            parked.append(c)
        return parked


def _token_halves(ids: npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.uint8], ...]:
    """A token's page entry: its id, little endian, the low two bytes as "K", the high as
    "V"."""
    b = ids.astype("<u4").view(np.uint8).reshape(-1, 4)
    return np.ascontiguousarray(b[:, :2]), np.ascontiguousarray(b[:, 2:])


def _cap(n: int, max_tokens: int | None) -> int:
    return n - 1 if max_tokens is None else max(0, min(n, max_tokens))
