"""The engine's hot path through the Store: a restore never waits on another conversation's disk
write (its own in-flight park is served from the capture), ``close()`` writes down what only RAM
holds, and ``max_tokens`` leaves the engine a token to compute. Each test failed on the earlier
code."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import InvalidRequest, as_tokens
from stratastore.levels.reader import SegmentReader
from stratastore.restore import LayerKV, pack_pages
from tests.conftest import conversation_kv, tiny_fp, writer_held

FP = tiny_fp()
MIB = 1 << 20


conversation = conversation_kv


def disk_cfg(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64, **kw}


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def test_restore_of_another_conversation_never_waits_for_a_pending_write(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        b, kvb = conversation("b", 64, 1000)
        store.park(b, kvb.copy())
        store.flush()  # b is on disk
        a, kva = conversation("a", 64, 0)
        with writer_held(store) as entered:
            store.park(a, kva.copy())
            assert entered.wait(30)  # a's write is in flight and held there
            out = np.zeros(70 * FP.token_bytes, np.uint8)
            t, got = in_thread(lambda: store.restore(np.concatenate([b.tokens, [1] * 6]), out))
            t.join(30)  # liveness, not speed: once, this waited for a's write
            done_while_held = not t.is_alive()
        t.join()
        assert done_while_held, "a restore of b waited for a's disk write"
        assert (got[0].source, got[0].tokens) == ("disk", 64)
        assert np.array_equal(out[: kvb.size], kvb)


def test_a_park_in_flight_is_restored_from_its_capture(tmp_path: Path) -> None:
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        a, kva = conversation("a", 64, 0)
        with writer_held(store) as entered:
            store.park(a, kva.copy())
            assert entered.wait(30)
            prompt = np.concatenate([a.tokens, [5, 5]])
            assert store.lookup(prompt) == ("pending", 64)
            out = np.zeros(len(prompt) * FP.token_bytes, np.uint8)
            t, got = in_thread(lambda: store.restore(prompt, out))
            t.join(30)
            done_while_held = not t.is_alive()
        t.join()
        assert done_while_held, "a restore of a's own park waited for its disk write"
        assert (got[0].source, got[0].tokens) == ("pending", 64)
        assert np.array_equal(out[: kva.size], kva)
        assert store.stats()["hits_pending"] == 1
        # once written, the same prompt is a validated disk hit
        r = store.restore(prompt, np.zeros_like(out))
        assert (r.source, r.tokens) == ("disk", 64)


def test_pending_capture_into_a_layer_destination(tmp_path: Path) -> None:
    n, row = 48, FP.n_kv_heads * FP.head_dim * 2
    k = [np.random.default_rng(i).integers(0, 256, (n, row), np.uint8) for i in range(2)]
    v = [np.random.default_rng(9 + i).integers(0, 256, (n, row), np.uint8) for i in range(2)]
    lengths = [16, 32, n]
    conv = Conversation(
        "l", as_tokens(np.arange(n)), [Checkpoint(x) for x in lengths], cuts=[0, 16, 32]
    )
    kv = pack_pages(FP, k, v, n, [0, 16, 32])
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        with writer_held(store) as entered:
            store.park(conv, kv)
            assert entered.wait(30)
            ko = [np.zeros((n + 4, row), np.uint8) for _ in range(2)]
            vo = [np.zeros((n + 4, row), np.uint8) for _ in range(2)]
            r = store.restore(np.arange(n + 4), LayerKV(FP, ko, vo))
            assert (r.source, r.tokens) == ("pending", n)
        for x in range(2):
            assert np.array_equal(ko[x][:n], k[x]) and np.array_equal(vo[x][:n], v[x])


@pytest.mark.parametrize("spill_on_close", [True, False])
def test_close_writes_down_what_only_ram_holds(tmp_path: Path, spill_on_close: bool) -> None:
    cfg = {
        "ram_mib": 4,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
        "spill_on_close": spill_on_close,
    }
    a, kva = conversation("a", 80, 0)
    with Store.open(FP, cfg) as store:
        assert store.park(a, kva.copy()).where == "ram"
    prompt = np.concatenate([a.tokens, [3]])
    with Store.open(FP, cfg) as store:  # a graceful restart
        out = np.zeros(len(prompt) * FP.token_bytes, np.uint8)
        r = store.restore(prompt, out)
        if spill_on_close:
            assert (r.source, r.tokens) == ("disk", 80)
            assert np.array_equal(out[: kva.size], kva)
        else:
            assert r.tokens == 0


def test_close_does_not_rewrite_what_is_on_disk(tmp_path: Path) -> None:
    cfg = {
        "ram_mib": 4,
        "spill_on": "park",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    a, kva = conversation("a", 80, 0)
    with Store.open(FP, cfg) as store:
        store.park(a, kva.copy())
        store.flush()
        writes = store.stats()["levels"]["cold"]["entries"]
    with Store.open(FP, cfg) as store:
        assert store.stats()["levels"]["cold"]["entries"] == writes


def test_close_refused_by_admission_leaves_a_warning(tmp_path: Path) -> None:
    free = [1 << 40]
    warnings: list[str] = []
    cfg = {
        "ram_mib": 4,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 1,
    }
    a, kva = conversation("a", 80, 0)
    store = Store.open(FP, cfg, probe=lambda: free[0], warn=warnings.append)
    assert store.park(a, kva.copy()).where == "ram"
    free[0] = 0  # no RAM to pass the capture through: not admitted
    store.close()
    assert any("stays unwritten" in w and "a" in w for w in warnings)


def test_max_tokens_leaves_a_token_to_compute(tmp_path: Path) -> None:
    a, kva = conversation("a", 64, 0)
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        store.park(a, kva.copy())
        store.flush()
        out = np.zeros(64 * FP.token_bytes, np.uint8)
        assert store.restore(a.tokens, out).tokens == 64  # the default: the deepest prefix
        r = store.restore(a.tokens, np.zeros_like(out), max_tokens=63)
        assert r.tokens == 48  # the deepest checkpoint at or below 63
        assert store.restore(a.tokens, np.zeros_like(out), max_tokens=0).tokens == 0
        got = store.restore_many(
            [(a.tokens, np.zeros_like(out)), (a.tokens, np.zeros_like(out))], max_tokens=[None, 40]
        )
        assert [g.tokens for g in got] == [64, 32]
        for bad in (-1, 1.5, "3", True):
            with pytest.raises(InvalidRequest, match="max_tokens"):
                store.restore(a.tokens, out, max_tokens=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="max_tokens"):
            store.restore_many([(a.tokens, out)], max_tokens=[1, 2])


def test_max_tokens_with_page_resume(tmp_path: Path) -> None:
    a, kva = conversation("a", 64, 0)
    with Store.open(FP, disk_cfg(tmp_path, page_resume=True)) as store:
        store.park(a, kva.copy())
        store.flush()
        out = np.zeros(64 * FP.token_bytes, np.uint8)
        r = store.restore(a.tokens, out, max_tokens=63)
        assert r.tokens == 60  # the last whole page (4 tokens) at or below 63
        assert np.array_equal(out[: 60 * FP.token_bytes], kva[: 60 * FP.token_bytes])


def test_restores_on_two_threads_do_not_wait_for_each_others_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore held inside its disk read does not hold the Store: another thread's restore
    of another conversation completes meanwhile (once, one lock held every restore,
    its reads and hashing included)."""
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        a, kva = conversation("a", 64, 0)
        b, kvb = conversation("b", 64, 1000)
        store.park(a, kva.copy())
        store.park(b, kvb.copy())
        store.flush()
        real = SegmentReader._read_at
        release, entered = threading.Event(), threading.Event()
        held: list[int] = []

        def slow(*args: Any, **kw: Any) -> Any:
            if not held:  # the first read (a's) waits inside the read pass
                held.append(threading.get_ident())
                entered.set()
                release.wait(60)
            return real(*args, **kw)

        monkeypatch.setattr(SegmentReader, "_read_at", slow)
        out_a = np.zeros(kva.size, np.uint8)
        ta, got_a = in_thread(lambda: store.restore(a.tokens, out_a))
        assert entered.wait(30)
        out_b = np.zeros(kvb.size, np.uint8)
        tb, got_b = in_thread(lambda: store.restore(b.tokens, out_b))
        tb.join(30)  # liveness: b's restore must not wait for a's read
        b_done_while_a_held = not tb.is_alive()
        release.set()
        ta.join(30)
        tb.join(30)
        assert b_done_while_a_held, "a restore waited for another thread's disk read"
        assert got_a[0].tokens == 64 and got_b[0].tokens == 64
        assert np.array_equal(out_a, kva) and np.array_equal(out_b, kvb)


