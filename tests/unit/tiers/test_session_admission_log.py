"""The admission log lines: "the same rule governs every disk read and save ... the streamed session
restore and the API session save are admitted under the transient floor when the parking floor does
not hold ... each printing `... under the transient RAM floor (need ... plus 512 MiB, not 2560
MiB)`". Parks and disk hits print it now; a session save or load admitted under the transient floor
prints nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import Store
from tests.conftest import tiny_fp

FP = tiny_fp()
MIB = 1 << 20


@pytest.mark.parametrize("call", ["save_session", "load_session"])
def test_a_session_under_the_transient_floor_says_so(tmp_path: Path, call: str) -> None:
    lines: list[str] = []
    free = [1 << 40]
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 2560,
        "park_min_free_mib": 512,
    }
    kv = np.random.default_rng(0).integers(0, 256, 100 * FP.token_bytes, dtype=np.uint8)
    with Store.open(FP, cfg, probe=lambda: free[0], warn=lines.append) as store:
        if call == "load_session":
            store.save_session("s", np.arange(100), kv)
        free[0] = 1000 * MIB  # above the transient floor only
        if call == "save_session":
            store.save_session("s", np.arange(100), kv)
        else:
            store.load_session("s", np.zeros_like(kv))
    said = [x for x in lines if "under the transient RAM floor" in x]
    assert said and "(need 6.2 KiB plus 512 MiB, not 2560 MiB)" in said[0], (
        f"{call} under the transient floor printed no admission log line: {lines}"
    )
