"""close() runs ``spill_ram_on_close`` (a catalog read, the admission probe, copies out of the
arena, warnings) *before* it flushes the spill writer. When that new step raises, close() skips the
flush and the writer's stop: the ``finally`` closes every level under the spill writer, and the
parks acknowledged before close (queued, or in their write) never land -- close() must lose nothing
that was acknowledged, whatever its new step raised."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Store
from stratastore.levels.errors import StoreError
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


conversation = conversation_kv


def test_close_flushes_acknowledged_parks_even_when_the_ram_spill_step_fails(
    tmp_path: Path,
) -> None:
    cfg: dict[str, Any] = {
        "ram_mib": 4,
        "spill_on": "park",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    a, kva = conversation("a", 64, 0)
    b, kvb = conversation("b", 64, 1000)
    store = Store.open(FP, cfg, warn=lambda m: None)
    real_write = store._tiers.write_disk_now
    entered, release, first_done = threading.Event(), threading.Event(), threading.Event()

    def held(snap: Any, *lock: Any) -> None:
        if entered.is_set():
            real_write(snap, *lock)
            return
        entered.set()
        try:
            assert release.wait(30)
            real_write(snap, *lock)
        finally:
            first_done.set()

    store._tiers.write_disk_now = held  # type: ignore[method-assign]
    assert store.park(a, kva).where == "ram"  # a's mirror: in its write (held)
    assert entered.wait(30)
    assert store.park(b, kvb).where == "ram"  # b's mirror: queued

    real_sync = store._tiers.view.sync

    def failing_sync() -> None:  # the catalog read of close's new step fails once (I/O error)
        store._tiers.view.sync = real_sync  # type: ignore[method-assign]
        raise StoreError("index read failed (injected)")

    store._tiers.view.sync = failing_sync  # type: ignore[method-assign]
    real_join = store._writes.join

    def join() -> None:  # close() flushes the writer: let the held write go on
        release.set()
        real_join()

    store._writes.join = join  # type: ignore[method-assign]
    errors: list[BaseException] = []

    def closing() -> None:
        try:
            store.close()
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=closing, daemon=True)
    t.start()
    t.join(30)
    release.set()  # close() returned without flushing: the held write goes on only now
    assert first_done.wait(30)  # the held write ended (on closed levels) before the reopen
    assert not t.is_alive()
    with Store.open(FP, cfg, warn=lambda m: None) as again:
        got = {c.conv_id: again.lookup(np.concatenate([c.tokens, [7]])) for c in (a, b)}
    assert got == {"a": ("disk", 64), "b": ("disk", 64)}, (
        f"acknowledged parks lost when close()'s RAM spill raised ({errors[:1]!r}): {got}"
    )
