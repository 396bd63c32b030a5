"""The transformers adapter (issues 7 and 14): park a ``DynamicCache`` with its token ids and
checkpoints, look up a prompt, restore the matched prefix into a new ``DynamicCache``; restore
several prompts in one batch, save and load named sessions, pin the system prompt, find the
message openers from a tokenizer's chat template, and read the Store's counters.

Install with the ``transformers`` extra (``torch==2.13.0`` and transformers). The worked
example of docs/engine.md (``ids``: the conversation's token ids, ``[1, n]``)::

    from stratastore.adapters.hf import TransformersCache, cuts_from_chat_template

    with TransformersCache.open(model.config, "my-org/my-model@rev", store_config,
                                tokenizer=tokenizer) as kv:
        out = model(input_ids=ids, use_cache=True)
        system_end = cuts_from_chat_template(tokenizer, messages)[:1]
        kv.park("chat-1", ids, out.cache, messages=messages, pinned=system_end)
        cache, n = kv.restore(prompt_ids)  # n <= len(prompt) - 1 tokens are in `cache`
        out = model(input_ids=prompt_ids[:, n:], cache=cache, use_cache=True)

``cache=`` (and ``out.cache``) is the name transformers 5.24 gives the K/V cache; it accepts
the older ``past_key_values`` with a deprecation warning until 5.40. Before 5.24 the name is
``past_key_values`` and a ``cache=`` keyword is silently ignored (the model would compute
without the restored prefix).

The model fingerprint (spec F-FP) is the model id and the architecture fields of the config
that shape or produce K/V, so a different config never matches (a store directory written for
one fingerprint refuses another, spec F-DIR-6). K/V are moved as raw bytes, so fp32, fp16 and
bfloat16 round-trip bit-exactly. Only caches that hold the whole prefix are supported: a config
with a sliding window (or chunked attention) is refused at :meth:`TransformersCache.open`.

Copies (issue 14): a park copies each K/V byte once, from the cache's tensors straight into
the stored page layout (the transpose is that copy); a restore has the Store write each byte
into the per-layer tensors the returned ``DynamicCache`` holds, and copies nothing after (a RAM
hit is staged once inside the Store for a per-layer destination; a disk hit is read straight
into the tensors) (views ``[1, kv_heads, n, head_dim]`` of
``[tokens, kv_heads, head_dim]`` buffers: the model's next forward concatenates onto them, as
it does on any ``DynamicCache``). Nothing is zero-filled: past the restored prefix a buffer
holds whatever it held, and only ``[:n]`` is read.

On a GPU (issue 15 item 3): a cache whose tensors live on CUDA is packed into the stored layout
on the device (one strided torch copy per layer, K/V and page run), hashed there and copied to
the host once (:meth:`Store.park` with device memory); with ``device="cuda"`` at
:meth:`TransformersCache.open`, restores land in CUDA tensors, validated on the device
(:class:`~stratastore.restore.DeviceLayerKV`). Nothing goes through ``.to("cpu")`` in the
adapter.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from numba_kernels.cpu import parallel_run
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.restore import Destination, DeviceLayerKV, LayerKV, deliver_capture
from stratastore.restore.destinations import page_runs
from stratastore.tiers.tiered import ParkReport

__all__ = ["TransformersCache", "cuts_from_chat_template", "fingerprint_for", "sliding_window_of"]

#: config fields that change what a model's K/V are (hashed into the fingerprint's extra)
_ARCH_FIELDS = (
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rope_theta",
    "rope_scaling", "rope_parameters", "max_position_embeddings", "rms_norm_eps",
    "attention_bias", "sliding_window", "partial_rotary_factor", "tie_word_embeddings",
)  # fmt: skip

_DTYPES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}

Messages = Sequence[Mapping[str, Any]]


def _geometry(config: Any) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return layers, heads, int(head_dim)


def fingerprint_for(config: Any, model_id: str, dtype: Any, *, page_tokens: int = 16
                    ) -> ModelFingerprint:  # fmt: skip
    """The fingerprint of ``model_id`` (name and revision: the weights) with ``config``'s K/V
    geometry and architecture, for caches of torch ``dtype``."""
    if str(dtype) not in _DTYPES:
        raise ConfigError(f"K/V dtype {dtype} is not supported; use float16, bfloat16 or float32")
    layers, heads, head_dim = _geometry(config)
    arch = {f: getattr(config, f, None) for f in _ARCH_FIELDS}
    extra = json.dumps(arch, sort_keys=True, default=str).encode()
    return ModelFingerprint.create(model_id, n_layers=layers, n_kv_heads=heads,
                                   head_dim=head_dim, page_tokens=page_tokens,
                                   dtype=_DTYPES[str(dtype)], extra=extra)  # fmt: skip


def sliding_window_of(config: Any) -> int | None:
    """The window of a config whose cache keeps only its last tokens, or ``None`` when every
    layer's cache keeps the whole prefix.

    A window is in use when ``layer_types`` names sliding (or chunked) attention, when
    ``use_sliding_window`` is set, when ``sliding_window`` (or ``attention_chunk_size``) is
    set and smaller than ``max_position_embeddings``, or when transformers itself builds a
    sliding layer for the config's ``DynamicCache``."""
    window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size",
                                                                 None)  # fmt: skip
    types = [str(t) for t in getattr(config, "layer_types", None) or ()]
    longest = getattr(config, "max_position_embeddings", None)
    use = getattr(config, "use_sliding_window", None)  # Qwen2: False turns the field off
    in_use = (
        any("sliding" in t or "chunked" in t for t in types)
        or use is True
        or (use is not False and window is not None
            and (longest is None or int(window) < int(longest)))
        or _builds_sliding_layers(config)
    )  # fmt: skip
    if not in_use:
        return None
    return int(window) if window else -1  # -1: sliding layers whose window the config omits


