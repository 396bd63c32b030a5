"""A stratastore :class:`~stratastore.Store` under a llama-cpp-python ``Llama``: park a sequence's
K/V, restore the deepest stored prefix of a prompt into a sequence.

A park reads the sequence's state from llama.cpp (``llama_state_seq_get_data``), checks it is
the layout this context writes (:func:`~.state.read_state`) and stores each token's K and V
rows as pages of the store's format: equal prefixes share segments, every page is BLAKE3-hashed.
A restore reads the deepest stored prefix of the prompt (every page validated before it is
used; a damaged page restores the prefix before it), builds llama.cpp's sequence state for
those tokens and loads it (``llama_state_seq_set_data``); llama.cpp evaluates the rest of the
prompt. Sequence 0 is the one ``Llama`` evaluates: a restore there also tells ``Llama`` which
tokens its context now holds, so ``eval``, ``generate`` and ``create_completion`` go on from
them.

When a park is durable (spec F-DUR; the store's ``park`` setting, docs/configuration.md): a
park hands the Store the rows as a :class:`~stratastore.restore.LayerKV`, so with
``park = "disk"`` and no remote level or system-prompt cache it is written within the call
and durable when :meth:`LlamaCppStore.park` returns with ``where == "disk"`` (an I/O error
raises from ``park``). Otherwise (``park = "ram"``, the default, whose disk copy the background
writer makes; a remote level; a system-prompt cache) the store keeps a copy and writes it
later: it is durable once :meth:`LlamaCppStore.flush` or :meth:`LlamaCppStore.close` returns,
and a write that failed is raised there (:class:`~stratastore.facade.SpillError`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from numbers import Integral
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.adapters.llamacpp.chat import cuts_from_chat_template
from stratastore.adapters.llamacpp.identity import context_layout, fingerprint
from stratastore.adapters.llamacpp.state import (
    Layout,
    read_state,
    state_buffer,
    state_of_rows,
    transpose_v_rows,
)
from stratastore.adapters.weights_digest import explain_refusal
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import StrataError
from stratastore.facade import Store
from stratastore.format import IncompatibleFingerprint, ModelFingerprint
from stratastore.restore import LayerKV
from stratastore.tiers.records import ParkReport

__all__ = ["LlamaCppStore", "TokenIds"]

TokenIds = Sequence[int] | npt.NDArray[np.integer[Any]]  #: token ids: a list, or a numpy array


class LlamaCppStore:
    """A Store for one ``llama_cpp.Llama`` context (its model, K/V types and settings: the
    fingerprint, :func:`~.identity.fingerprint`). As thread-safe as the Store for the store's
    side; llama.cpp's context is not: call it from the thread that drives the ``Llama``."""

    def __init__(self, llm: Any, store: Store, fp: ModelFingerprint, layout: Layout) -> None:
        self.llm, self.store, self.fp, self.layout = llm, store, fp, layout

    @classmethod
    def open(
        cls,
        llm: Any,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        *,
        page_tokens: int = 16,
        **store_kw: Any,
    ) -> LlamaCppStore:
        """Open the Store for ``llm``'s fingerprint (its GGUF, K/V types and RoPE settings);
        a store directory holding another model's K/V refuses it (spec F-DIR-6).
        :class:`~stratastore.ConfigError` for a context the adapter cannot read
        (:func:`~.identity.context_layout`)."""
        layout = context_layout(llm)
        fp = fingerprint(llm, layout, page_tokens=page_tokens)
        try:
            store = Store.open(fp, store_config, **store_kw)
        except IncompatibleFingerprint as e:
            raise explain_refusal(e) from None
        return cls(llm, store, fp, layout)

    def flush(self) -> None:
        """Wait until every park handed to the store's disk writer is durable, then raise
        :class:`~stratastore.facade.SpillError` naming each acknowledged park whose disk write
        failed since the last report (once), as :meth:`~stratastore.Store.flush` does. A park
        written within its call (``park = "disk"``, see the module) is durable already."""
        self.store.flush()

    def close(self) -> None:
        """Write down what only RAM holds, wait for every write (as :meth:`flush`, raising its
        :class:`~stratastore.facade.SpillError`) and close the store."""
        self.store.close()

    def __enter__(self) -> LlamaCppStore:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the sequence's state ------------------------------------------------------------------
    def _get(self, seq: int) -> memoryview:
        """Sequence ``seq``'s state, in memory llama.cpp wrote it into (no copy after)."""
        import llama_cpp

        self._check_seq(seq)
        n = int(llama_cpp.llama_state_seq_get_size(self.llm.ctx, seq))
        buf = (ctypes.c_uint8 * n)()
        got = int(llama_cpp.llama_state_seq_get_data(self.llm.ctx, buf, n, seq))
        if got != n:
            raise StrataError(f"llama.cpp wrote {got} of the {n} bytes of sequence {seq}'s state")
        return memoryview(buf).cast("B")

    def _set(self, data: npt.NDArray[np.uint8], seq: int) -> None:
        import llama_cpp

        self._check_seq(seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data.data)  # the state's own memory
        got = int(llama_cpp.llama_state_seq_set_data(self.llm.ctx, buf, len(data), seq))
        if got != len(data):
            raise StrataError(
                f"llama.cpp refused the restored state of sequence {seq} (read {got} of "
                f"{len(data)} bytes; the sequence is now empty): its context is not the one "
                "this store was opened for"
            )

    def _check_seq(self, seq: int) -> None:
        check_seq(self.llm, seq)

    def _halves(
        self, rows: npt.NDArray[np.uint8]
    ) -> tuple[list[npt.NDArray[np.uint8]], list[npt.NDArray[np.uint8]]]:
        half = self.fp.head_dim
        k = [np.ascontiguousarray(rows[i, :, :half]) for i in range(self.layout.n_layer)]
        v = [np.ascontiguousarray(rows[i, :, half:]) for i in range(self.layout.n_layer)]
        return k, v

    def held(self, prompt: TokenIds) -> int:
        """How many leading tokens of ``prompt`` sequence 0 of the ``Llama`` holds now."""
        return held_prefix(self.llm, prompt)

    # -- the engine's calls --------------------------------------------------------------------
    def park(
        self,
        conv_id: str,
        token_ids: TokenIds | None = None,
        *,
        seq: int = 0,
        checkpoints: Sequence[int] = (),
        pinned: Sequence[int] = (),
        tail: bool = True,
        cuts: Sequence[int] = (),
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> ParkReport:
        """Keep sequence ``seq``'s K/V under ``conv_id``. ``token_ids``: the tokens it holds
        (default, for sequence 0: the ``Llama``'s evaluated tokens); they must be as many as
        its cells, at positions ``0..n-1``. ``checkpoints`` are lengths a later prompt may
        resume at (message ends; the whole sequence always is one), each ending a segment;
        ``pinned`` ones retention never drops (the system prompt); ``tail`` adds ``n - 1``, so
        the same prompt again restores all but its last token. ``cuts``: more lengths a
        segment ends at, not kept as checkpoints (turn openers: a conversation parked again
        after another turn shares every earlier segment with its last park, whichever
        checkpoints retention dropped since). ``messages`` (the chat the tokens hold) adds each
        message's end from the GGUF's chat template as a checkpoint
        (:func:`~.chat.cuts_from_chat_template`; its first is the system prompt's end, the
        length to pin). The store keeps the checkpoints under its ``checkpoints`` and
        ``retention`` settings across the parks of ``conv_id``
        (:meth:`~stratastore.Store.park`). :class:`~.state.StateLayoutError` when the state is
        not this context's layout. Durable when it returns with ``where == "disk"`` under
        ``park = "disk"``; otherwise once :meth:`flush` or :meth:`close` returns (see the
        module)."""
        self._check_seq(seq)
        if token_ids is None:
            if seq != 0:
                raise StrataError(f"park of sequence {seq}: pass its token_ids")
            token_ids = list(self.llm.input_ids[: self.llm.n_tokens])
        rows = read_state(self._get(seq), self.layout)
        if messages is not None:
            ends = cuts_from_chat_template(self.llm, messages, list(token_ids))
            checkpoints = [*checkpoints, *ends]
        return self.park_rows(
            conv_id, token_ids, rows, checkpoints=checkpoints, pinned=pinned, tail=tail, cuts=cuts
        )

    def park_rows(
        self,
        conv_id: str,
        token_ids: TokenIds,
        rows: npt.NDArray[np.uint8],
        *,
        checkpoints: Sequence[int] = (),
        pinned: Sequence[int] = (),
        tail: bool = True,
        cuts: Sequence[int] = (),
    ) -> ParkReport:
        """:meth:`park` of rows already read (``[layers, n, k_row + v_row]``, as
        :func:`~.state.read_state` gives them) for the ``n`` tokens ``token_ids``."""
        ids = as_tokens(token_ids, f"park of {conv_id!r}: token_ids")
        n = rows.shape[1]
        if n != len(ids) or n == 0:
            raise StrataError(f"park of {conv_id!r}: {n} tokens' K/V, {len(ids)} tokens given")
        lengths = sorted({*(c for c in (*checkpoints, *pinned) if 0 < c < n), n})
        tail_at = n - 1 if tail and n > 1 and n - 1 not in lengths else None
        if tail_at is not None:
            lengths = sorted({*lengths, tail_at})
        chain = [Checkpoint(x, pinned=x in pinned, tail=x == tail_at) for x in lengths]
        k, v = self._halves(rows)
        bad = [
            c for c in cuts if isinstance(c, bool) or not isinstance(c, Integral) or not 0 <= c <= n
        ]
        if bad:
            raise StrataError(
                f"park of {conv_id!r}: cuts {bad[:4]} are not token counts in 0..{n} (a cut is "
                "where a segment ends: a message opener, an integer within the tokens parked)"
            )
        starts = sorted({0, *lengths[:-1], *(int(c) for c in cuts if 0 < c < n)})
        conv = Conversation(conv_id, ids, chain, cuts=starts)
        return self.store.park(conv, LayerKV(self.fp, k, v))

    def lookup(self, prompt: TokenIds, *, max_tokens: int | None = None) -> int:
        """How many leading tokens of ``prompt`` are stored (0: none), at most ``max_tokens``
        (as :meth:`restore`): what a restore brings back unless a page fails validation."""
        ids = as_tokens(prompt)
        hit = self.store.lookup(ids[: _cap(len(ids), max_tokens)])
        return hit[1] if hit else 0

    def prefix_state(
        self,
        prompt: TokenIds,
        *,
        max_tokens: int | None = None,
        seq: int = 0,
        arch: str | None = None,
        beyond: int = 0,
    ) -> tuple[int, npt.NDArray[np.uint8]]:
        """``(n, state)``: the deepest stored prefix of ``prompt``, ``n`` tokens (at most
        ``max_tokens``, by default ``len(prompt) - 1``), every page validated, as llama.cpp's
        state of sequence ``seq`` holding them (with ``arch``: the whole-context state,
        ``Llama.load_state``'s); ``(0, empty)`` when no more than ``beyond`` tokens of it are
        stored (nothing is read then: the caller holds as much already). Loads nothing into
        llama.cpp. With K and V rows of one size the pages are read straight into the state's
        K and V regions (a transposed V as rows, then transposed in place a layer at a time:
        :func:`~.state.transpose_v_rows`); otherwise into per-layer rows, the state built from
        them in one pass."""
        ids = as_tokens(prompt)
        cap = min(_cap(len(ids), max_tokens), int(self.llm.n_ctx()))  # what the context holds
        half, layers, kr = self.fp.head_dim, self.layout.n_layer, self.layout.k_row
        want = self.lookup(ids, max_tokens=cap) if cap > 0 else 0
        if want <= beyond:
            return 0, np.empty(0, np.uint8)
        if kr == half:  # K and V rows of one size: the stored halves are the rows
            # the pages land in the state itself: K and V in their regions (V as rows there,
            # transposed in place after when the layout keeps it transposed)
            state, ks, vs = state_buffer(want, self.layout, seq_id=seq, arch=arch)
            v = [region.reshape(want, half) for region in vs]
            n = int(self.store.restore(ids[:want], LayerKV(self.fp, ks, v), max_tokens=want).tokens)
            if n == want:
                if self.layout.v_trans:
                    transpose_v_rows(vs, self.layout)
                return n, state
            k_rows, v_rows = (lambda i: ks[i][:n]), (lambda i: v[i][:n])  # a damaged page
        else:  # a token's row (K then V) is stored split at its middle: one spans the halves
            k = [np.empty((want, half), np.uint8) for _ in range(layers)]
            v = [np.empty((want, half), np.uint8) for _ in range(layers)]
            n = int(self.store.restore(ids[:want], LayerKV(self.fp, k, v), max_tokens=want).tokens)
            if kr < half:
                k_rows = lambda i: k[i][:n, :kr]  # noqa: E731
                v_rows = lambda i: np.concatenate([k[i][:n, kr:], v[i][:n]], axis=1)  # noqa: E731
            else:
                k_rows = lambda i: np.concatenate([k[i][:n], v[i][:n, : kr - half]], axis=1)  # noqa: E731
                v_rows = lambda i: v[i][:n, kr - half :]  # noqa: E731
        if n == 0:
            return 0, np.empty(0, np.uint8)
        return n, state_of_rows(k_rows, v_rows, n, self.layout, seq_id=seq, arch=arch)

    def restore(self, prompt: TokenIds, *, seq: int = 0, max_tokens: int | None = None) -> int:
        """Load the deepest stored prefix of ``prompt`` into sequence ``seq`` (what it held is
        replaced) and return its length ``n`` (0: nothing stored, the sequence untouched);
        evaluate ``prompt[n:]`` after it. ``n`` is at most ``max_tokens``, by default
        ``len(prompt) - 1`` (the model needs the last prompt token's logits), and for sequence
        0 never more (``Llama`` samples from the logits of a decode). Every page is validated
        before it is used; a damaged page restores the prefix before it.

        For sequence 0, when the ``Llama`` already holds at least as long a prefix of the prompt
        as the store would bring back (a conversation still in its context), nothing is read and
        0 is returned: ``generate`` goes on from what it holds."""
        ids = as_tokens(prompt)
        self._check_seq(seq)
        held = 0
        if seq == 0:  # Llama samples from a decode: it keeps at least one token to evaluate
            max_tokens = min(_cap(len(ids), max_tokens), len(ids) - 1)
            held = self.held(ids)
        n, state = self.prefix_state(ids, max_tokens=max_tokens, seq=seq, beyond=held)
        if n <= held:  # nothing stored, or a damaged page left no more than the Llama holds
            return 0
        try:
            self._set(state, seq)
        except StrataError:
            if seq == 0:
                self.llm.n_tokens = 0
            raise
        if seq == 0:  # what Llama evaluates next goes on from these tokens, as load_state does
            self.llm.input_ids[:n] = ids[:n]
            self.llm.n_tokens = n
        return n


def check_seq(llm: Any, seq: int) -> None:
    """:class:`StrataError` unless ``seq`` is one of ``llm``'s context's sequences."""
    import llama_cpp

    n_seq = int(llama_cpp.llama_n_seq_max(llm.ctx))
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < n_seq:
        raise StrataError(
            f"sequence {seq!r} is not one of this context's 0..{n_seq - 1} (its n_seq_max "
            f"is {n_seq}): `Llama` evaluates sequence 0; others are for callers that drive "
            "llama.cpp's batches themselves"
        )


def held_prefix(llm: Any, prompt: TokenIds) -> int:
    """How many leading tokens of ``prompt`` sequence 0 of ``llm`` holds now."""
    ids = as_tokens(prompt)
    held = np.asarray(llm.input_ids[: llm.n_tokens])
    n = min(len(held), len(ids))
    differ = np.flatnonzero(held[:n] != ids[:n])
    return int(differ[0]) if len(differ) else n


def _cap(n: int, max_tokens: int | None) -> int:
    return n - 1 if max_tokens is None else max(0, min(n, max_tokens))
