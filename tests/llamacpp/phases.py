"""One phase of a conversation with llama.cpp, run in a fresh process by the tests
(``python -m tests.llamacpp.phases JSON``): prints a JSON result on its last line.

Phases (each loads the GGUF model anew, greedy decoding, ``MAX_NEW`` tokens a turn):

- ``own``: the conversation kept in llama.cpp's own context: each turn's prompt is the one
  before, its reply and the new message; returns each turn's reply tokens.
- ``park``: evaluates ``prompt`` and a reply, parks the sequence (checkpoints at ``cuts``);
  returns the reply and the tokens parked.
- ``resume``: restores the deepest stored prefix of ``prompt`` and replies; returns the reply
  and how many tokens were restored.
- ``fresh``: evaluates ``prompt`` from nothing and replies.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MAX_NEW = 12


def _llm(model: str, flash_attn: bool) -> Any:
    from tests.llamacpp.engine import load

    return load(model, flash_attn=flash_attn, n_ctx=1024)


def _reply(llm: Any, prompt: list[int]) -> list[int]:
    out: list[int] = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        if len(out) == MAX_NEW:
            break
        out.append(int(tok))
    return out


def _store(llm: Any, store: str) -> Any:
    from stratastore.adapters.llamacpp import LlamaCppStore

    cfg = {"park": "disk", "ram_mib": 0, "cold_dir": store, "cold_mib": 256, "page_resume": True}
    return LlamaCppStore.open(llm, cfg)


def run(args: dict[str, Any]) -> dict[str, Any]:
    llm = _llm(args["model"], args.get("flash_attn", False))
    op = args["op"]
    if op == "own":
        prompt: list[int] = []
        replies = []
        for message in args["messages"]:
            prompt = prompt + message
            replies.append(_reply(llm, prompt))
            prompt = prompt + replies[-1]
        return {"replies": replies}
    if op == "park":
        reply = _reply(llm, args["prompt"])
        held = [int(t) for t in llm.input_ids[: llm.n_tokens]]
        with _store(llm, args["store"]) as s:
            s.park(args["conv"], held, checkpoints=args.get("cuts", []))
        return {"reply": reply, "held": held}
    if op == "resume":
        with _store(llm, args["store"]) as s:
            n = s.restore(args["prompt"])
        return {"reply": _reply(llm, args["prompt"]), "restored": n}
    if op == "fresh":
        return {"reply": _reply(llm, args["prompt"])}
    raise ValueError(f"unknown phase {op!r}")


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
