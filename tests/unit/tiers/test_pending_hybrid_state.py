"""Hybrid models and the ``pending`` source: docs/engine.md says
"``r.state`` is the running state at ``r.tokens`` for hybrid models (their restore stops only
where a state was saved)", and the disk path does so. A park with ``states`` whose newest
checkpoint has no state, restored while its write is in flight (``pending``) or from RAM,
resumes at that checkpoint with ``state=None``: the same prompt then gives 64 tokens and no
state, or 32 tokens and the state, depending only on whether the disk write has landed."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from tests.conftest import tiny_fp, writer_held

FP = tiny_fp()


def conversation() -> tuple[Conversation, np.ndarray]:
    lengths = [16, 32, 48, 64]
    conv = Conversation(
        "h", as_tokens(np.arange(64)), [Checkpoint(x) for x in lengths], cuts=[0, 16, 32, 48]
    )
    kv = np.random.default_rng(5).integers(0, 256, 64 * FP.token_bytes, dtype=np.uint8)
    return conv, kv


@pytest.mark.parametrize("source", ["pending", "ram"])
def test_a_hybrid_restore_stops_where_a_state_was_saved(tmp_path: Path, source: str) -> None:
    cfg: dict[str, Any] = (
        {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "c"), "cold_mib": 64}
        if source == "pending"
        else {"ram_mib": 4, "min_free_mib": 0, "park_min_free_mib": 0}
    )
    prompt = np.concatenate([np.arange(64), [1] * 6])
    out = np.zeros(70 * FP.token_bytes, np.uint8)
    with Store.open(FP, cfg) as store:
        held = writer_held(store) if source == "pending" else contextlib.nullcontext(None)
        with held as entered:
            conv, kv = conversation()
            store.park(conv, kv, states={32: b"state at 32"})
            if entered is not None:
                assert entered.wait(30)
            r = store.restore(prompt, out)
        assert r.source == source
        assert r.state is not None and r.tokens == 32, (
            f"a hybrid restore from {source} resumed at {r.tokens} with state {r.state!r}; the "
            "disk copy of the same park resumes at 32 with its state"
        )
