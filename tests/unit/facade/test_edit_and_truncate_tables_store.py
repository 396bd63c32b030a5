"""The 200-turn edit table and the park-truncate episode through the Store, driven as an engine
drives it: one ``Store.park`` per turn, the restores in between, not the simulator.

The 200-turn edit table (``--prompt-cache-spread``): 200 turns of 1,000 tokens after a 9,525-token
system prompt, 6 checkpoints; spread keeps 0, 1K, 3K, 8K, 43K and 200K (the root) before the end, so
an edit 6K back re-reads 8K and one 42K back 43K; least recent use keeps 0..4K and the root and
re-reads 200K. The park-truncate episode (``STRATA_PARK_TRUNCATE``): a chain failing the RAM floor
parks its deepest checkpoint prefix that passes it; pinned entries are never truncated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from strata_harness.sim import AgentEdit, run_agent_edit
from stratastore import ModelFingerprint, Store
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.restore import LayerKV, pack_pages
from tests.conftest import tiny_fp

SYSTEM, TURNS, TURN = 9525, 200, 1000  # the 200-turn edit table's simulation
END = SYSTEM + TURNS * TURN
BIG = 1 << 40
MIB = 1 << 20
EDIT_TABLE = {  # policy -> (kept, tokens before the end), {edit back: tokens re-read}
    "spread": ([0, 1000, 3000, 8000, 43000, 200000], {6000: 8000, 42000: 43000}),
    "lru": ([0, 1000, 2000, 3000, 4000, 200000], {6000: 200000, 42000: 200000}),
}
# 4 bytes a token: the 209,525 tokens fit in 1 MiB
FP4 = ModelFingerprint.create("tables/tiny", n_layers=1, n_kv_heads=1, head_dim=1, page_tokens=16)
RNG = np.random.default_rng(4)
HELD = RNG.integers(0, 150_000, END, dtype=np.uint32)
KV = RNG.integers(0, 256, END * FP4.token_bytes, dtype=np.uint8)


# the engine's K/V per token (one layer, one head, one 2-byte element): what a restore gives back
K = RNG.integers(0, 1 << 16, (END, 1, 1), dtype=np.uint16)
V = RNG.integers(0, 1 << 16, (END, 1, 1), dtype=np.uint16)
#: how an engine passes its checkpoints: the new turn's end only (with the pinned root at the
#: first park) and a cut at every turn start; every checkpoint it made, cut alike; or its pinned
#: root and its newest checkpoint, and no cuts at all
PATTERNS = ("newest-only", "whole-list", "root-and-newest-no-cuts")


def turn_conv(t: int, pattern: str) -> Conversation:
    """Turn ``t``'s conversation as the engine parks it, by calling ``pattern``."""
    end = SYSTEM + t * TURN
    root, newest = Checkpoint(SYSTEM, pinned=True), Checkpoint(end, last_used=t)
    cuts = [0, *range(SYSTEM, end, TURN)]
    if pattern == "whole-list":
        cks = [root, *(Checkpoint(SYSTEM + i * TURN, last_used=i) for i in range(1, t + 1))]
    elif pattern == "newest-only":
        cks = [root, newest] if t == 1 else [newest]
    else:
        cks, cuts = [root, newest], [0]
    return Conversation("agent", HELD[:end].copy(), cks, cuts=cuts)


def capture(conv: Conversation) -> npt.NDArray[np.uint8]:
    """The engine's K/V of ``conv`` packed as it parks it: in pages from each of its bounds."""
    n = len(conv.tokens)
    return pack_pages(FP4, [K[:n]], [V[:n]], n, [s for s, _ in conv.boundaries()])


def engine_run(store: Store, turns: range, pattern: str, restore: bool = True) -> Conversation:
    """Each turn: restore the prompt (the previous park comes back whole), then park it."""
    conv = None
    for t in turns:
        end = SYSTEM + t * TURN
        if restore and t > 1:
            assert restored_tokens(store, HELD[:end]) == end - TURN
        conv = turn_conv(t, pattern)
        store.park(conv, capture(conv))
    assert conv is not None
    return conv


def before_end(conv: Conversation) -> list[int]:
    return sorted(len(conv.tokens) - c.length for c in conv.checkpoints)


