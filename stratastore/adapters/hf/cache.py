"""The transformers adapter's ``DynamicCache`` side (:mod:`stratastore.adapters.hf`)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.adapters.hf.model import (
    Messages,
    config_dtype,
    cuts_from_chat_template,
    fingerprint_for,
    geometry,
    ids_of,
    refuse_sliding,
    sliding_window_of,
)
from stratastore.adapters.hf.tensors import CacheBuffers, cache_rows, packed
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.restore import deliver_capture
from stratastore.tiers.records import ParkReport

__all__ = ["TransformersCache", "cuts_from_chat_template", "fingerprint_for", "sliding_window_of"]


def _cap(ids: npt.NDArray[np.int64], max_tokens: int | None) -> int:
    """A restore's cap: ``max_tokens``, by default ``len(prompt) - 1`` (a token to compute)."""
    return max(0, len(ids) - 1) if max_tokens is None else max_tokens


class TransformersCache:
    """A :class:`~stratastore.Store` for one transformers model (batch size 1 caches).

    Every method is as thread-safe as the Store's. The caches :meth:`restore` returns live on
    ``device`` (the CPU by default; a CUDA device restores straight into CUDA tensors, validated
    there), in the adapter's dtype. A cache on CUDA parks from the device (hashed there, copied
    to the host once)."""

    def __init__(
        self,
        store: Store,
        config: Any,
        fp: ModelFingerprint,
        dtype: Any,
        tokenizer: Any = None,
        device: Any = "cpu",
    ) -> None:
        import torch

        self.store, self.config, self.fp, self.dtype = store, config, fp, dtype
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.layers, self.heads, self.head_dim = geometry(config)

    @classmethod
    def open(
        cls,
        config: Any,
        model_id: str,
        store_config: StoreConfig | dict[str, Any] | str | None = None,
        *,
        dtype: Any = None,
        page_tokens: int = 16,
        tokenizer: Any = None,
        device: Any = "cpu",
        **store_kw: Any,
    ) -> TransformersCache:
        """Open a Store for this model; ``dtype`` defaults to the config's ``dtype`` (read
        without the deprecated ``torch_dtype``: opening logs and warns nothing), else float32.
        ``tokenizer``, when given, supplies the chat template :meth:`park`'s ``messages`` use.
        ``device``: where restored caches live (``"cpu"``, or ``"cuda"``/``"cuda:N"``: restored
        into CUDA tensors and validated on the GPU).

        A config whose cache keeps a sliding window (:func:`sliding_window_of`) is refused with
        a :class:`ConfigError` naming the window, before anything is opened."""
        import torch

        refuse_sliding(config)
        dtype = dtype or config_dtype(config)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, dtype)
        dtype = dtype or torch.float32
        fp = fingerprint_for(config, model_id, dtype, page_tokens=page_tokens)
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(
                f"device={device!r} is not a torch device ({e}): pass 'cpu' or 'cuda[:N]'"
            ) from None
        return cls(Store.open(fp, store_config, **store_kw), config, fp, dtype, tokenizer, where)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> TransformersCache:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """The Store's counters and what each level holds (:meth:`Store.stats`)."""
        return self.store.stats()

    # -- the engine's calls -------------------------------------------------------------------
    def park(
        self,
        conv_id: str,
        token_ids: Any,
        cache: Any,
        checkpoints: Sequence[int] = (),
        *,
        pinned: Sequence[int] = (),
        pin: bool = False,
        tail: bool = True,
        messages: Messages | None = None,
    ) -> ParkReport:
        """Keep ``cache`` (a ``DynamicCache`` holding exactly ``token_ids``) under ``conv_id``.

        ``checkpoints`` are the token lengths a later prompt may resume at (message ends; the
        whole conversation always is one); each ends a segment. ``messages`` (with the
        ``tokenizer`` given to :meth:`open`) adds the message ends the chat template gives
        (:func:`cuts_from_chat_template`). ``pinned`` lengths are checkpoints that retention
        never drops and a truncation never cuts below (the system prompt: its length is the
        first of :func:`cuts_from_chat_template`); ``pin=True`` pins the RAM entry itself
        (:meth:`Store.park`). ``tail`` adds a checkpoint at ``len - 1``, the first retention
        victim, so that the same prompt again restores all but its last token. Each K/V byte is
        copied once, into the stored layout."""
        ids = as_tokens(ids_of(token_ids))
        n = len(ids)
        rows = cache_rows(cache, n, self.dtype, self.layers, self.heads, self.head_dim)
        wanted = {*checkpoints, *pinned}
        if messages is not None:
            wanted.update(cuts_from_chat_template(self._tokenizer("park"), messages, ids))
        lengths = sorted({*(c for c in wanted if 0 < c < n), n})
        tail_at = n - 1 if tail and n - 1 > 0 and n - 1 not in lengths else None
        if tail_at is not None:
            lengths = sorted({*lengths, tail_at})
        cuts = [0, *lengths[:-1]]  # a segment per message: each checkpoint ends one
        kv = packed(self.fp, cache, rows, n, cuts)
        chain = [Checkpoint(x, pinned=x in pinned, tail=x == tail_at) for x in lengths]
        return self.store.park(Conversation(conv_id, ids, chain, cuts=cuts), kv, pin=pin)

    def lookup(self, prompt_ids: Any, *, max_tokens: int | None = None) -> int:
        """How many leading tokens of the prompt :meth:`restore` would bring back (0: none),
        with the same ``max_tokens`` (default ``len(prompt) - 1``)."""
        ids = ids_of(prompt_ids)
        hit = self.store.lookup(ids[: _cap(ids, max_tokens)])
        return hit[1] if hit else 0

    def restore(self, prompt_ids: Any, *, max_tokens: int | None = None) -> tuple[Any, int]:
        """``(DynamicCache, n)``: the deepest stored prefix of the prompt, ``n`` tokens, all
        validated; ``(None, 0)`` when nothing matches. Prefill ``prompt_ids[n:]`` with it.

        ``n`` is at most ``max_tokens``, by default ``len(prompt) - 1``: the model needs the
        last prompt token's logits, so the engine always has at least one token to compute
        (docs/engine.md). Pass ``len(prompt)`` to allow the whole prompt. The bytes
        land once, in the tensors the cache holds (nothing is zero-filled or copied after)."""
        ids = ids_of(prompt_ids)
        cap = _cap(ids, max_tokens)
        buf = CacheBuffers(self.fp, self.dtype, len(ids), self.device)  # room for the prompt
        r = self.store.restore(ids, buf.dest, max_tokens=cap)
        return (buf.cache(self.config, r.tokens), r.tokens) if r.tokens else (None, 0)

    def restore_many(
        self, prompts: Sequence[Any], *, max_tokens: int | Sequence[int | None] | None = None
    ) -> list[tuple[Any, int]]:
        """:meth:`restore` for several prompts at once, through :meth:`Store.restore_many` (one
        batched read agenda): a ``(DynamicCache, n)`` or ``(None, 0)`` per prompt, in order.
        ``max_tokens``: one cap for all, or one (``None``: ``len(prompt) - 1``) per prompt.
        When some fail, :class:`~stratastore.BatchRestoreError` carries the Store's results."""
        ids = [ids_of(p) for p in prompts]
        if max_tokens is None or isinstance(max_tokens, (int, np.integer)):
            caps = [_cap(i, None if max_tokens is None else int(max_tokens)) for i in ids]
        elif len(max_tokens) == len(ids):
            caps = [_cap(i, c) for i, c in zip(ids, max_tokens, strict=True)]
        else:
            raise ConfigError(
                f"restore_many: max_tokens must be an int, None, or one per prompt "
                f"({len(ids)}), not {max_tokens!r}"
            )
        bufs = [CacheBuffers(self.fp, self.dtype, len(i), self.device) for i in ids]
        got = self.store.restore_many(
            [(i, b.dest) for i, b in zip(ids, bufs, strict=True)], max_tokens=caps
        )
        return [
            (b.cache(self.config, r.tokens), r.tokens) if r.tokens else (None, 0)
            for b, r in zip(bufs, got, strict=True)
        ]

    # -- saved sessions (never evicted) -----------------------------------------------------------
    def save_session(
        self, name: str, token_ids: Any, cache: Any, checkpoints: Sequence[int] = ()
    ) -> None:
        """Save ``cache`` (holding exactly ``token_ids``) as the session ``name``: durable when
        this returns, never evicted (:meth:`Store.save_session`; sessions and conversations
        share one namespace)."""
        ids = as_tokens(ids_of(token_ids))
        n = len(ids)
        rows = cache_rows(cache, n, self.dtype, self.layers, self.heads, self.head_dim)
        lengths = sorted({*(c for c in checkpoints if 0 < c < n), n})
        kv = packed(self.fp, cache, rows, n, [0, *lengths[:-1]])  # the Store's session segments
        self.store.save_session(name, ids, kv, checkpoints)

    def load_session(self, name: str, *, capacity: int | None = None) -> tuple[Any, int]:
        """``(DynamicCache, n)``: the saved session ``name``, whole (its ``n`` tokens). The
        Store loads a session into a buffer it must be given first: ``capacity`` bounds the
        session's tokens (default: the config's ``max_position_embeddings``; address space
        only, the pages a session does not fill are never touched)."""
        cap = capacity or int(getattr(self.config, "max_position_embeddings", 0) or 0)
        if cap <= 0:
            raise ConfigError(f"load_session {name!r}: pass capacity= (the most tokens it holds)")
        flat = np.empty(cap * self.fp.token_bytes, np.uint8)
        conv = self.store.load_session(name, flat)
        n = len(conv.tokens)
        buf = CacheBuffers(self.fp, self.dtype, n, self.device)
        starts = list(conv.cuts) or [0]
        deliver_capture(
            buf.dest,
            flat[: n * self.fp.token_bytes],
            list(zip(starts, [*starts[1:], n], strict=True)),
            n,
            self.fp,
        )
        return buf.cache(self.config, n), n

    def delete_session(self, name: str) -> bool:
        """Remove the saved session ``name``; False when there is none."""
        return self.store.delete_session(name)

    # -- checks -------------------------------------------------------------------------------
    def _tokenizer(self, call: str) -> Any:
        if self.tokenizer is None:
            raise ConfigError(
                f"{call}: messages= needs the tokenizer (TransformersCache.open("
                "..., tokenizer=tok)) whose chat template renders them"
            )
        return self.tokenizer
