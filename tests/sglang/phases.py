"""One phase of a HiCache backend's life, run in a fresh process by the tests
(``python -m tests.sglang.phases JSON``): prints one line per acknowledged batch (``acked
N``) and a JSON result on its last line.

- ``set``: fills ``pages`` pages of a host pool (page ``i`` from seed ``seed + i``) and backs
  them up in batches of ``batch`` under the page hashes of ``tokens``;
- ``get``: prefetches those page hashes into a fresh pool; returns how many were read, how
  many of those differ from the pages ``set`` wrote, and (when one missed) whether the slot of
  the page that missed is untouched.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def pool_of(args: dict[str, Any]) -> Any:
    from strata_harness.sglang_host_pool import CpuHostPool

    return CpuHostPool(layout=args.get("layout", "page_first"), size=args["pages"] * 64)


def run(args: dict[str, Any]) -> dict[str, Any]:
    from strata_harness.sglang_hicache import backend, backup, hashes, prefetch

    pool = pool_of(args)
    keys = hashes(args["tokens"], pool.page_size)[: args["pages"]]
    b = backend(args["kind"], args["where"], pool, args["model"])
    try:
        if args["op"] == "set":
            for i in range(args["pages"]):
                pool.fill(i * pool.page_size, args["seed"] + i)
            step = args.get("batch", len(keys))
            for i in range(0, len(keys), step):
                assert backup(b, pool, keys[i : i + step], i)
                print("acked", min(i + step, len(keys)), flush=True)
            return {"set": len(keys)}
        read = prefetch(b, pool, keys)
        want = pool_of(args)
        for i in range(args["pages"]):
            want.fill(i * pool.page_size, args["seed"] + i)
        wrong = sum(
            not torch.equal(pool.get_data_page(i * 64), want.get_data_page(i * 64))
            for i in range(read)
        )
        result = {"read": read, "wrong": wrong}
        if read < args["pages"]:  # the slot of the page that missed: nothing copied into it
            result["miss_slot_untouched"] = not pool.get_data_page(read * 64).any().item()
        return result
    finally:
        if hasattr(b, "close"):  # SGLang's file backend has none
            b.close()


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
