"""The order inside a block of vLLM's CPU attention cache, measured from vLLM's own kernel
(needs vLLM): :func:`measure` has ``cpu_attn_reshape_and_cache`` (the kernel every CPU forward
writes K/V with) write one block of tokens whose items are their own coordinates, and reads
back where each landed (:class:`~.block_layout.BlockLayout`). Nothing is assumed about the ISA:
whatever order vLLM's build keeps, a page is moved to and from exactly its tokens' items."""

from __future__ import annotations

from typing import Any

import numpy as np

from stratastore.adapters.vllm.block_layout import BlockLayout
from stratastore.errors import ConfigError

__all__ = ["measure"]

_BITS = 13  #: bits of an item's coordinate written per pass (two passes: up to 2**26 items)
#: the codes' offset: with it every code is a normal float16 and bfloat16 (never a subnormal a
#: kernel might flush to zero)
_BASE = 0x0400


def measure(isa: str, n_kv_heads: int, head_dim: int, block_size: int, dtype: Any) -> BlockLayout:
    """The order vLLM's CPU kernel for ``isa`` keeps a block in, for caches of ``dtype`` (a torch
    dtype of 2-byte items). A result that is not one order for every head and a permutation of
    the region's items is a :class:`ConfigError` (the connector could not move part of a block
    safely)."""
    import torch
    import vllm._custom_ops as ops

    if torch.empty(0, dtype=dtype).element_size() != 2:
        raise ConfigError(
            f"StrataConnector: vLLM's CPU K/V cache of {dtype} is not supported: the connector "
            "moves pages of 16-bit caches (bfloat16, float16) on vLLM's CPU backend"
        )
    h, d, bs = n_kv_heads, head_dim, block_size
    n = bs * h * d
    if n >= 1 << (2 * _BITS):
        raise ConfigError(f"StrataConnector: a block of {n} K items is too large to measure")
    codes = np.arange(n, dtype=np.int64)  # item (t, h, d) of the block: t * h * d + h * d + d
    seen = []
    for part in (0, 1):
        vals = ((codes >> (_BITS * part)) & ((1 << _BITS) - 1)) + _BASE
        items = torch.from_numpy(vals.astype(np.int16)).reshape(bs, h, d).view(dtype)
        cache = torch.zeros(2, h, bs, 2 * d, dtype=dtype)
        key_cache, value_cache = cache.view(2, h, 2 * bs, d).chunk(2, dim=2)
        slots = torch.arange(bs, 2 * bs, dtype=torch.int64)  # block 1, all its slots
        ops.cpu_attn_reshape_and_cache(items, items.clone(), key_cache, value_cache, slots, isa)
        seen.append(cache[1].view(torch.int16).numpy().astype(np.int64).reshape(h, 2, bs * d))
    code = (seen[0] - _BASE) | ((seen[1] - _BASE) << _BITS)  # [heads, kind, position]
    offsets = []
    for kind in (0, 1):
        t, head, dim = code[:, kind] // (h * d), (code[:, kind] // d) % h, code[:, kind] % d
        order = np.full((bs, d), -1, dtype=np.int64)
        ok = bool((head == np.arange(h)[:, None]).all() and (t < bs).all() and (t >= 0).all())
        if ok:
            order[t[0], dim[0]] = np.arange(bs * d)
            same = all(np.array_equal(order[t[i], dim[i]], np.arange(bs * d)) for i in range(h))
            ok = same and bool((order >= 0).all())
        if not ok:
            raise ConfigError(
                f"StrataConnector: vLLM's CPU attention kernel ({isa}) keeps a block of "
                f"{bs} tokens in an order the connector cannot read (the {'KV'[kind]} items of "
                "one head are not a permutation of their region): this vLLM build is not "
                "supported by the connector"
            )
        offsets.append(order)
    return BlockLayout(offsets[0], offsets[1])
