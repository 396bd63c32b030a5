"""The Store's docstring and docs/engine.md ("Threads and processes") say no
call holds the Store's lock over disk I/O or hashing, and that a restore never waits on another
conversation's disk write. ``save_session`` (its segment writes, fsyncs and manifest) and
``load_session`` (its reads and BLAKE3 validation) still run entirely under the lock: a restore
of an unrelated conversation on another engine thread waits for them."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Conversation, Store
from stratastore.levels.reader import SegmentReader
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


conversation = conversation_kv


def _restore_meanwhile(
    store: Store, b: Conversation, kvb: np.ndarray, entered: threading.Event
) -> bool:
    """Whether a restore of ``b`` on another thread completes while the session call is held
    inside its disk I/O (``entered`` set)."""
    assert entered.wait(30)
    out = np.zeros(kvb.size, np.uint8)
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(store.restore(b.tokens, out)), daemon=True)
    t.start()
    t.join(3)  # liveness: the restore needs the lock only to plan and account
    return bool(got) and got[0].tokens == len(b.tokens)


def test_a_restore_does_not_wait_for_a_session_save_on_another_thread(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        b, kvb = conversation("b", 64, 1000)
        store.park(b, kvb.copy())
        store.flush()
        writer = store._tiers.writer
        assert writer is not None
        real = writer.write
        entered, release = threading.Event(), threading.Event()

        def held(snap: Any, **kw: Any) -> bool:
            if kw.get("session"):
                entered.set()
                assert release.wait(30)
            return real(snap, **kw)

        writer.write = held  # type: ignore[method-assign]
        s = threading.Thread(
            target=lambda: store.save_session(
                "s", np.arange(5000, 5064), np.zeros(64 * FP.token_bytes, np.uint8)
            ),
            daemon=True,
        )
        s.start()
        try:
            done = _restore_meanwhile(store, b, kvb, entered)
        finally:
            release.set()
            s.join(30)
        assert done, "a restore of b waited for save_session's disk write (the Store's lock)"


def test_a_restore_does_not_wait_for_a_session_load_on_another_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        b, kvb = conversation("b", 64, 1000)
        store.park(b, kvb.copy())
        store.save_session("s", np.arange(5000, 5064), np.zeros(64 * FP.token_bytes, np.uint8))
        store.flush()
        real = SegmentReader._read_at
        entered, release = threading.Event(), threading.Event()

        def held(*args: Any, **kw: Any) -> Any:
            if not entered.is_set():  # the first read: the session load (b comes after)
                entered.set()
                assert release.wait(30)
            return real(*args, **kw)

        monkeypatch.setattr(SegmentReader, "_read_at", held)
        out = np.zeros(64 * FP.token_bytes, np.uint8)
        s = threading.Thread(
            target=lambda: store.load_session("s", out), name="loader", daemon=True
        )
        s.start()
        try:
            done = _restore_meanwhile(store, b, kvb, entered)
        finally:
            release.set()
            s.join(30)
        assert done, "a restore of b waited for load_session's reads (the Store's lock)"
