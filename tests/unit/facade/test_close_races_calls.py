"""Close racing the engine's calls: ``close()`` marks the store closed and closes its levels; a call
that passed its ``_check_open`` just before must still end in :class:`StoreClosed` (as ``park`` and
``restore`` do: they check again under the lock), never run on closed levels. ``lookup``,
``save_session``, ``load_session`` and ``delete_session`` check only before they take the lock: once
close() has closed the LMDB environment they operate on it anyway (an untyped ``lmdb.Error`` or a
StoreError telling the user the index is damaged and to run ``fsck --repair``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store, StoreClosed, facade
from tests.conftest import tiny_fp

FP = tiny_fp()


def disk_cfg(tmp_path: Path) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}


def _closed_while_inside(
    store: Store, monkeypatch: pytest.MonkeyPatch, hook: str, call: Any
) -> list[BaseException | object]:
    """Run ``call`` on a thread, hold it in ``facade.<hook>`` (after its open check, before
    its lock), close the store meanwhile, then let it go on. What it returned or raised."""
    real = getattr(facade, hook)
    entered, release = threading.Event(), threading.Event()

    def held(*args: Any, **kw: Any) -> Any:
        if threading.current_thread().name == "caller":
            entered.set()
            assert release.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(facade, hook, held)
    out: list[BaseException | object] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, name="caller", daemon=True)
    t.start()
    assert entered.wait(30)
    store.close()
    release.set()
    t.join(30)
    assert not t.is_alive()
    return out


def test_lookup_racing_close_raises_store_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(FP, disk_cfg(tmp_path))
    out = _closed_while_inside(store, monkeypatch, "as_tokens", lambda: store.lookup(np.arange(8)))
    assert isinstance(out[0], StoreClosed), f"lookup after close ran on closed levels: {out[0]!r}"


def test_save_session_racing_close_raises_store_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(FP, disk_cfg(tmp_path))
    kv = np.zeros(16 * FP.token_bytes, np.uint8)
    out = _closed_while_inside(
        store, monkeypatch, "as_tokens", lambda: store.save_session("s", np.arange(16), kv)
    )
    assert isinstance(out[0], StoreClosed), (
        f"save_session after close ran on closed levels: {out[0]!r}"
    )
