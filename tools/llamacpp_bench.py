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

Greedy decoding; every cache's first token is compared with no cache's. Prints each turn as it
ends (standard error), then a table and, with ``--json``, the figures.

    .venv-llama/bin/python tools/llamacpp_bench.py --sizes 4096,16384,32768 \
        [--edit-sizes 16384] [--repeat 3] [--lock FILE] [--dir D] [--json]

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


def phase_build(a: dict[str, Any]) -> dict[str, Any]:

    from stratastore.adapters.llamacpp import StrataLlamaCache

    n, d = a["n"], Path(a["dir"])
    model = llm(a["model"], n)
    t = time.perf_counter()
    model.eval(conversation(n))
    evaluated = time.perf_counter() - t
    state = model.save_state()
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096,16384")
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
    from strata_harness.gguf_model import make_gguf

    root = Path(tempfile.mkdtemp(prefix="strata-llama-bench-", dir=args.dir))
    doc: dict[str, Any] = {"load": os.getloadavg()[0], "sizes": {}}
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        edit_sizes = (
            [n for n in sizes if n > EDIT_BACK]
            if args.edit_sizes is None
            else [int(s) for s in args.edit_sizes.split(",") if s]
        )
        if args.repeat < 1 or not set(edit_sizes) <= {n for n in sizes if n > EDIT_BACK}:
            ap.error(f"--repeat must be at least 1, --edit-sizes sizes of --sizes over {EDIT_BACK}")
        model = str(
            make_gguf(
                root / "kv8b.gguf",
                layers=32,
                n_embd=1024,
                n_head=8,
                n_head_kv=8,
                n_ff=512,
                ctx=max(sizes) + 256,
            )
        )
        for n in sizes:
            d = root / f"n{n}"
            d.mkdir()
            built = {"op": "build", "n": n, "dir": str(d / "built"), "model": model}
            row: dict[str, Any] = {"build": run_phase(built)}
            print(json.dumps({"n": n, "build": row["build"]}), file=sys.stderr, flush=True)
            for which in prompts(n):
                if which == "edit" and n not in edit_sizes:
                    continue
                for kind in KINDS:
                    rounds = 1 if kind == "none" or which == "edit" else args.repeat
                    row[f"{which}/{kind}"] = runs = []
                    for _ in range(rounds):
                        with locked(args.lock):
                            runs.append(turn(d, n, model, kind, which))
                        print(json.dumps({"n": n, which: kind, **runs[-1]}), file=sys.stderr)
            doc["sizes"][n] = row
            print(render({**doc, "sizes": {n: row}}), file=sys.stderr, flush=True)
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
    for n, row in doc["sizes"].items():
        for which in ("turn", "edit"):
            if f"{which}/none" not in row:
                continue
            runs = {k: row[f"{which}/{k}"] for k in KINDS}
            secs = {k: statistics.median(r["ttft_s"] for r in runs[k]) for k in KINDS}
            same = all(r["first"] == runs["none"][0]["first"] for k in KINDS for r in runs[k])
            mib = {k: statistics.median(r["written"] for r in runs[k]) / 2**20 for k in KINDS}
            cells = [
                f"{int(n):,}",
                which + ("" if same else " (first tokens differ!)"),
                *(spread(secs[k], [r["ttft_s"] for r in runs[k]]) for k in KINDS),
                f"{secs['none'] / secs['strata']:.1f}x",
                f"{secs['disk'] / secs['strata']:.1f}x",
                f"{mib['disk']:,.0f} MiB",
                f"{mib['strata']:,.1f} MiB",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        b = row["build"]
        note = (
            f"(build: eval {b['eval_s']:.1f} s, state {b['state_bytes'] / 2**20:,.0f} MiB; first "
            f"put: disk {b['disk_put_s']:.2f} s, strata {b['strata_put_s']:.2f} s)"
        )
        lines.append(f"|  | {note} |" + " |" * 8)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