def _builds_sliding_layers(config: Any) -> bool:
    """Whether ``DynamicCache(config=config)`` keeps a sliding window in some layer."""
    from transformers import DynamicCache

    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot build a cache for: the fields decide
        return False
    return any(getattr(layer, "is_sliding", False) for layer in layers)


def _refuse_sliding(config: Any) -> None:
    """Raise :class:`ConfigError` naming the window when ``config``'s cache keeps one."""
    window = sliding_window_of(config)
    if window is None:
        return
    fields = [f"{f}={getattr(config, f)}" for f in ("sliding_window", "attention_chunk_size",
              "use_sliding_window") if getattr(config, f, None) not in (None, False)]  # fmt: skip
    types = [str(t) for t in getattr(config, "layer_types", None) or ()]
    layers = [i for i, t in enumerate(types) if "sliding" in t or "chunked" in t]
    if layers:
        fields.append(f"layers {layers} of layer_types slide")
    size = f"a sliding window of {window} tokens" if window > 0 else "a sliding window"
    last = f"its last {window} tokens" if window > 0 else "its last tokens"
    raise ConfigError(
        f"{getattr(config, 'model_type', None) or 'this model'} keeps {size} in its K/V cache "
        f"({', '.join(fields) or 'its cache layers slide'}): such a cache holds only {last}, so "
        "its K/V are not the whole prefix the store keys them by and could not be continued "
        "after a restore; this adapter stores full-attention caches only (a model trained "
        "without a window: set sliding_window=None)"
    )


def _config_dtype(config: Any) -> Any:
    """The config's dtype without touching transformers 5's deprecated ``torch_dtype``
    property (whose read logs a warning): ``config.dtype``, else a ``torch_dtype`` stored as a
    plain attribute (transformers 4 configs)."""
    found = getattr(config, "dtype", None)
    if found is None:
        found = getattr(config, "__dict__", {}).get("torch_dtype")
    return found


