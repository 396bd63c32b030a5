"""Benchmark: a returning conversation's second turn after a restart, in the real vLLM (CPU).

    .venv-vllm/bin/python tools/vllm_bench.py [--sizes 2048,4096,8192] [--dir DIR]
        [--connectors strata,none,example] [--reserved-cpus N]

A random Llama with Llama-3-8B's K/V per token (32 layers x 8 kv heads x 128 dims, bfloat16:
128 KiB a token) and a small MLP, made under DIR. For each prompt size, turn 1 (the prompt,
16 reply tokens) runs in one vLLM process and turn 2 (turn 1, its reply and 64 new tokens) in a
fresh one, timed from ``generate`` to the first token (``max_tokens=1``), with:

* ``StrataConnector`` (every page validated, every park fsynced before the next process: turn
  1's process lingers 30 s after its last request, as a server would run on, so the parks of
  its last requests land before vLLM's shutdown, which does not wait long for its workers);
  ``strata-blocks``: the same with ``"load_whole_blocks": true`` (loads end where vLLM's own
  prefix cache would);
* no connector: vLLM recomputes the whole prompt;
* vLLM's ``ExampleConnector`` (safetensors files, no validation, no fsync).

``--reserved-cpus N`` runs every phase with ``VLLM_CPU_NUM_OF_RESERVED_CPU=N``: one thread
configuration for all (vLLM reserves a core more when any connector is configured, unless
this is set; StrataConnector sets it to vLLM's own reservation without a connector unless the
user did, docs/engine.md). Prints per size the tokens loaded (``num_cached_tokens``), the
seconds, the ratios against the recompute and ``ExampleConnector``, whether turn 2's first
token matches vLLM keeping the conversation and the recompute, and the 1-minute load. Each
phase is a process of its own (``--phase``); nothing is downloaded."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONNECTORS = ("strata", "strata-blocks", "none", "example")


def make_model(dir: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.vllm.models import make_llama

    return make_llama(
        dir,
        layers=32,
        kv_heads=8,
        head_dim=128,
        heads=8,
        intermediate=256,
        vocab=1000,
        max_positions=16384,
    )


def phase(job: dict[str, Any]) -> dict[str, Any]:
    """One vLLM process: ``job["turn"]`` of each size's conversation, with ``job["via"]``."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    via, store = job["via"], job["store"]
    kt = None
    if via.startswith("strata"):
        kt = KVTransferConfig(
            kv_connector="StrataConnector",
            kv_connector_module_path="stratastore.adapters.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={
                "strata": {"cold_dir": store, "cold_mib": 65536, "create_dirs": True},
                "load_whole_blocks": via == "strata-blocks",
            },
        )
    elif via == "example":
        kt = KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": store},
        )
    llm = LLM(
        model=job["model"],
        dtype="bfloat16",
        max_model_len=max(job["sizes"]) + 512,
        enforce_eager=True,
        seed=0,
        kv_transfer_config=kt,
    )
    out = []
    for p in job.get("warm", []):  # vLLM keeps the conversations: turn 1 first, in this
        # process, one request at a time as turn 1's own phase runs them
        llm.generate(
            [TokensPrompt(prompt_token_ids=p)],
            SamplingParams(temperature=0, max_tokens=16),
            use_tqdm=False,
        )
    for size, prompt in zip(job["sizes"], job["prompts"], strict=True):
        sp = SamplingParams(temperature=0, max_tokens=16 if job["turn"] == 1 else 1)
        t0 = time.monotonic()
        try:
            [got] = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
        except Exception as e:  # a peer that fails (its engine is gone): said, and the rest
            out.append({"size": size, "failed": f"{type(e).__name__}: {e}"[-300:]})
            break
        out.append(
            {
                "size": size,
                "seconds": time.monotonic() - t0,
                "tokens": list(got.outputs[0].token_ids),
                "cached": got.num_cached_tokens,
                "prompt": len(prompt),
            }
        )
    if job["turn"] == 1 and via != "none":  # the parks of the last requests land before exit
        time.sleep(job.get("linger", 30))
    return {"results": out}


def size_of(r: dict[str, Any]) -> int:
    return int(r.get("prompt", r.get("size", 0)))


