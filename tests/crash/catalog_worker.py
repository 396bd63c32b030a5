"""A Store in a process of its own, driven one step at a time (tests/crash/test_shared_catalog.py).

The test starts ``python -m tests.crash.catalog_worker`` and writes one JSON request a line on
its stdin; the worker runs it on its own :class:`~stratastore.Store` and answers one JSON line
on stdout (``{"ok": true, ...}`` or ``{"ok": false, "error": <type>, "msg": ...}``), so several
processes on the same directories run their steps in the order the test chooses: no sleeps.

Only the public API is used. A conversation is described by ``parts``: a list of
``[first_token, count]`` ranges whose concatenation is its token ids; its K/V is a function of
each token's id and position (:func:`kv_of`), so two conversations that share a prefix share its
bytes too, and any process can compute what a restore must deliver.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore import Checkpoint, Conversation, Store
from stratastore.facade import SpillError
from tests.conftest import tiny_fp

FP = tiny_fp()  # 64 bytes a token, pages of 4 tokens
KV = npt.NDArray[np.uint8]
Parts = Sequence[Sequence[int]]


def tokens_of(parts: Parts) -> npt.NDArray[np.uint32]:
    return np.concatenate([np.arange(b, b + n, dtype=np.uint32) for b, n in parts])


def kv_of(tokens: npt.NDArray[np.uint32]) -> KV:
    """The K/V of ``tokens`` in the stored layout: byte ``j`` of token ``i`` depends only on
    (token id, position, j), so a shared prefix has the same bytes in every conversation."""
    t = tokens.astype(np.uint64)[:, None]
    i = np.arange(len(tokens), dtype=np.uint64)[:, None]
    j = np.arange(FP.token_bytes, dtype=np.uint64)[None, :]
    mixed = (t * np.uint64(2654435761) + i * np.uint64(40503) + j * np.uint64(97)) ^ (t >> 5)
    kv: KV = (mixed & np.uint64(0xFF)).astype(np.uint8).reshape(-1)
    return kv


def conversation(cid: str, parts: Parts, cuts: Sequence[int]) -> tuple[Conversation, KV]:
    """Conversation ``cid`` of ``parts`` cut into segments at ``cuts`` (0 first), with a
    checkpoint at every segment end."""
    toks = tokens_of(parts)
    ends = [*cuts[1:], len(toks)]
    conv = Conversation(cid, toks, [Checkpoint(e) for e in ends], cuts=list(cuts))
    return conv, kv_of(toks)


def even_cuts(n: int, every: int) -> list[int]:
    return list(range(0, n, every))


class Worker:
    def __init__(self) -> None:
        self.store: Store | None = None

    def _store(self) -> Store:
        assert self.store is not None, "open first"
        return self.store

    def op_open(self, cfg: dict[str, Any]) -> dict[str, Any]:
        self.store = Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda _msg: None)
        return {}

    def op_park(self, cid: str, parts: Parts, cuts: Sequence[int]) -> dict[str, Any]:
        conv, kv = conversation(cid, parts, cuts)
        r = self._store().park(conv, kv)
        return {"where": r.where, "tokens": r.tokens}

    def op_flush(self) -> dict[str, Any]:
        try:
            self._store().flush()
        except SpillError as e:
            return {"spill_errors": [[cid, repr(cause)] for cid, cause in e.failures]}
        return {"spill_errors": []}

    def op_lookup(self, parts: Parts) -> dict[str, Any]:
        hit = self._store().lookup(tokens_of(parts))
        return {"hit": list(hit) if hit else None}

    def op_restore(self, parts: Parts) -> dict[str, Any]:
        """Restore the deepest stored prefix of ``parts`` (plus one token nobody stored);
        ``tokens`` restored and whether every one of their bytes is the expected K/V."""
        toks = tokens_of(parts)
        prompt = np.concatenate([toks, np.array([4_000_000_000], dtype=np.uint32)])
        out = np.zeros(len(prompt) * FP.token_bytes, dtype=np.uint8)
        r = self._store().restore(prompt, out)
        n = r.tokens * FP.token_bytes
        exact = bool(np.array_equal(out[:n], kv_of(prompt)[:n]))
        return {"source": r.source, "tokens": r.tokens, "exact": exact}

    def op_save_session(
        self, name: str, parts: Parts, checkpoints: Sequence[int] = ()
    ) -> dict[str, Any]:
        toks = tokens_of(parts)
        self._store().save_session(name, toks, kv_of(toks), checkpoints=list(checkpoints))
        return {}

    def op_load_session(self, name: str, parts: Parts) -> dict[str, Any]:
        toks = tokens_of(parts)
        out = np.zeros(len(toks) * FP.token_bytes, dtype=np.uint8)
        conv = self._store().load_session(name, out)
        return {"tokens": len(conv.tokens), "exact": bool(np.array_equal(out, kv_of(toks)))}

    def op_delete_session(self, name: str) -> dict[str, Any]:
        return {"deleted": self._store().delete_session(name)}

    def op_stats(self) -> dict[str, Any]:
        s = self._store().stats()
        return {k: s[k] for k in ("parks_disk", "discards", "spills_refused", "spill_errors")}

    def op_stress(
        self, prefix: str, count: int, tokens: int, every: int, flush_every: int, base: int
    ) -> dict[str, Any]:
        """Park ``count`` conversations of ``tokens`` tokens (a segment every ``every``),
        flushing every ``flush_every`` parks; every failure is collected, none stops the run."""
        store = self._store()
        failures: list[str] = []

        def flush() -> None:
            try:
                store.flush()
            except SpillError as e:
                failures.extend(f"flush: {cid}: {cause!r}" for cid, cause in e.failures)

        for i in range(count):
            conv, kv = conversation(
                f"{prefix}-{i}", [[base + i * tokens, tokens]], even_cuts(tokens, every)
            )
            try:
                store.park(conv, kv)
            except Exception as e:  # a park must not fail: collect it with the rest
                failures.append(f"park {prefix}-{i}: {e!r}")
            if (i + 1) % flush_every == 0:
                flush()
        flush()
        return {"failures": failures}

    def op_close(self) -> dict[str, Any]:
        store, self.store = self._store(), None
        try:
            store.close()
        except SpillError as e:
            return {"spill_errors": [[cid, repr(cause)] for cid, cause in e.failures]}
        return {"spill_errors": []}


def main() -> None:
    worker = Worker()
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            reply = {"ok": True, **getattr(worker, f"op_{op}")(**req)}
        except Exception as e:
            reply = {
                "ok": False,
                "error": type(e).__name__,
                "msg": str(e),
                "trace": traceback.format_exc(),
            }
        print(json.dumps(reply), flush=True)
        if op == "close":
            return


if __name__ == "__main__":
    main()
