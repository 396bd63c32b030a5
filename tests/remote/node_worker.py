"""One engine node for the two-node tests (tests/remote/test_two_nodes.py): a separate process
that opens a :class:`~stratastore.Store` with its own local levels and the shared remote level,
runs the operations it is given, and prints what they did as one JSON line.

Run as ``python -m tests.remote.node_worker SPEC`` from the repository root; ``SPEC`` is JSON::

    {"config": {...StoreConfig settings...},
     "ops": [{"op": "park", "id": "c1", "tokens": [...], "checkpoints": [...], "cuts": [...],
              "seed": 3, "kv_tokens": 100, "states": {"32": "<hex>"}},
             {"op": "flush"},
             {"op": "lookup", "prompt": [...]},
             {"op": "restore", "prompt": [...], "max_tokens": null},
             {"op": "stats"}]}

A park's K/V is ``kv(seed, kv_tokens)[:len(tokens)]`` (:func:`kv`; the test computes the same
bytes), with the fingerprint :func:`fingerprint` (tests/conftest.py's ``tiny_fp``). A restore
reports the source, the tokens, the state (hex), the SHA-256 of the delivered prefix and
whether every byte past it is still zero (the buffer starts zeroed). The last stdout line is
``{"results": [...], "warnings": [...]}``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens


def fingerprint() -> ModelFingerprint:
    """tests/conftest.py's ``tiny_fp()``: 64 bytes a token, pages of 4 tokens."""
    return ModelFingerprint.create("test/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4)


def kv(fp: ModelFingerprint, seed: int, n_tokens: int) -> npt.NDArray[np.uint8]:
    """The K/V of ``n_tokens`` tokens made from ``seed`` (prefixes: slice a longer one)."""
    return np.random.default_rng(seed).integers(0, 256, n_tokens * fp.token_bytes, dtype=np.uint8)


def _park(store: Store, fp: ModelFingerprint, op: dict[str, Any]) -> dict[str, Any]:
    tokens = op["tokens"]
    conv = Conversation(
        op["id"],
        as_tokens(np.asarray(tokens)),
        [Checkpoint(x) for x in op["checkpoints"]],
        cuts=list(op.get("cuts") or [0]),
    )
    data = kv(fp, op["seed"], op.get("kv_tokens") or len(tokens))[: len(tokens) * fp.token_bytes]
    states = {int(k): bytes.fromhex(v) for k, v in (op.get("states") or {}).items()}
    report = store.park(conv, data.copy(), states=states or None)
    store.flush()
    return {"where": report.where, "tokens": report.tokens}


def _restore(store: Store, fp: ModelFingerprint, op: dict[str, Any]) -> dict[str, Any]:
    prompt = np.asarray(op["prompt"])
    out = np.zeros(len(prompt) * fp.token_bytes, np.uint8)
    r = store.restore(prompt, out, max_tokens=op.get("max_tokens"))
    n = r.tokens * fp.token_bytes
    store.flush()  # what remote_keep_local queued is written before the process ends
    return {
        "source": r.source,
        "tokens": r.tokens,
        "conv_id": r.conv_id,
        "state": r.state.hex() if r.state is not None else None,
        "sha": hashlib.sha256(out[:n].tobytes()).hexdigest(),
        "rest_zero": bool(not out[n:].any()),
    }


def _stats(store: Store) -> dict[str, Any]:
    s = store.stats()
    doc: dict[str, Any] = json.loads(json.dumps(s, default=str))
    return doc


def run(spec: dict[str, Any]) -> dict[str, Any]:
    fp = fingerprint()
    warnings: list[str] = []
    results: list[Any] = []
    with Store.open(fp, spec["config"], warn=warnings.append) as store:
        for op in spec["ops"]:
            kind = op["op"]
            if kind == "park":
                results.append(_park(store, fp, op))
            elif kind == "flush":
                store.flush()
                results.append(None)
            elif kind == "lookup":
                hit = store.lookup(np.asarray(op["prompt"]))
                results.append(list(hit) if hit is not None else None)
            elif kind == "restore":
                results.append(_restore(store, fp, op))
            elif kind == "stats":
                results.append(_stats(store))
            else:
                raise ValueError(f"unknown op {kind!r}")
    return {"results": results, "warnings": warnings}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    print(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