def run_phase(
    job: dict[str, Any], work: Path, name: str, reserved: int | None = None
) -> dict[str, Any]:
    jf, of = work / f"{name}.job.json", work / f"{name}.out.json"
    jf.write_text(json.dumps(job))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "6"),
    }
    if reserved is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved)
    got = subprocess.run(
        [sys.executable, __file__, "--phase", str(jf), str(of)],
        env=env,
        capture_output=True,
        text=True,
    )
    if got.returncode != 0 or not of.exists():
        errors = [ln for ln in got.stderr.splitlines() if "Error" in ln] or ["(no error line)"]
        print(f"phase {name} failed: {errors[-1][-300:]}")
        return {"failed": errors[-1][-300:]}
    result: dict[str, Any] = json.loads(of.read_text())
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2048,4096,8192")
    ap.add_argument("--dir", default="/tmp/strata-vllm-bench")
    ap.add_argument(
        "--connectors",
        default="strata,none,example",
        help=f"which of {','.join(CONNECTORS)} to run (none always runs: the recompute)",
    )
    ap.add_argument(
        "--reserved-cpus",
        type=int,
        default=None,
        help="VLLM_CPU_NUM_OF_RESERVED_CPU for every phase (default: each as it would run)",
    )
    ap.add_argument("--phase", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phase:
        job = json.loads(Path(args.phase[0]).read_text())
        Path(args.phase[1]).write_text(json.dumps(phase(job)))
        return 0
    import numpy as np

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    model = str(make_model(work / "model"))
    sizes = [int(s) for s in args.sizes.split(",")]
    vias = [v for v in CONNECTORS if v in {*args.connectors.split(","), "none"}]
    unknown = set(args.connectors.split(",")) - set(CONNECTORS)
    if unknown:
        ap.error(f"unknown connectors {sorted(unknown)}; choose from {','.join(CONNECTORS)}")
    reserved = args.reserved_cpus
    rng = np.random.default_rng(0)
    turn1 = [rng.integers(3, 1000, n - 80).tolist() for n in sizes]
    new = [rng.integers(3, 1000, 64).tolist() for _ in sizes]
    base = {"model": model, "sizes": sizes}
    # turn 1 without a connector gives the replies every turn 2 is built on
    first = run_phase(
        {**base, "via": "none", "store": "", "turn": 1, "prompts": turn1},
        work,
        "none-turn1",
        reserved,
    )
    replies = [r["tokens"] for r in first["results"]]
    prompts = [p + r + n for p, r, n in zip(turn1, replies, new, strict=True)]
    table: dict[str, list[dict[str, Any]] | None] = {}
    for via in vias:
        store = str(work / f"store-{via}")
        subprocess.run(["rm", "-rf", store], check=True)
        if via != "none":  # turn 1 stores the conversation (and must reply as vLLM alone)
            got = run_phase(
                {**base, "via": via, "store": store, "turn": 1, "prompts": turn1},
                work,
                f"{via}-turn1",
                reserved,
            )
            if "failed" in got:
                table[via] = None
                continue
            for r, want in zip(got["results"], replies, strict=False):
                if "failed" in r:
                    print(f"{via}: turn 1 of {r['size']} tokens failed: {r['failed'][:200]}")
                elif r["tokens"] != want:
                    print(f"{via}: turn 1 of {r['size']} tokens replied otherwise than vLLM alone")
        done = run_phase(
            {**base, "via": via, "store": store, "turn": 2, "prompts": prompts},
            work,
            f"{via}-turn2",
            reserved,
        )
        table[via] = done.get("results")
    kept = run_phase(
        {**base, "via": "none", "store": "", "turn": 2, "prompts": prompts, "warm": turn1},
        work,
        "kept-turn2",
        reserved,
    )["results"]
    load = os.getloadavg()[0]
    said = "each as it would run" if reserved is None else f"all with {reserved}"
    print(
        f"second turn after a restart, time to first token (1-minute load {load:.2f}; "
        f"VLLM_CPU_NUM_OF_RESERVED_CPU: {said})"
    )
    print(
        "tokens: the first token against vLLM keeping the conversation in its own prefix "
        "cache (turn 2 in turn 1's process) / against the recompute"
    )
    print(
        f"{'prompt':>7} {'connector':<14}{'loaded':>8}{'seconds':>9}{'vs recompute':>14}"
        f"{'vs example':>12}  tokens"
    )
    for i in range(len(sizes)):
        ref = (table["none"] or [])[i]
        ex = (table.get("example") or [])[i : i + 1]
        ex_s = ex[0].get("seconds") if ex else None
        for via in vias:
            if table[via] is None:
                print(f"{'':>7} {via:<14} failed (above)")
                continue
            r = table[via][i] if i < len(table[via]) else {"failed": "not run"}
            if "failed" in r:
                print(f"{size_of(ref):>7} {via:<14} failed: {r['failed'][:120]}")
                continue
            same = "/".join(
                "same" if r["tokens"] == x["tokens"] else "differ" for x in (kept[i], ref)
            )
            vs_ex = f"{ex_s / r['seconds']:>11.2f}x" if ex_s else f"{'-':>12}"
            print(
                f"{r['prompt']:>7} {via:<14}{r['cached']:>8}{r['seconds']:>9.2f}"
                f"{ref['seconds'] / r['seconds']:>13.1f}x{vs_ex}  {same}"
            )
        k = kept[i]
        print(
            f"{k['prompt']:>7} {'(kept)':<14}{k['cached']:>8}{k['seconds']:>9.2f}"
            f"{ref['seconds'] / k['seconds']:>13.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
