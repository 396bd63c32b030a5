"""A returning conversation's next turn after a restart, under llama-cpp-python: time to first
token with no cache, ``LlamaDiskCache``, ``LlamaRAMCache`` and stratastore
(``StrataLlamaCache``), and the bytes each cache writes for a turn.

The model is a random Llama written as GGUF with Llama-3-8B's K/V geometry (32 layers, 8 KV
heads of 128, f16 K/V: 128 KiB a token) and a small rest (``n_embd`` 1024, 8 query heads,
FFN 512, vocabulary 512): the K/V bytes a cache moves are an 8B model's, while a forward costs
less than 8B's (a quarter of its query heads, a small FFN), so the time without a cache
understates what a cache saves on the real model. For each size N:

1. **build** (a process): evaluates a conversation of N tokens, saves the state
   (``Llama.save_state``) and hands it to a ``LlamaDiskCache`` and a ``StrataLlamaCache``
   (disk level, ``page_resume``), as ``Llama`` does after a completion.
2. **the turn after a restart** (a fresh process each, on a copy of what the build stored, so
   no kind sees another's entries, the copy synced and in the page cache): the prompt is the N
   tokens and 32 new ones; the clock runs from ``create_completion(prompt, max_tokens=16,
   stream=True)`` to its first token, with the cache set (``Llama.set_cache``), after the
   model is loaded. The RAM cache cannot outlive a process: it is filled in the same process,
   before the clock, with the disk cache's entry (the build's state). Then the completion runs
   out and the cache stores the turn (stratastore: flushed): the bytes the process passed to
   ``write`` calls from the request to there (``/proc/self/io`` ``wchar``) are the bytes
   written for the turn.
   A cache's turn runs ``--repeat`` times (each a fresh process on a fresh copy of what that
   kind reads, the disk cache's or stratastore's directory); the table gives the median and
   the range. No cache's turn is one evaluation of the whole context: it runs once.
3. **after an edit** 6,144 tokens back (a token changed there), for the sizes in
   ``--edit-sizes`` (default: every size over 6,144): the same, each kind once (every kind
   evaluates the 6,144 tokens after the edit).

4. **random K/V** (``--random-sizes``): the build parks a state of N tokens whose K/V bytes are
   drawn at random (llama.cpp's own whole-context format, small f16 values) instead of
   evaluating N tokens, which takes 20 minutes at 32K on this machine; the turns are as in 2.
   for the caches, whose work does not depend on what the K/V holds. No cache's turn (an
   evaluation of those tokens) has nothing to compare with: it is not run, and each cache's
   first token is compared with the disk cache's.
5. **a recurrent model** (``--recurrent-sizes``): a random ``mamba`` model (24 layers,
   ``n_embd`` 1024: a state of about 4 MiB, the same at every length) whose memory is not a
   K/V cache, which ``StrataLlamaCache`` keeps at checkpoints
   (:class:`~stratastore.adapters.llamacpp.checkpoints.LlamaCheckpointStore`); the build
   evaluates the conversation and hands its state to each cache, the turns are as in 2.

Greedy decoding; every cache's first token is compared with no cache's. Prints each turn as it
ends (standard error), then a table and, with ``--json``, the figures.

    .venv-llama/bin/python tools/llamacpp_bench.py --sizes 4096,16384 --random-sizes 32768 \
        --recurrent-sizes 4096,16384 [--edit-sizes 16384] [--repeat 3] [--lock FILE] \
        [--dir D] [--json]

``--lock FILE``: each timed turn (its copy included) holds an exclusive ``flock`` on FILE, the
builds do not: other work run as ``flock FILE command`` runs beside the builds' evaluations
only, never beside a turn on the clock.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NEW = 32  #: tokens the returning turn adds
EDIT_BACK = 6144  #: how far back the edited turn changes a token
KINDS = ["none", "disk", "ram", "strata"]
#: what each kind's turn reads of what the build stored (and so is copied for it)
READS = {"none": None, "disk": "disk", "ram": "disk", "strata": "strata"}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def written() -> int:
    """Bytes this process has passed to ``write``-family calls (``/proc/self/io`` ``wchar``,
    every thread's)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def conversation(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(n).integers(3, 500, n)]


def prompts(n: int) -> dict[str, list[int]]:
    conv, new = conversation(n), [int(x) for x in np.random.default_rng(7).integers(3, 500, NEW)]
    out = {"turn": conv + new}
    if n > EDIT_BACK:
        edited = list(conv)
        edited[n - EDIT_BACK] = 3 if edited[n - EDIT_BACK] != 3 else 4
        out["edit"] = edited + new
    return out


def llm(model: str, n: int) -> Any:
    from llama_cpp import Llama

    return Llama(
        model_path=model, n_ctx=n + 256, n_batch=512, seed=0, verbose=False, flash_attn=False
    )


def disk_cache(d: Path) -> Any:
    """``LlamaDiskCache`` in ``d/disk``, its limits out of the way: its own ``capacity_bytes``
    and the ``size_limit`` of the ``diskcache.Cache`` under it (1 GiB by default, which culls
    any state larger than that as soon as it is stored: at 8B's K/V geometry, 8K tokens)."""
    from llama_cpp.llama_cache import LlamaDiskCache

    cache = LlamaDiskCache(str(d / "disk"), capacity_bytes=1 << 40)
    cache.cache.reset("size_limit", 1 << 40)
    return cache


def strata_config(d: Path) -> dict[str, Any]:
    return {
        "park": "disk",
        "ram_mib": 0,
        "cold_dir": str(d),
        "cold_mib": 1 << 17,
        "page_resume": True,
    }


def random_state(model: Any, n: int) -> Any:
    """A ``LlamaState`` of ``model`` holding the conversation's ``n`` tokens, its K/V drawn at
    random (f16 values of standard deviation 0.5), in llama.cpp's whole-context format."""
    from llama_cpp.llama import LlamaState

    from stratastore.adapters.llamacpp.state import state_buffer
    from stratastore.adapters.llamacpp.store import LlamaCppStore

    with LlamaCppStore.open(model, {"park": "ram", "ram_mib": 1}) as probe:
        layout = probe.layout
    arch = str(model.metadata.get("general.architecture", ""))
    state, ks, vs = state_buffer(n, layout, arch=arch)
    rng = np.random.default_rng(n)
    for region in ks + vs:
        half = region.view(np.float16)
        half[...] = (rng.standard_normal(half.shape, np.float32) * 0.5).astype(np.float16)
    ids = np.full(model.n_ctx(), -1, np.intc)
    ids[:n] = conversation(n)
    scores = np.zeros((1, model.n_vocab()), np.single)
    return LlamaState(ids, scores, n, state.tobytes(), len(state), 0)  # bytes, as save_state


def phase_build(a: dict[str, Any]) -> dict[str, Any]:

    from stratastore.adapters.llamacpp import StrataLlamaCache

    n, d = a["n"], Path(a["dir"])
    model = llm(a["model"], n)
    t = time.perf_counter()
    if a.get("random"):
        state = random_state(model, n)
    else:
        model.eval(conversation(n))
        state = model.save_state()
    evaluated = time.perf_counter() - t
    disk = disk_cache(d)
    t = time.perf_counter()
    disk[conversation(n)] = state
    disk_s = time.perf_counter() - t
    with StrataLlamaCache(model, strata_config(d / "strata")) as cache:
        t = time.perf_counter()
        cache[conversation(n)] = state
        cache.store.store.flush()
        strata_s = time.perf_counter() - t
    return {
        "eval_s": evaluated,
        "random": bool(a.get("random")),
        "state_bytes": state.llama_state_size,
        "disk_put_s": disk_s,
        "strata_put_s": strata_s,
        "disk_bytes": du(d / "disk"),
        "strata_bytes": du(d / "strata"),
    }


def phase_turn(a: dict[str, Any]) -> dict[str, Any]:
    from llama_cpp import Llama
    from llama_cpp.llama_cache import LlamaRAMCache

    from stratastore.adapters.llamacpp import StrataLlamaCache

    n, d, kind = a["n"], Path(a["dir"]), a["kind"]
    model = llm(a["model"], n)
    prompt = prompts(n)[a["prompt"]]
    cache: Any = None
    if kind == "disk":
        cache = disk_cache(d)
    elif kind == "ram":  # the disk cache's entry for the prompt, read (not taken) before the clock
        disk = disk_cache(d)
        key = max(disk.cache.iterkeys(), key=lambda k: Llama.longest_token_prefix(k, prompt))
        cache = LlamaRAMCache(capacity_bytes=1 << 40)
        cache[key] = disk.cache[key]
    elif kind == "strata":
        cache = StrataLlamaCache(model, strata_config(d / "strata"))
    if cache is not None:
        model.set_cache(cache)
    before = written()
    t = time.perf_counter()
    stream = model.create_completion(prompt, max_tokens=16, temperature=0.0, stream=True)
    first = next(iter(stream))
    ttft = time.perf_counter() - t
    text = first["choices"][0]["text"]
    for _ in stream:
        pass
    if kind == "strata":
        cache.store.store.flush()
        cache.close()
    return {"ttft_s": ttft, "first": text, "written": written() - before}


def run_phase(args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--phase", json.dumps(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode:
        raise SystemExit(f"phase {args} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def locked(path: str | None) -> Any:
    """An exclusive ``flock`` on ``path`` while the block runs (nothing when ``None``)."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def turn(d: Path, n: int, model: str, kind: str, which: str) -> dict[str, Any]:
    """One turn of ``kind`` in a fresh process, on a fresh copy of what it reads of the build's
    stores (no kind sees another's entries or an earlier turn's), synced before the clock."""
    work = d / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    reads = READS[kind]
    if reads is not None:
        shutil.copytree(d / "built" / reads, work / reads)
    os.sync()  # the copy on disk: no writeback of it under the clock
    a = {"op": "turn", "n": n, "dir": str(work), "model": model, "kind": kind, "prompt": which}
    return run_phase(a)


def sizes_of(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--random-sizes", default="", help="sizes whose build parks random K/V")
    ap.add_argument("--recurrent-sizes", default="", help="sizes of the recurrent model's rows")
    ap.add_argument("--edit-sizes", default=None, help="sizes with the edit turn (default: > 6144)")
    ap.add_argument("--repeat", type=int, default=3, help="turns of each cache kind")
    ap.add_argument("--lock", help="a file each timed turn holds an exclusive flock on")
    ap.add_argument("--dir", default=None, help="where models and caches live (a temp dir)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--phase", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        a = json.loads(args.phase)
        print(json.dumps(phase_build(a) if a["op"] == "build" else phase_turn(a)))
        return
    from strata_harness.gguf_model import make_gguf, make_mamba_gguf

    root = Path(tempfile.mkdtemp(prefix="strata-llama-bench-", dir=args.dir))
    doc: dict[str, Any] = {"load": os.getloadavg()[0], "sizes": {}}
    try:
        sizes, rand = sizes_of(args.sizes), sizes_of(args.random_sizes)
        recurrent = sizes_of(args.recurrent_sizes)
        edit_sizes = (
            [n for n in sizes if n > EDIT_BACK]
            if args.edit_sizes is None
            else sizes_of(args.edit_sizes)
        )
        if not sizes + rand + recurrent or any(
            len(set(x)) < len(x) for x in (sizes, rand, recurrent)
        ):
            ap.error("give at least one size, each once in its list")
        if args.repeat < 1 or not set(edit_sizes) <= {n for n in sizes if n > EDIT_BACK}:
            ap.error(f"--repeat must be at least 1, --edit-sizes sizes of --sizes over {EDIT_BACK}")
        ctx = max(sizes + rand + recurrent) + 256
        kv8b = str(
            make_gguf(
                root / "kv8b.gguf", layers=32, n_embd=1024, n_head=8, n_head_kv=8, n_ff=512, ctx=ctx
            )
        )
        rows = [(f"{n:,}", n, kv8b, False) for n in sizes]
        rows += [(f"{n:,} (random K/V)", n, kv8b, True) for n in rand]
        if recurrent:
            mamba = str(make_mamba_gguf(root / "mamba.gguf", layers=24, n_embd=1024, ctx=ctx))
            rows += [(f"{n:,} (recurrent)", n, mamba, False) for n in recurrent]
        for label, n, model, random_kv in rows:
            d = root / f"n{n}-{len(doc['sizes'])}"
            d.mkdir()
            built = {"op": "build", "n": n, "dir": str(d / "built"), "model": model}
            row: dict[str, Any] = {"build": run_phase({**built, "random": random_kv})}
            print(json.dumps({"row": label, "build": row["build"]}), file=sys.stderr, flush=True)
            for which in prompts(n):
                if which == "edit" and (n not in edit_sizes or model != kv8b or random_kv):
                    continue
                for kind in KINDS:
                    if kind == "none" and random_kv:  # nothing evaluated to compare with
                        continue
                    rounds = 1 if kind == "none" or which == "edit" else args.repeat
                    row[f"{which}/{kind}"] = runs = []
                    for _ in range(rounds):
                        with locked(args.lock):
                            runs.append(turn(d, n, model, kind, which))
                        print(json.dumps({"row": label, which: kind, **runs[-1]}), file=sys.stderr)
            doc["sizes"][label] = row
            print(render({**doc, "sizes": {label: row}}), file=sys.stderr, flush=True)
            shutil.rmtree(d, ignore_errors=True)
        doc["load_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(doc, indent=2))
    print(render(doc))


def spread(median: float, values: list[float]) -> str:
    """A median with the range of its values when there are several."""
    return f"{median:.2f}" + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"1-minute load {doc['load']:.2f} at the start, {doc.get('load_end', 0):.2f} at the end",
        "| context | turn | no cache TTFT s | LlamaDiskCache | LlamaRAMCache (same process) | "
        "stratastore | strata vs none | strata vs disk | written/turn disk | written/turn strata |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, row in doc["sizes"].items():
        for which in ("turn", "edit"):
            if f"{which}/disk" not in row:
                continue
            kinds = [k for k in KINDS if f"{which}/{k}" in row]
            runs = {k: row[f"{which}/{k}"] for k in kinds}
            secs = {k: statistics.median(r["ttft_s"] for r in runs[k]) for k in kinds}
            base = runs["none" if "none" in runs else "disk"][0]["first"]
            same = all(r["first"] == base for k in kinds for r in runs[k])
            mib = {k: statistics.median(r["written"] for r in runs[k]) / 2**20 for k in kinds}
            cells = [
                label,
                which + ("" if same else " (first tokens differ!)"),
                spread(secs["none"], [r["ttft_s"] for r in runs["none"]])
                if "none" in runs
                else "-",
                *(spread(secs[k], [r["ttft_s"] for r in runs[k]]) for k in KINDS[1:]),
                f"{secs['none'] / secs['strata']:.1f}x" if "none" in secs else "-",
                f"{secs['disk'] / secs['strata']:.2f}x",
                f"{mib['disk']:,.0f} MiB",
                f"{mib['strata']:,.1f} MiB",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        b = row["build"]
        note = (
            f"(build: {'random K/V' if b.get('random') else 'eval'} {b['eval_s']:.1f} s, "
            f"state {b['state_bytes'] / 2**20:,.0f} MiB; first "
            f"put: disk {b['disk_put_s']:.2f} s, strata {b['strata_put_s']:.2f} s)"
        )
        lines.append(f"|  | {note} |" + " |" * 8)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