def test_close_waits_for_a_restore_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() from another thread while a restore reads: the restore finishes on open levels
    (validated, whole), then the store closes; nothing is read from a closed level."""
    store = Store.open(FP, disk_cfg(tmp_path))
    a, kva = conversation("a", 64, 0)
    store.park(a, kva.copy())
    store.flush()
    real = SegmentReader._read_at
    release, entered = threading.Event(), threading.Event()

    def slow(*args: Any, **kw: Any) -> Any:
        entered.set()
        release.wait(60)
        return real(*args, **kw)

    monkeypatch.setattr(SegmentReader, "_read_at", slow)
    out = np.zeros(kva.size, np.uint8)
    ta, got = in_thread(lambda: store.restore(a.tokens, out))
    assert entered.wait(30)
    tc, _ = in_thread(store.close)
    tc.join(1)
    closed_early = not tc.is_alive()
    release.set()
    ta.join(30)
    tc.join(30)
    assert not closed_early, "close() returned while a restore was reading"
    assert got[0].tokens == 64 and np.array_equal(out, kva)


def test_a_pinned_ram_conversation_stays_after_a_whole_restore(tmp_path: Path) -> None:
    """A restore of all of a RAM conversation mounts it live (takes it out), except a pinned
    one: a pinned system prompt serves every request that extends it."""
    cfg = {"ram_mib": 4, "min_free_mib": 0, "park_min_free_mib": 0}
    sysp, kvs = conversation("system", 32, 0)
    other, kvo = conversation("other", 32, 500)
    with Store.open(FP, cfg) as store:
        store.park(sysp, kvs.copy(), pin=True)
        store.park(other, kvo.copy())
        for _ in range(2):
            out = np.zeros(40 * FP.token_bytes, np.uint8)
            r = store.restore(np.concatenate([sysp.tokens, [1] * 8]), out)
            assert (r.source, r.tokens) == ("ram", 32)
            assert np.array_equal(out[: kvs.size], kvs)
        out = np.zeros(32 * FP.token_bytes, np.uint8)
        assert store.restore(other.tokens, out).tokens == 32  # unpinned: taken out (live)
        assert store.lookup(other.tokens) is None


def _layered(n: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    row = FP.n_kv_heads * FP.head_dim * 2
    rng = np.random.default_rng(seed)
    return (
        [rng.integers(0, 256, (n, row), np.uint8) for _ in range(FP.n_layers)],
        [rng.integers(0, 256, (n, row), np.uint8) for _ in range(FP.n_layers)],
    )


Layers = list[np.ndarray]


def _restore_layers(store: Store, tokens: np.ndarray, n: int) -> tuple[int, Layers, Layers]:
    row = FP.n_kv_heads * FP.head_dim * 2
    ko = [np.zeros((len(tokens), row), np.uint8) for _ in range(FP.n_layers)]
    vo = [np.zeros((len(tokens), row), np.uint8) for _ in range(FP.n_layers)]
    r = store.restore(tokens, LayerKV(FP, ko, vo))
    return r.tokens, ko, vo


@pytest.mark.parametrize("park", ["ram", "disk"])
def test_retention_never_changes_the_layout_the_capture_was_packed_in(
    tmp_path: Path, park: str
) -> None:
    """A capture is packed in pages that start at each segment boundary (cuts and checkpoints,
    F-SEG-4). A checkpoint that retention drops, or one it remembers from an earlier park,
    must not move a boundary: the bytes would be read in another layout than they were written
    in, and delivered, validated, in the wrong places (a dropped checkpoint that was not a cut
    did this once; a remembered one did in its first version)."""
    cfg = {
        "ram_mib": 4 if park == "ram" else 0,
        "park": park,
        "checkpoints": 2,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 16,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    n = 90
    k, v = _layered(n, 1)
    toks = as_tokens(np.arange(1000, 1000 + n))
    with Store.open(FP, cfg) as store:
        # three checkpoints, not cuts, not on page boundaries; count 2: one is dropped
        lengths = [10, 31, 50]
        conv = Conversation("a", toks[:50], [Checkpoint(x) for x in lengths], cuts=[0])
        cuts = [b for b, _ in conv.boundaries()]  # how the engine packed it: 0, 10, 31
        store.park(conv, pack_pages(FP, [x[:50] for x in k], [x[:50] for x in v], 50, cuts))
        store.flush()
        got, ko, vo = _restore_layers(store, toks[:50], 50)
        assert got == 50
        for x in range(FP.n_layers):
            assert np.array_equal(ko[x][:50], k[x][:50]) and np.array_equal(vo[x][:50], v[x][:50])
        # the next turn: the engine passes only its newest checkpoint, packed with its own cuts
        conv2 = Conversation("a", toks, [Checkpoint(n)], cuts=[0, 50])
        store.park(conv2, pack_pages(FP, k, v, n, [0, 50]))
        store.flush()
        got, ko, vo = _restore_layers(store, toks, n)
        assert got == n
        for x in range(FP.n_layers):
            assert np.array_equal(ko[x][:n], k[x][:n]) and np.array_equal(vo[x][:n], v[x][:n])


def test_a_capped_restore_needs_room_only_for_its_cap(tmp_path: Path) -> None:
    a, kva = conversation("a", 64, 0)
    with Store.open(FP, disk_cfg(tmp_path)) as store:
        store.park(a, kva.copy())
        store.flush()
        out = np.zeros(48 * FP.token_bytes, np.uint8)
        assert store.restore(a.tokens, out, max_tokens=48).tokens == 48
        assert np.array_equal(out, kva[: out.size])
        from stratastore.restore import DestinationRefused

        with pytest.raises(DestinationRefused, match=r"room for 48 of them \(max_tokens=48\)"):
            store.restore(a.tokens, out[: 40 * FP.token_bytes], max_tokens=48)
        with pytest.raises(DestinationRefused, match="room for all of them"):
            store.restore(a.tokens, out)


def test_pin_must_be_a_bool(tmp_path: Path) -> None:
    from stratastore.tiers.records import InvalidConversation

    a, kva = conversation("a", 32, 0)
    with Store.open(FP, {"ram_mib": 4, "min_free_mib": 0}) as store:
        with pytest.raises(InvalidConversation, match="pin must be True or False"):
            store.park(a, kva, pin="yes")  # type: ignore[arg-type]
        assert store.lookup(a.tokens) is None  # nothing was parked
