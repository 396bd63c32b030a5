"""The engine's side of ``strata replay`` (:mod:`.replay`): a tiny model whose K/V are known
without storing them, and an engine that serves a prompt through the public Store API.

The "model" is a tiny fingerprint (2 layers x 1 KV head x 7 dims, fp16: 56 bytes a token,
16-token pages) whose K/V for the token ``id`` at position ``p`` is a row of a seeded random
table chosen by ``(id, p)`` (the row: each layer's K then V, 14 bytes each). Any prefix's K/V is
therefore known without storing it, so a restore can be checked bit for bit, and the whole
replay runs in a few seconds. Every request:

1. **restore** the prompt into the engine's per-layer K and V (``LayerKV``; ``max_tokens =
   len(prompt) - 1``: the model always needs the last token's logits, docs/engine.md);
2. **check** the restored prefix against the K/V that the engine computes for it, byte for byte;
3. **prefill** the rest: compute the K/V of the tokens the Store did not restore.

The workload parks the conversation with its checkpoints when it leaves its slot, its K/V packed
in pages along the cuts it passes (:meth:`Engine.capture`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from stratastore.chain import Conversation
from stratastore.facade import Store
from stratastore.format import ModelFingerprint
from stratastore.restore import LayerKV, pack_pages
from stratastore.tiers.records import Restored

__all__ = ["PLENTY", "TABLE_ROWS", "Bytes", "Engine", "plenty", "replay_fingerprint"]

Bytes = npt.NDArray[np.uint8]

PLENTY = 1 << 40  #: what the injected free-RAM probe reads: no floor ever binds
TABLE_ROWS = 4096  #: rows of the K/V table the tiny model draws from


def replay_fingerprint() -> ModelFingerprint:
    """The tiny model of the replay: 2 layers x 1 KV head x 7 dims, fp16 (56 bytes a token)."""
    return ModelFingerprint.create(
        "replay/tiny", n_layers=2, n_kv_heads=1, head_dim=7, page_tokens=16
    )


def plenty() -> int:
    """The injected free-RAM probe: :data:`PLENTY` (the machine's own free RAM never decides a
    park)."""
    return PLENTY


class Engine:
    """The engine's side of one Store: serves a prompt (restore, check, prefill) and counts what
    it checked and computed. K/V of token ``id`` at position ``p``: a row of a seeded table."""

    def __init__(self, store: Store, fp: ModelFingerprint, seed: int = 14) -> None:
        self.store, self.fp, self.tb = store, fp, fp.token_bytes
        self.row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize
        rng = np.random.default_rng(seed)
        self.table = rng.integers(0, 256, (TABLE_ROWS, self.tb), dtype=np.uint8)
        self.checked = self.mismatches = self.prefilled = self.prompt_tokens = 0

    def kv(self, tokens: npt.NDArray[np.uint32], start: int) -> Bytes:
        """The K/V the model computes for ``tokens`` placed at positions ``start...``, as the
        engine keeps it: ``[layers, 2, tokens, row]`` bytes (each layer's K and V rows)."""
        pos = np.arange(start, start + len(tokens), dtype=np.uint64)
        rows = (tokens.astype(np.uint64) * np.uint64(2654435761) + pos) % np.uint64(TABLE_ROWS)
        out: Bytes = self.table[rows].reshape(len(tokens), self.fp.n_layers, 2, self.row)
        return out.transpose(1, 2, 0, 3)

    def serve(self, prompt: npt.NDArray[np.uint32]) -> tuple[Restored, Bytes]:
        """Restore ``prompt``'s deepest stored prefix into per-layer K and V, check it bit for
        bit, prefill the rest; the Restored and the prompt's whole K/V (``[layers, 2, tokens,
        row]``, what the engine parks later through :meth:`capture`)."""
        n, layers = len(prompt), range(self.fp.n_layers)
        kv: Bytes = np.empty((self.fp.n_layers, 2, n, self.row), dtype=np.uint8)
        dest = LayerKV(self.fp, [kv[x, 0] for x in layers], [kv[x, 1] for x in layers])
        r = self.store.restore(prompt, dest, max_tokens=n - 1)
        self.checked += 1
        if not np.array_equal(kv[:, :, : r.tokens], self.kv(prompt[: r.tokens], 0)):
            self.mismatches += 1
        kv[:, :, r.tokens :] = self.kv(prompt[r.tokens :], r.tokens)  # prefill the rest
        self.prefilled += n - r.tokens
        self.prompt_tokens += n
        return r, kv

    def capture(self, kv: Bytes, conv: Conversation) -> Bytes:
        """``kv`` (of :meth:`serve`) as the engine parks ``conv``: in pages from each of its
        segment bounds (its cuts and checkpoints, spec F-SEG-4)."""
        n, layers = len(conv.tokens), range(self.fp.n_layers)
        starts = [s for s, _ in conv.boundaries()]
        k, v = [kv[x, 0, :n] for x in layers], [kv[x, 1, :n] for x in layers]
        return pack_pages(self.fp, k, v, n, starts)