def restored_tokens(store: Store, prompt: npt.NDArray[np.uint32]) -> int:
    """Restore ``prompt`` into the engine's per-layer K and V; the restored tokens are the
    parked K/V, element for element, whatever cuts the parks came with."""
    k, v = np.zeros((len(prompt), 1, 1), np.uint16), np.zeros((len(prompt), 1, 1), np.uint16)
    n = store.restore(prompt, LayerKV(FP4, [k], [v])).tokens
    assert np.array_equal(k[:n], K[:n]) and np.array_equal(v[:n], V[:n])
    return n


def reread_after_edit(store: Store, back: int) -> int:
    """Re-read tokens of the held conversation rewritten ``back`` tokens before its end."""
    prompt = HELD.copy()
    prompt[END - back] ^= 1  # the first rewritten token differs
    return END - restored_tokens(store, prompt)


def ram_store(policy: str, **kw: Any) -> Store:
    cfg = {"ram_mib": 1, "slots": 2, "min_free_mib": 0, "checkpoints": 6, "retention": policy}
    return Store.open(FP4, {**cfg, **kw}, probe=lambda: BIG)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("policy", ["spread", "lru"])
def test_edit_table_through_store_park_turn_by_turn(policy: str, pattern: str) -> None:
    """Once, spread kept 0/1K/6K/24K/72K of a whole list (re-reading 6K and 72K) and
    only the newest of a newest-only engine (re-reading everything); an engine passing its root
    and newest checkpoint with no cuts kept only those two (re-reading 200K either way)."""
    kept, reread = EDIT_TABLE[policy]
    with ram_store(policy) as store:
        conv = engine_run(store, range(1, TURNS + 1), pattern)
        assert before_end(conv) == kept  # what the last park kept (the store set it)
        assert {b for seg in conv.boundaries() for b in seg} >= {c.length for c in conv.checkpoints}
        assert {back: reread_after_edit(store, back) for back in reread} == reread
    for back, n in reread.items():  # the simulator says the same
        sim = run_agent_edit(AgentEdit(SYSTEM, TURNS, TURN, 6, back, policy))  # type: ignore[arg-type]
        assert (sim["kept"], sim["reread_tokens"]) == (kept, n)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_edit_table_continues_from_the_disk_chain_after_a_restart(
    tmp_path: Path, pattern: str
) -> None:
    cfg = {
        "ram_mib": 0,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "checkpoints": 6,
        "retention": "spread",
    }
    with Store.open(FP4, cfg, probe=lambda: BIG) as store:
        engine_run(store, range(1, 151), pattern, restore=False)
    with Store.open(FP4, cfg, probe=lambda: BIG) as store:  # a new process: no memory but disk
        conv = engine_run(store, range(151, TURNS + 1), pattern, restore=False)
        store.flush()
        assert before_end(conv) == EDIT_TABLE["spread"][0]
        assert {b: reread_after_edit(store, b) for b in (6000, 42000)} == EDIT_TABLE["spread"][1]


def test_an_edit_keeps_what_is_still_a_prefix_and_adds_the_new() -> None:
    with ram_store("spread") as store:
        engine_run(store, range(1, TURNS + 1), "newest-only")
        edit_at = END - 6000  # the client rewrites the last 6K and adds 2K
        tokens = np.concatenate([HELD[:edit_at], RNG.integers(0, 150_000, 8000, np.uint32)])
        tokens[edit_at] = HELD[edit_at] ^ 1
        n = len(tokens)
        # no cuts: the remembered checkpoints below the edit are kept all the same (the store
        # cuts the capture at them)
        conv = Conversation("agent", as_tokens(tokens), [Checkpoint(n - 2000), Checkpoint(n)])
        store.park(conv, np.zeros(n * FP4.token_bytes, np.uint8))
    old_kept = sorted(END - x for x in EDIT_TABLE["spread"][0])
    assert [c.length for c in conv.checkpoints] == [
        *(x for x in old_kept if x <= edit_at),  # root, 43K and 8K before the old end
        n - 2000,
        n,
    ]
    assert conv.checkpoints[0].pinned  # the remembered root keeps its pin


def test_a_hybrid_model_resumes_only_where_a_park_carried_a_state() -> None:
    """The store keeps no running state across parks: a remembered checkpoint that a hybrid
    model's park passes no state for counts as kept, but is not a resume point of that park."""
    with ram_store("spread") as store:
        for t in range(1, 11):
            end = SYSTEM + t * TURN
            if t > 1:
                out = np.zeros(end * FP4.token_bytes, np.uint8)
                assert store.restore(HELD[:end], out).state == b"%d" % (end - TURN)
            conv = turn_conv(t, "newest-only")
            store.park(conv, KV[: end * FP4.token_bytes].copy(), {end: b"%d" % end})
            assert [c.length for c in conv.checkpoints] == [SYSTEM, end][t > 1 :]  # as passed
        prompt = HELD[:end].copy()
        prompt[end - 1500] ^= 1  # resumable only at checkpoints with no state parked
        r = store.restore(prompt, np.zeros(end * FP4.token_bytes, np.uint8))
        assert (r.tokens, r.state) == (0, None)


