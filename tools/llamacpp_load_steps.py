"""Where the next turn's time goes inside the process, step by step: ``LlamaDiskCache``, and
stratastore's ``Llama.set_cache`` hook in its two forms, on one state of N tokens of
Llama-3-8B's K/V geometry whose K/V bytes are random (llama.cpp's own whole-context format, as
``tools/llamacpp_bench.py --random-sizes`` parks it):

- ``disk``: ``LlamaDiskCache`` (the state unpickled, then ``Llama.load_state``);
- ``state``: the hook as it was, a ``LlamaState`` of the restored prefix for ``load_state``;
- ``context``: the hook as it is, the prefix loaded into the context (``llama_state_seq_set_data``).

``Llama.load_state`` runs its own code with its two costly steps timed apart: the copy of the
state into a new ctypes buffer (``from_buffer_copy``) and llama.cpp's read of it
(``llama_state_set_data``). Each turn is a fresh process on a fresh copy of the cache's files;
it evaluates the prompt's last token and one more (``max_tokens=1``). Prints one JSON line a
turn: seconds to the first token and in each step, and the peak resident GiB::

    .venv-llama/bin/python tools/llamacpp_load_steps.py make 32768 --dir /var/tmp/llb
    .venv-llama/bin/python tools/llamacpp_load_steps.py time 32768 disk --dir /var/tmp/llb
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_bench as bench


def model_path(root: Path, n: int) -> str:
    return str(root / f"kv8b-{n}.gguf")


def make(root: Path, n: int) -> None:
    """The GGUF, and the state of N random-K/V tokens parked in both caches under ``root``."""
    from strata_harness.gguf_model import make_gguf
    from stratastore.adapters.llamacpp import StrataLlamaCache

    d = root / f"n{n}"
    d.mkdir(parents=True, exist_ok=True)
    make_gguf(
        Path(model_path(root, n)),
        layers=32,
        n_embd=1024,
        n_head=8,
        n_head_kv=8,
        n_ff=512,
        ctx=n + 256,
    )
    model = bench.llm(model_path(root, n), n)
    state = bench.random_state(model, n)
    conv = bench.conversation(n)
    t = time.perf_counter()
    bench.disk_cache(d)[conv] = state
    disk = time.perf_counter() - t
    with StrataLlamaCache(model, bench.strata_config(d / "strata")) as cache:
        t = time.perf_counter()
        cache[conv] = state
        cache.store.store.flush()
        strata = time.perf_counter() - t
    print(json.dumps({"disk_put_s": disk, "strata_put_s": strata}))


def state_hook(self: Any, key: Any) -> Any:
    """The hook's ``__getitem__`` as it was: the restored prefix as a ``LlamaState``."""
    from llama_cpp.llama import LlamaState

    from stratastore.chain import as_tokens

    ids = as_tokens(list(key))
    held = self.store.held(ids)
    n, data = self.store.prefix_state(ids, arch=self._arch, beyond=held)
    if n <= held:
        raise KeyError("nothing beyond what the Llama holds")
    input_ids = np.full(self._llm.n_ctx(), -1, dtype=np.intc)
    input_ids[:n] = ids[:n]
    scores = np.zeros((1, self._llm.n_vocab()), np.single)
    return LlamaState(input_ids, scores, n, data, len(data), 0)


def timed_turn(root: Path, n: int, kind: str) -> None:
    import llama_cpp
    from llama_cpp import Llama

    import stratastore.adapters.llamacpp.cache as hook
    from stratastore.adapters.llamacpp.store import LlamaCppStore

    src, work = root / f"n{n}", root / f"n{n}" / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    sub = "disk" if kind == "disk" else "strata"
    shutil.copytree(src / sub, work / sub)
    os.sync()
    model = bench.llm(model_path(root, n), n)
    spent: dict[str, float] = {}

    def clock(owner: Any, name: str, label: str) -> None:
        f: Callable[..., Any] = getattr(owner, name)

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t

        setattr(owner, name, timed)

    def load_state(self: Any, state: Any) -> None:  # Llama.load_state's code, two steps timed
        self.scores[: state.n_tokens, :] = state.scores.copy()
        rest = self.scores[state.n_tokens :, :]
        rest[rest > 0] = 0.0
        self.input_ids = state.input_ids.copy()
        self.n_tokens = state.n_tokens
        self._requires_eval = True
        self._seed = state.seed
        size = state.llama_state_size
        t = time.perf_counter()
        buf = (ctypes.c_uint8 * size).from_buffer_copy(state.llama_state)
        spent["from_buffer_copy"] = time.perf_counter() - t
        t = time.perf_counter()
        if llama_cpp.llama_state_set_data(self._ctx.ctx, buf, size) != size:
            raise RuntimeError("llama.cpp refused the state")
        spent["llama_state_set_data"] = time.perf_counter() - t

    Llama.load_state = load_state
    clock(Llama, "load_state", "load_state")
    clock(Llama, "eval", "eval")
    clock(LlamaCppStore, "prefix_state", "restore_and_build")
    clock(LlamaCppStore, "_set", "llama_state_seq_set_data")
    if kind == "disk":
        cache: Any = bench.disk_cache(work)
        clock(type(cache), "__getitem__", "cache_get")
    else:
        if kind == "state":
            hook.StrataLlamaCache.__getitem__ = state_hook  # type: ignore[assignment]
        clock(hook.StrataLlamaCache, "__getitem__", "cache_get")
        cache = hook.StrataLlamaCache(model, bench.strata_config(work / "strata"))
    model.set_cache(cache)
    t = time.perf_counter()
    stream = model.create_completion(
        bench.prompts(n)["turn"], max_tokens=1, temperature=0.0, stream=True
    )
    first = next(iter(stream))
    ttft = time.perf_counter() - t
    for _ in stream:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    out = {"kind": kind, "n": n, "ttft_s": round(ttft, 3)}
    out.update({k: round(v, 3) for k, v in spent.items()})
    out.update({"first": first["choices"][0]["text"], "peak_gib": round(peak, 2)})
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=["make", "time"])
    ap.add_argument("n", type=int)
    ap.add_argument("kind", nargs="?", choices=["disk", "state", "context"])
    ap.add_argument("--dir", default="/var/tmp/strata-load-steps")
    args = ap.parse_args()
    root = Path(args.dir)
    if args.op == "make":
        make(root, args.n)
    elif args.kind is None:
        ap.error("time needs a kind: disk, state or context")
    else:
        timed_turn(root, args.n, args.kind)


if __name__ == "__main__":
    main()
