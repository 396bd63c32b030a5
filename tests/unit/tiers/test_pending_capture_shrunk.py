"""A park in flight is served from its capture (source ``pending``). With ``spill_on = park`` the
capture's Conversation object is also the RAM entry's, and with ``park_truncate`` the RAM cache
shrinks an entry *in place* to make room for a later park (``Conversation.truncate_to``). The
outbox's index still holds the full length, but ``deliver_capture`` walks the now-truncated
``conv.boundaries()``: into a per-layer destination it writes only the tokens up to the landing, and
the restore reports the full length. The engine then attends over K/V the store never wrote (its
buffer's old contents)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.restore import LayerKV, pack_pages
from tests.conftest import tiny_fp, writer_held

FP = tiny_fp()
ROW = FP.n_kv_heads * FP.head_dim * 2


def layered(
    cid: str, n: int, base: int, step: int
) -> tuple[Conversation, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    lengths = [*range(step, n, step), n]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *lengths[:-1]],
    )
    k = [np.random.default_rng(base + i).integers(0, 256, (n, ROW), np.uint8) for i in range(2)]
    v = [np.random.default_rng(base + 9 + i).integers(0, 256, (n, ROW), np.uint8) for i in range(2)]
    return conv, pack_pages(FP, k, v, n, [0, *lengths[:-1]]), k, v


def shrinking_cfg(tmp_path: Path) -> dict[str, Any]:
    """A 1 MiB RAM level that truncates parks and mirrors every park to a cold level."""
    return {
        "ram_mib": 1,
        "park_truncate": True,
        "spill_on": "park",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }


def test_a_pending_capture_shrunk_in_ram_meanwhile_delivers_what_it_reports(
    tmp_path: Path,
) -> None:
    cfg = shrinking_cfg(tmp_path)
    n = 10_000  # 640 KB of the 1 MiB RAM budget
    x, kvx, kx, vx = layered("x", n, 0, 1000)
    y, kvy, _, _ = layered("y", 8_000, 50_000, 1000)
    with Store.open(FP, cfg, warn=lambda m: None) as store:
        with writer_held(store) as entered:
            assert store.park(x, kvx).where == "ram"  # x's mirror write is held in flight
            assert entered.wait(30)
            assert store.park(y, kvy).where == "ram"  # RAM shrinks x to make room for y
            ko = [np.full((n + 1, ROW), 0xEE, np.uint8) for _ in range(2)]
            vo = [np.full((n + 1, ROW), 0xEE, np.uint8) for _ in range(2)]
            prompt = np.arange(0, n + 1)
            r = store.restore(prompt, LayerKV(FP, ko, vo))
        got = r.tokens
        for i in range(2):
            assert np.array_equal(ko[i][:got], kx[i][:got]) and np.array_equal(
                vo[i][:got], vx[i][:got]
            ), (
                f"restore reported {r.source} {got} tokens but layer {i} holds the store's K/V "
                f"only up to token "
                f"{int(np.flatnonzero((ko[i][:got] != kx[i][:got]).any(axis=1))[0])}"
            )


def test_a_mirror_write_in_flight_is_not_changed_under_the_writer_by_a_ram_shrink(
    tmp_path: Path,
) -> None:
    """The same shared Conversation, seen from the spill writer: it now writes without the
    Store's lock, so the RAM shrink of another park can cut the conversation between the
    segments it planned and the manifest it builds. The acknowledged park's mirror then fails
    (``SpillError``: "a K/V segment needs at least one token") and nothing of it is on disk."""
    cfg = shrinking_cfg(tmp_path)
    x, kvx, _, _ = layered("x", 10_000, 0, 1000)
    y, kvy, _, _ = layered("y", 8_000, 50_000, 1000)
    with Store.open(FP, cfg, warn=lambda m: None) as store:
        level = store._tiers.levels[0].store
        real = level.put_kv
        entered, release = threading.Event(), threading.Event()

        def held(*args: Any, **kw: Any) -> Any:
            if not entered.is_set():  # inside x's mirror write, its segments planned
                entered.set()
                release.wait(30)
            return real(*args, **kw)

        level.put_kv = held  # type: ignore[method-assign]
        try:
            assert store.park(x, kvx).where == "ram"
            assert entered.wait(30)
            assert store.park(y, kvy).where == "ram"  # shrinks x's RAM entry in place
        finally:
            release.set()
        store.flush()  # raises SpillError today: x's acknowledged mirror did not land
        level.put_kv = real  # type: ignore[method-assign]
        store._tiers.view.sync()
        dc = store._tiers.view.get("x")
        assert dc is not None and len(dc.conv.tokens) == 10_000