# -- the park-truncate episode ---------------------------------------------------------------
FP64 = tiny_fp()  # 64 bytes a token


def chain_conv(cid: str, n: int, every: int, base: int) -> tuple[Conversation, npt.NDArray[Any]]:
    lengths = [*range(every, n, every), n]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(x) for x in lengths],
        cuts=[0, *lengths[:-1]],
    )
    kv = np.random.default_rng(base).integers(0, 256, n * FP64.token_bytes, dtype=np.uint8)
    return conv, kv


def store_001(free: Callable[[], int], truncate: bool = True) -> Store:
    cfg = {
        "ram_mib": 1,
        "slots": 2,
        "min_free_mib": 1,
        "park_truncate": truncate,
        "min_tokens": 5000,
    }
    return Store.open(FP64, cfg, probe=free)


def restored(store: Store, conv: Conversation) -> tuple[str, int, npt.NDArray[np.uint8]]:
    out = np.zeros(len(conv.tokens) * FP64.token_bytes, np.uint8)
    r = store.restore(conv.tokens, out)
    return r.source, r.tokens, out


def test_no_disk_parks_the_prefix_that_passes_the_ram_floor() -> None:
    # free RAM: the 1 MiB floor plus room for 2,500 of the 4,000 tokens (64 bytes each)
    with store_001(lambda: MIB + 2500 * 64) as store:
        conv, kv = chain_conv("a", 4000, 500, 0)
        tokens = conv.tokens.copy()
        rep = store.park(conv, kv.copy())
        # the deepest checkpoint within the floor, even below min_tokens (5,000)
        assert (rep.where, rep.floor, rep.tokens) == ("ram", "parking", 2500)
        out = np.zeros(4000 * FP64.token_bytes, np.uint8)
        r = store.restore(tokens, out)
        assert (r.source, r.tokens) == ("ram", 2500)
        assert np.array_equal(out[: 2500 * 64], kv[: 2500 * 64])  # bit-exact
        assert not out[2500 * 64 :].any()
    with store_001(lambda: MIB + 2500 * 64, truncate=False) as store:  # all or nothing
        conv, kv = chain_conv("a", 4000, 500, 0)
        rep = store.park(conv, kv)
        assert (rep.where, rep.tokens) == ("discard", 0) and store.stats()["discards"] == 1


def test_a_pinned_entry_is_never_truncated() -> None:
    a, kv_a = chain_conv("a", 10_000, 1000, 0)  # budget 1 MiB: 16,384 tokens
    b, kv_b = chain_conv("b", 8000, 1000, 100_000)
    with store_001(lambda: BIG) as store:  # unpinned, a is shrunk to its own checkpoint
        store.park(a, kv_a.copy())
        assert store.park(b, kv_b.copy()).where == "ram"
        source, n, out = restored(store, a)
        assert (source, n) == ("ram", 8000)  # 8,000 + 8,000 fit in 16,384: a's landing
        assert np.array_equal(out[: n * 64], kv_a[: n * 64])
    free = [BIG]
    a, _ = chain_conv("a", 10_000, 1000, 0)
    b, _ = chain_conv("b", 8000, 1000, 100_000)
    with store_001(lambda: free[0]) as store:
        assert store.park(a, kv_a.copy(), pin=True).where == "ram"
        assert store.park(b, kv_b.copy()).where == "discard"  # refused: a is not shrunk for it
        free[0] = MIB + 5500 * 64  # the floor now admits 5,500 tokens: 5,000 fit beside a
        c, kv_c = chain_conv("c", 8000, 1000, 200_000)
        rep = store.park(c, kv_c.copy())
        assert (rep.where, rep.tokens) == ("ram", 5000)  # the newcomer truncated instead
        free[0] = BIG
        assert restored(store, c)[:2] == ("ram", 5000)
        source, n, out = restored(store, a)
        assert (source, n) == ("ram", 10_000) and np.array_equal(out, kv_a)  # whole
