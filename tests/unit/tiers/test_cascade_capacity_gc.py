"""The last level's capacity GC frees space by shortening the oldest conversations in the *catalog*,
whatever level their segments are in. When the cascade asks a cold level full of saved sessions for
room, cold's ``make_room`` removes conversation after conversation (each one "freed" but none of its
bytes were cold's: they live in warm) until none is left, then refuses: one refused degradation
deletes every acknowledged conversation of the store, and the park that asked is refused anyway,
although warm is empty by then."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from stratastore import Checkpoint, Conversation, Store, StrataError
from stratastore.facade import SpillError
from tests.conftest import tiny_fp

FP = tiny_fp()  # 64 bytes a token


def _toks(base: int, n: int) -> np.ndarray:
    return np.arange(base, base + n, dtype=np.uint32)


def _kv(base: int, n: int) -> np.ndarray:
    return ((np.arange(n * FP.token_bytes) * 7 + base) & 0xFF).astype(np.uint8)


def _restored(store: Store, base: int, n: int) -> int:
    prompt = np.concatenate([_toks(base, n), np.array([4_000_000_000], dtype=np.uint32)])
    out = np.zeros(len(prompt) * FP.token_bytes, dtype=np.uint8)
    return store.restore(prompt, out).tokens


def test_a_refused_cascade_step_does_not_wipe_the_warm_levels_conversations(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "warm_dir": str(tmp_path / "warm"),
        "warm_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 1,
    }
    with Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda _m: None) as s:
        # saved sessions fill cold (the cascade moves the older ones down) until refused
        saved = 0
        while saved < 30:
            try:
                s.save_session(
                    f"s{saved}", _toks(10_000_000 + saved * 10_000, 2048), _kv(saved, 2048)
                )
            except StrataError:  # the levels are full: expected
                break
            saved += 1
        for j in range(saved):  # those still in warm go: warm is empty, cold full of sessions
            if s.stats()["levels"]["warm"]["entries"] == 0:
                break
            s.delete_session(f"s{saved - 1 - j}")
        assert s.stats()["levels"]["warm"]["entries"] == 0
        n, parked = 2200, []
        for j in range(6):  # six conversations fit in warm
            s.park(Conversation(f"c{j}", _toks(j * 5000, n), [Checkpoint(n)]), _kv(j * 5000, n))
            s.flush()
            parked.append(j)
        assert [_restored(s, j * 5000, n) for j in parked] == [n] * 6
        # the seventh needs room in warm: warm degrades its oldest to cold, which cannot take it
        s.park(Conversation("c6", _toks(6 * 5000, n), [Checkpoint(n)]), _kv(6 * 5000, n))
        with contextlib.suppress(SpillError):  # refusing c6 is fine; deleting c0..c5 is not
            s.flush()
        kept = [_restored(s, j * 5000, n) for j in parked]
        assert kept != [0] * 6, (
            f"a refused cascade step removed every acknowledged conversation (restores: {kept}); "
            f"warm now holds {s.stats()['levels']['warm']['entries']} entries"
        )
