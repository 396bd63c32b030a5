"""The transformers adapter: park a ``DynamicCache`` with its token ids and checkpoints, look
up a prompt, restore the matched prefix into a new ``DynamicCache``; restore several prompts in
one batch, save and load named sessions, pin the system prompt, find the message openers from a
tokenizer's chat template, and read the Store's counters.

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

Copies: a park copies each K/V byte once, from the cache's tensors straight into the stored
page layout (the transpose is that copy); a restore has the Store write each byte
into the per-layer tensors the returned ``DynamicCache`` holds, and copies nothing after (a RAM
hit is staged once inside the Store for a per-layer destination; a disk hit is read straight
into the tensors) (views ``[1, kv_heads, n, head_dim]`` of
``[tokens, kv_heads, head_dim]`` buffers: the model's next forward concatenates onto them, as
it does on any ``DynamicCache``). Nothing is zero-filled: past the restored prefix a buffer
holds whatever it held, and only ``[:n]`` is read.

On a GPU: a cache whose tensors live on CUDA is packed into the stored layout on the device
(one strided torch copy per layer, K/V and page run), hashed there and copied to the host once
(:meth:`Store.park` with device memory); with ``device="cuda"`` at
:meth:`TransformersCache.open`, restores land in CUDA tensors, validated on the device
(:class:`~stratastore.restore.DeviceLayerKV`). Nothing goes through ``.to("cpu")`` in the
adapter.

What the adapter reads from the model (fingerprint, window, dtype, chat template) is in
:mod:`.model`; the bytes between the cache's tensors and the stored layout in
:mod:`.tensors`.
"""

from stratastore.adapters.hf.cache import (
    TransformersCache,
    cuts_from_chat_template,
    fingerprint_for,
    sliding_window_of,
)

__all__ = ["TransformersCache", "cuts_from_chat_template", "fingerprint_for", "sliding_window_of"]
