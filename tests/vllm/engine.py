"""One vLLM process of the connector's tests: ``python -m tests.vllm.engine JOB.json OUT.json``.

The job names the model directory, the connector's store settings (``null``: no connector,
vLLM alone, its own prefix cache), the conversations (each a list of user turns, token ids)
and which turns this process runs; a turn's prompt is the previous prompt, the previous reply
and the turn's tokens, the earlier replies taken from ``history`` (an earlier process's
output) or from this process. Greedy decoding. Writes, per turn run: every conversation's
reply tokens, ``num_cached_tokens`` (the prompt tokens vLLM did not compute: its prefix cache
and the connector's loads), the prompt lengths and the seconds of the ``generate`` call.
With ``kill_after``, the process group is killed (SIGKILL) right after the last ``generate``
returns, while the connector's parks may still be in flight."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kt = None
    if job.get("store") is not None:
        kt = KVTransferConfig(
            kv_connector="StrataConnector",
            kv_connector_module_path="stratastore.adapters.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"strata": job["store"]},
        )
    llm = LLM(
        model=job["model"],
        dtype="bfloat16",
        max_model_len=job.get("max_len", 4096),
        enforce_eager=True,
        seed=0,
        kv_transfer_config=kt,
        **job.get("engine", {}),
    )
    sp = SamplingParams(temperature=0, max_tokens=job.get("max_tokens", 24))
    convs: list[list[list[int]]] = job["conversations"]
    replies: list[list[list[int]]] = [list(h) for h in job.get("history", [[]] * len(convs))]
    out: dict[str, Any] = {"turns": []}
    for turn in job["run_turns"]:
        prompts = []
        for c, turns in enumerate(convs):
            p: list[int] = []
            for t in range(turn):
                p += turns[t] + replies[c][t]
            prompts.append(p + turns[turn])
        started = time.monotonic()
        got = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        took = time.monotonic() - started
        if job.get("kill_after") and turn == job["run_turns"][-1]:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        tokens = [list(g.outputs[0].token_ids) for g in got]
        for c, t in enumerate(tokens):
            replies[c] = [*replies[c][:turn], t]
        out["turns"].append(
            {
                "turn": turn,
                "tokens": tokens,
                "seconds": took,
                "cached": [g.num_cached_tokens for g in got],
                "prompt_lens": [len(p) for p in prompts],
            }
        )
    out["replies"] = replies
    return out


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    result = run(job)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
