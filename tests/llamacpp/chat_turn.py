"""One turn through llama-cpp-python's cache hook, run in a fresh process by the tests
(``python -m tests.llamacpp.chat_turn JSON``): loads the GGUF model, sets a
``StrataLlamaCache`` on the store when one is given (none: a full evaluation), replies
greedily to ``messages`` (a chat completion) or to ``prompt`` (token ids: a completion) and
prints a JSON result on its last line: the reply, the tokens the ``Llama`` holds after it, the
tokens the store restored, the parks that failed."""

from __future__ import annotations

import json
import sys
from typing import Any

MAX_NEW = 12


def store_config(store: str) -> dict[str, Any]:
    return {"park": "disk", "ram_mib": 0, "cold_dir": store, "cold_mib": 256}


def _reply(llm: Any, args: dict[str, Any]) -> str:
    if "messages" in args:
        out = llm.create_chat_completion(args["messages"], max_tokens=MAX_NEW, temperature=0.0)
        return str(out["choices"][0]["message"]["content"])
    out = llm.create_completion(args["prompt"], max_tokens=MAX_NEW, temperature=0.0)
    return str(out["choices"][0]["text"])


def turn(args: dict[str, Any]) -> dict[str, Any]:
    from stratastore.adapters.llamacpp import StrataLlamaCache
    from tests.llamacpp.engine import load

    llm = load(args["model"], n_ctx=1024)
    result: dict[str, Any] = {"restored": 0, "errors": 0}
    if args.get("store") is None:
        result["reply"] = _reply(llm, args)
    else:
        cfg = store_config(args["store"])
        with StrataLlamaCache(llm, cfg, checkpoint_tokens=args["every"]) as cache:
            llm.set_cache(cache)
            result["reply"] = _reply(llm, args)
            result["restored"] = int(cache.store.store.stats()["tokens_restored"])
            result["errors"] = cache.errors
    result["held"] = [int(t) for t in llm.input_ids[: llm.n_tokens]]
    return result


if __name__ == "__main__":
    print(json.dumps(turn(json.loads(sys.argv[1]))))
