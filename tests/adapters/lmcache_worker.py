"""LMCache with the stratastore plugin on the CPU, for ``tests/adapters/test_lmcache_plugin.py``:
the engine the tests build, the K/V of a prompt, and the processes the tests start
(``python -m tests.adapters.lmcache_worker store|check DIR N``).

- ``store DIR N``: store prompts 0..N-1 one by one, printing ``submitted i`` after each
  ``engine.store`` and ``durable i`` once the plugin's ``flush()`` returned (every put of the
  prompt committed); the kill test SIGKILLs it between the two.
- ``check DIR N``: retrieve prompts 0..N-1 and print one JSON line: the tokens retrieved of
  each and whether they are bit-identical to the prompt's K/V.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

LAYERS, HEADS, HEAD_DIM = 2, 4, 32  #: 1 KiB a token in fp16
CHUNK = 64  #: tokens a chunk: 64 KiB
PROMPT = 8 * CHUNK  #: the worker's prompts: 8 chunks
MODEL = "test/lmcache-plugin"


def engine(
    path: str | None, instance: str, *, budget_mib: int = 64, chunk: int = CHUNK, **extra: Any
) -> Any:
    """An LMCache engine on the CPU whose only storage is the stratastore plugin in ``path``
    (``local_cpu`` off: nothing is served from RAM); ``path`` None: on the ``levels`` (or the
    ``strata_config``) given in ``extra`` instead."""
    from lmcache.v1.config import LMCacheEngineConfig

    from stratastore.adapters.lmcache.cpu import cpu_engine

    p = "storage_plugin.stratastore."
    where = {} if path is None else {p + "dir": path, p + "budget_mib": budget_mib}
    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=chunk,
        local_cpu=False,
        max_local_cpu_size=0.03,
        storage_plugins=["stratastore"],
        extra_config={
            p + "module_path": "stratastore.adapters.lmcache",
            p + "class_name": "StrataStoragePlugin",
            **where,
            **{p + k: v for k, v in extra.items()},
        },
    )
    return cpu_engine(
        instance, cfg, model_name=MODEL, layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, chunk=chunk
    )


def plugin(eng: Any) -> Any:
    return eng.storage_manager.storage_backends["stratastore"]


def prompt(i: int, n: int = PROMPT) -> Any:
    """Prompt ``i``'s token ids (distinct from every other prompt's from the first token)."""
    import torch

    return torch.arange(n) + 100_000 * (i + 1)


def kv(i: int, n: int = PROMPT) -> Any:
    """The K/V of the first ``n`` tokens (at most ``2 * PROMPT``) of prompt ``i``, in the engine
    layout ``[layers, 2, tokens, heads, head_dim]``: a prefix's K/V is the prefix of the
    whole's."""
    import torch

    shape = (LAYERS, 2, 2 * PROMPT, HEADS, HEAD_DIM)
    raw = np.random.default_rng(i).integers(0, 2**16, shape, np.uint16)[:, :, :n]
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16))


def same(got: Any, want: Any) -> bool:
    """Bit for bit (random fp16 bytes hold NaNs, so compared as integers)."""
    import torch

    return bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))


def retrieve(eng: Any, i: int, n: int = PROMPT) -> tuple[int, bool]:
    """Retrieve prompt ``i`` into zeros: (tokens retrieved, whether those are bit-identical to
    its K/V and every token past them is still zero)."""
    import torch

    out = torch.zeros(LAYERS, 2, n, HEADS, HEAD_DIM, dtype=torch.float16)
    got = int(eng.retrieve(prompt(i, n), kvcaches=out).sum())
    rest = out[:, :, got:].view(torch.int16)
    return got, same(out[:, :, :got], kv(i, n)[:, :, :got]) and not bool(rest.any())


def main(argv: list[str]) -> int:
    cmd, path, n = argv[0], argv[1], int(argv[2])
    eng = engine(path, f"worker-{os.getpid()}")
    if cmd == "store":
        for i in range(n):
            eng.store(prompt(i), kvcaches=kv(i))
            print(f"submitted {i}", flush=True)
            plugin(eng).flush()
            print(f"durable {i}", flush=True)
    else:
        print(json.dumps([retrieve(eng, i) for i in range(n)]), flush=True)
    os._exit(0)  # LMCache's threads must not hold the process open


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
