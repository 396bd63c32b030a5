"""Opening a store with another level set must not delete what the previous set acknowledged (the
open's sweep of "unnamed" segments sees only the new last level's manifests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from tests.conftest import tiny_fp

FP = tiny_fp()


def _open(cfg: dict[str, Any]) -> Store:
    return Store.open(
        FP, {"ram_mib": 0, "park": "disk", **cfg}, probe=lambda: 1 << 40, warn=lambda _m: None
    )


def _conv(cid: str, n: int) -> tuple[Conversation, np.ndarray]:
    toks = np.arange(1000, 1000 + n, dtype=np.uint32)
    kv = ((np.arange(n * FP.token_bytes) * 7 + 3) & 0xFF).astype(np.uint8)
    return Conversation(cid, toks, [Checkpoint(8), Checkpoint(n)], cuts=[0, 8]), kv


def _restored(store: Store, conv: Conversation, kv: np.ndarray) -> int:
    prompt = np.concatenate([conv.tokens, np.array([4_000_000_000], dtype=np.uint32)])
    out = np.zeros(len(prompt) * FP.token_bytes, dtype=np.uint8)
    r = store.restore(prompt, out)
    assert np.array_equal(out[: r.tokens * FP.token_bytes], kv[: r.tokens * FP.token_bytes])
    return r.tokens


def test_adding_a_cold_level_keeps_the_warm_levels_conversations(tmp_path: Path) -> None:
    warm = {"warm_dir": str(tmp_path / "warm"), "warm_mib": 4}
    conv, kv = _conv("acknowledged", 16)
    with _open(warm) as s:
        assert s.park(conv, kv).where == "disk"
        s.flush()  # acknowledged: on disk, manifest in the warm directory (its last level)
        assert _restored(s, *_conv("acknowledged", 16)) == 16
    segs = sorted(p.name for p in (tmp_path / "warm").iterdir() if p.name.endswith(".seg"))
    assert segs, "the park left no segment files?"
    # the operator adds a cold tier below it, then (say) rolls the config back
    with _open({**warm, "cold_dir": str(tmp_path / "cold"), "cold_mib": 4}):
        pass
    left = sorted(p.name for p in (tmp_path / "warm").iterdir() if p.name.endswith(".seg"))
    assert left == segs, "opening with warm+cold deleted the warm level's acknowledged segments"
    with _open(warm) as s:
        assert _restored(s, *_conv("acknowledged", 16)) == 16