def _ids(token_ids: Any) -> npt.NDArray[np.int64]:
    """Token ids from a list, a numpy array or a (1, n) / (n,) tensor."""
    if hasattr(token_ids, "detach"):
        token_ids = token_ids.detach().to("cpu").numpy()
    a = np.asarray(token_ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1:
        raise ConfigError(f"token ids must be one sequence, got shape {a.shape}")
    return a.astype(np.int64)


def _cap(ids: npt.NDArray[np.int64], max_tokens: int | None) -> int:
    """A restore's cap: ``max_tokens``, by default ``len(prompt) - 1`` (a token to compute)."""
    return max(0, len(ids) - 1) if max_tokens is None else max_tokens


def _render(tokenizer: Any, messages: Messages) -> list[int]:
    """The token ids of ``messages`` rendered by the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=False)
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(t) for t in out]


def cuts_from_chat_template(tokenizer: Any, messages: Messages,
                            token_ids: Any = None) -> list[int]:  # fmt: skip
    """Where each message ends (the next one's opener starts), in tokens: the lengths of the
    chat template rendered on ``messages[:i]`` for ``i = 1 .. len(messages)``, ascending.

    The first is the end of the system prompt when ``messages[0]`` is one (the length to pin).
    With ``token_ids`` (the conversation as parked), a length counts only where its rendering is
    a prefix of ``token_ids``: a template that rewrites earlier messages once later ones exist
    (one that drops past reasoning), or a tokenizer that merges across the boundary, gives no
    cut there, never a wrong one. Raises :class:`ConfigError` for a tokenizer without a chat
    template."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("the tokenizer has no chat_template: message openers come from it; "
                          "pass checkpoints= instead")  # fmt: skip
    ids = None if token_ids is None else _ids(token_ids)
    cuts: list[int] = []
    for i in range(1, len(messages) + 1):
        rendered = _render(tokenizer, messages[:i])
        n = len(rendered)
        if n == 0 or (cuts and n <= cuts[-1]):
            continue
        if ids is not None and (n > len(ids) or not np.array_equal(ids[:n], rendered)):
            continue
        cuts.append(n)
    return cuts


# -- moving bytes between torch tensors and the stored layout -----------------------------------
def _token_rows(t: Any) -> npt.NDArray[np.uint8]:
    """One sequence of a cache layer's K or V (``[1, heads, n, dim]``) as bytes ``[n, heads,
    dim * itemsize]``: a strided view of the tensor's own memory for a CPU tensor (no copy); a
    device tensor comes to the host once, and one whose last dimension is strided is made
    contiguous once."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.stride(-1) != 1:
        t = t.contiguous()
    out: npt.NDArray[np.uint8] = t[0].transpose(0, 1).view(torch.uint8).numpy()
    return out


def _pages_of(a: npt.NDArray[np.uint8], n_pages: int, p: int) -> npt.NDArray[np.uint8]:
    """``a`` ``[n_pages * p, heads, d]`` (any strides) as ``[n_pages, p, heads, d]``: a view."""
    s0, s1, s2 = a.strides
    return as_strided(a, (n_pages, p, *a.shape[1:]), (p * s0, s0, s1, s2), writeable=False)


def _heads_of(a: npt.NDArray[np.uint8], heads: int) -> npt.NDArray[np.uint8]:
    """``a`` ``[n_pages, p, row]`` (rows contiguous) as ``[n_pages, p, heads, row / heads]``:
    a writable view, so an assignment lands in ``a``'s memory."""
    d = a.shape[2] // heads
    return as_strided(a, (*a.shape[:2], heads, d), (*a.strides[:2], d, 1), writeable=True)


def _pack(fp: ModelFingerprint, rows: Sequence[tuple[npt.NDArray[np.uint8],
                                                    npt.NDArray[np.uint8]]],
          n: int, cuts: Sequence[int]) -> npt.NDArray[np.uint8]:  # fmt: skip
    """The stored layout (spec F-SEG-4, a segment from each cut) of ``n`` tokens given per
    layer as ``(K, V)`` byte views ``[n, heads, d]`` of any strides: one strided copy per
    layer, K/V and page run, straight from the cache's memory (what ``pack_pages`` does after
    a contiguous copy of each transposed layer)."""
    tb, p = fp.token_bytes, fp.page_tokens
    out = np.empty(n * tb, np.uint8)
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    runs = [run for lo, hi in itertools.pairwise(bounds)
            for run in page_runs(fp, lo, hi - lo, out[lo * tb : hi * tb], p)]  # fmt: skip

    def task(layer: int, kind: int) -> Callable[[], None]:
        src = rows[layer][kind]

        def run() -> None:
            for t0, view in runs:  # [n_pages, layers, 2, q, row]
                n_pages, q = view.shape[0], view.shape[3]
                dst = _heads_of(view[:, layer, kind], fp.n_kv_heads)
                dst[...] = _pages_of(src[t0 : t0 + n_pages * q], n_pages, q)

        return run

    parallel_run([task(i, kind) for i in range(fp.n_layers) for kind in (0, 1)], n * tb)
    return out


def _pack_on_device(fp: ModelFingerprint, layers: Sequence[tuple[Any, Any]], n: int,
                    cuts: Sequence[int]) -> Any:  # fmt: skip
    """The stored layout (spec F-SEG-4, a segment from each cut) of ``n`` tokens given per
    layer as ``(K, V)`` tensors ``[1, heads, n, dim]`` on the device, built on the device: a
    uint8 tensor there, one strided torch copy per layer, K/V and page run (what :func:`_pack`
    does on the host; bit-identical)."""
    import torch

    tb, p = fp.token_bytes, fp.page_tokens
    first = layers[0][0]
    out = torch.empty(n * tb, dtype=torch.uint8, device=first.device)
    bounds = sorted({0, *(c for c in cuts if 0 < c < n), n})
    rows = [tuple((t if t.stride(-1) == 1 else t.contiguous()).detach()[0].transpose(0, 1)
                  .view(torch.uint8) for t in kv) for kv in layers]  # fmt: skip
    for lo, hi in itertools.pairwise(bounds):
        full, rest = divmod(hi - lo, p)
        for t0, count, q in ((lo, full, p), (lo + full * p, 1 if rest else 0, rest)):
            if not count:
                continue
            a = t0 * tb
            view = out[a : a + count * q * tb].view(count, fp.n_layers, 2, q, fp.n_kv_heads, -1)
            for layer, kv in enumerate(rows):
                for kind, src in enumerate(kv):
                    view[:, layer, kind].copy_(src[t0 : t0 + count * q].unflatten(0, (count, q)))
    return out


def _is_cuda(where: Any) -> bool:
    """Whether a tensor (or a torch device) is on a CUDA device."""
    device = getattr(where, "device", where)
    return getattr(device, "type", None) == "cuda"


def _device_view(t: Any) -> Any:
    """A CUDA tensor as device memory numba reads in place (``__cuda_array_interface__``):
    itself, or for bfloat16, which the interface cannot describe, an int16 view of it."""
    import torch

    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class _Buffers:
    """Per-layer K and V tensors ``[tokens, heads, head_dim]`` of the cache's dtype on
    ``device``, never filled (``torch.empty``: a page the restore does not write is never
    touched), and the destination writing into their memory: :class:`LayerKV`, or on CUDA
    :class:`~stratastore.restore.DeviceLayerKV` (validated on the device)."""

    def __init__(self, fp: ModelFingerprint, dtype: Any, tokens: int, device: Any = "cpu"
                 ) -> None:  # fmt: skip
        import torch

        shape = (max(tokens, 1), fp.n_kv_heads, fp.head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(fp.n_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(fp.n_layers)]
        self.dest: Destination
        if _is_cuda(device):
            self.dest = DeviceLayerKV(fp, [_device_view(t) for t in self.k],
                                      [_device_view(t) for t in self.v])  # fmt: skip
        else:
            self.dest = LayerKV(fp, [_byte_view(t) for t in self.k],
                                [_byte_view(t) for t in self.v], read_direct=True)  # fmt: skip

    def cache(self, config: Any, n: int) -> Any:
        """A ``DynamicCache`` of the first ``n`` tokens, holding views of these tensors."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        cache = DynamicCache(config=config)
        plain = len(cache.layers) == len(self.k) and all(
            type(layer) is DynamicLayer for layer in cache.layers
        )
        for i, (k, v) in enumerate(zip(self.k, self.v, strict=True)):
            kt, vt = (t[:n].transpose(0, 1).unsqueeze(0) for t in (k, v))  # [1, heads, n, dim]
            if plain:  # hand the views over: DynamicLayer.update would concatenate (a copy)
                layer = cache.layers[i]
                layer.lazy_initialization(kt, vt)
                layer.keys, layer.values = kt, vt
            else:
                cache.update(kt, vt, i)
        return cache


def _byte_view(t: Any) -> npt.NDArray[np.uint8]:
    """A contiguous tensor ``[tokens, heads, dim]`` as bytes ``[tokens, row]``: its memory."""
    import torch

    out: npt.NDArray[np.uint8] = t.view(torch.uint8).numpy().reshape(t.shape[0], -1)
    return out


class TransformersCache:
    """A :class:`~stratastore.Store` for one transformers model (batch size 1 caches).

    Every method is as thread-safe as the Store's. The caches :meth:`restore` returns live on
    ``device`` (the CPU by default; a CUDA device restores straight into CUDA tensors, validated
    there), in the adapter's dtype. A cache on CUDA parks from the device (hashed there, copied
    to the host once)."""

    def __init__(self, store: Store, config: Any, fp: ModelFingerprint, dtype: Any,
                 tokenizer: Any = None, device: Any = "cpu") -> None:  # fmt: skip
        import torch

        self.store, self.config, self.fp, self.dtype = store, config, fp, dtype
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.layers, self.heads, self.head_dim = _geometry(config)

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
        into CUDA tensors and validated on the GPU, issue 15).

        A config whose cache keeps a sliding window (:func:`sliding_window_of`) is refused with
        a :class:`ConfigError` naming the window, before anything is opened."""
        import torch

        _refuse_sliding(config)
        dtype = dtype or _config_dtype(config)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype, dtype)
        dtype = dtype or torch.float32
        fp = fingerprint_for(config, model_id, dtype, page_tokens=page_tokens)
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(f"device={device!r} is not a torch device ({e}): pass 'cpu' or "
                              "'cuda[:N]'") from None  # fmt: skip
        return cls(Store.open(fp, store_config, **store_kw), config, fp, dtype, tokenizer, where)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> TransformersCache:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()

    def stats(self) -> dict[str, Any]:
        """The Store's counters and what each level holds (:meth:`Store.stats`)."""
        return self.store.stats()

    # -- the engine's calls -------------------------------------------------------------------
    def park(self, conv_id: str, token_ids: Any, cache: Any, checkpoints: Sequence[int] = (),
             *, pinned: Sequence[int] = (), pin: bool = False, tail: bool = True,
             messages: Messages | None = None) -> ParkReport:  # fmt: skip
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
        ids = as_tokens(_ids(token_ids))
        n = len(ids)
        rows = self._rows(cache, n)
        wanted = {*checkpoints, *pinned}
        if messages is not None:
            wanted.update(cuts_from_chat_template(self._tokenizer("park"), messages, ids))
        lengths = sorted({*(c for c in wanted if 0 < c < n), n})
        tail_at = n - 1 if tail and n - 1 > 0 and n - 1 not in lengths else None
        if tail_at is not None:
            lengths = sorted({*lengths, tail_at})
        cuts = [0, *lengths[:-1]]  # a segment per message: each checkpoint ends one
        kv = self._packed(cache, rows, n, cuts)
        chain = [Checkpoint(x, pinned=x in pinned, tail=x == tail_at) for x in lengths]
        return self.store.park(Conversation(conv_id, ids, chain, cuts=cuts), kv, pin=pin)

    def lookup(self, prompt_ids: Any, *, max_tokens: int | None = None) -> int:
        """How many leading tokens of the prompt :meth:`restore` would bring back (0: none),
        with the same ``max_tokens`` (default ``len(prompt) - 1``)."""
        ids = _ids(prompt_ids)
        hit = self.store.lookup(ids[: _cap(ids, max_tokens)])
        return hit[1] if hit else 0

    def restore(self, prompt_ids: Any, *, max_tokens: int | None = None) -> tuple[Any, int]:
        """``(DynamicCache, n)``: the deepest stored prefix of the prompt, ``n`` tokens, all
        validated; ``(None, 0)`` when nothing matches. Prefill ``prompt_ids[n:]`` with it.

        ``n`` is at most ``max_tokens``, by default ``len(prompt) - 1``: the model needs the
        last prompt token's logits, so the engine always has at least one token to compute
        (docs/engine.md). Pass ``len(prompt)`` to allow the whole prompt. The bytes
        land once, in the tensors the cache holds (nothing is zero-filled or copied after)."""
        ids = _ids(prompt_ids)
        cap = _cap(ids, max_tokens)
        buf = _Buffers(self.fp, self.dtype, len(ids), self.device)  # room for the prompt
        r = self.store.restore(ids, buf.dest, max_tokens=cap)
        return (buf.cache(self.config, r.tokens), r.tokens) if r.tokens else (None, 0)

    def restore_many(self, prompts: Sequence[Any], *,
                     max_tokens: int | Sequence[int | None] | None = None
                     ) -> list[tuple[Any, int]]:  # fmt: skip
        """:meth:`restore` for several prompts at once, through :meth:`Store.restore_many` (one
        batched read agenda): a ``(DynamicCache, n)`` or ``(None, 0)`` per prompt, in order.
        ``max_tokens``: one cap for all, or one (``None``: ``len(prompt) - 1``) per prompt.
        When some fail, :class:`~stratastore.BatchRestoreError` carries the Store's results."""
        ids = [_ids(p) for p in prompts]
        if max_tokens is None or isinstance(max_tokens, (int, np.integer)):
            caps = [_cap(i, None if max_tokens is None else int(max_tokens)) for i in ids]
        elif len(max_tokens) == len(ids):
            caps = [_cap(i, c) for i, c in zip(ids, max_tokens, strict=True)]
        else:
            raise ConfigError(f"restore_many: max_tokens must be an int, None, or one per prompt "
                              f"({len(ids)}), not {max_tokens!r}")  # fmt: skip
        bufs = [_Buffers(self.fp, self.dtype, len(i), self.device) for i in ids]
        got = self.store.restore_many([(i, b.dest) for i, b in zip(ids, bufs, strict=True)],
                                      max_tokens=caps)  # fmt: skip
        return [(b.cache(self.config, r.tokens), r.tokens) if r.tokens else (None, 0)
                for b, r in zip(bufs, got, strict=True)]  # fmt: skip

    # -- saved sessions (never evicted) -----------------------------------------------------------
    def save_session(self, name: str, token_ids: Any, cache: Any,
                     checkpoints: Sequence[int] = ()) -> None:  # fmt: skip
        """Save ``cache`` (holding exactly ``token_ids``) as the session ``name``: durable when
        this returns, never evicted (:meth:`Store.save_session`; sessions and conversations
        share one namespace)."""
        ids = as_tokens(_ids(token_ids))
        n = len(ids)
        rows = self._rows(cache, n)
        lengths = sorted({*(c for c in checkpoints if 0 < c < n), n})
        kv = self._packed(cache, rows, n, [0, *lengths[:-1]])  # the Store's session segments
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
        buf = _Buffers(self.fp, self.dtype, n, self.device)
        starts = list(conv.cuts) or [0]
        deliver_capture(buf.dest, flat[: n * self.fp.token_bytes],
                        list(zip(starts, [*starts[1:], n], strict=True)), n, self.fp)  # fmt: skip
        return buf.cache(self.config, n), n

    def delete_session(self, name: str) -> bool:
        """Remove the saved session ``name``; False when there is none."""
        return self.store.delete_session(name)

    # -- checks -------------------------------------------------------------------------------
    def _tokenizer(self, call: str) -> Any:
        if self.tokenizer is None:
            raise ConfigError(f"{call}: messages= needs the tokenizer (TransformersCache.open("
                              "..., tokenizer=tok)) whose chat template renders them")  # fmt: skip
        return self.tokenizer

    def _packed(self, cache: Any, rows: list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]],
                n: int, cuts: Sequence[int]) -> Any:  # fmt: skip
        """The stored layout of ``cache`` (checked by :meth:`_rows`): on the host from
        ``rows``, or for a cache on CUDA built on the device (:func:`_pack_on_device`), as
        device memory :meth:`Store.park` hashes there."""
        if not rows:
            pairs = [(layer.keys, layer.values) for layer in cache.layers]
            return _device_view(_pack_on_device(self.fp, pairs, n, cuts))
        return _pack(self.fp, rows, n, cuts)

    def _rows(self, cache: Any, n: int) -> list[tuple[npt.NDArray[np.uint8],
                                                      npt.NDArray[np.uint8]]]:  # fmt: skip
        """Each layer's ``(K, V)`` of ``cache`` as byte views ``[n, heads, dim * itemsize]``,
        after checking the layer count, dtype and shape (and that all are on one device);
        none for a cache on CUDA (packed on the device: :meth:`_packed`)."""
        layers = getattr(cache, "layers", None)
        if layers is None or len(layers) != self.layers:
            raise ConfigError(
                f"the cache has {len(layers or [])} layers; this model has {self.layers}: park "
                "the cache of the model this adapter is for"
            )
        rows = []
        for i, layer in enumerate(layers):
            for t in (layer.keys, layer.values):
                if t.dtype != self.dtype:
                    raise ConfigError(f"layer {i} holds {t.dtype}; this adapter stores "
                                      f"{self.dtype}: open it with dtype={t.dtype}")  # fmt: skip
                if tuple(t.shape) != (1, self.heads, n, self.head_dim):
                    raise ConfigError(
                        f"layer {i} K/V shape {tuple(t.shape)} is not (1, {self.heads}, {n}, "
                        f"{self.head_dim}): one sequence whose length is the token count"
                    )
        places = {str(t.device) for layer in layers for t in (layer.keys, layer.values)}
        if len(places) > 1:
            raise ConfigError(f"the cache's layers live on {sorted(places)}: park a cache whose "
                              "K/V are on one device")  # fmt: skip
        if _is_cuda(layers[0].keys):
            return []  # packed, hashed on the device
        for layer in layers:
            rows.append((_token_rows(layer.keys), _token_rows(layer.values)))
        return rows
