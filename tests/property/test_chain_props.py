"""Hypothesis: over any sequence of appended turns and edits back in history, a lookup only ever
returns an exact prefix of the prompt, and spread retention never keeps fewer distinct checkpoint
distances than LRU."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings, target
from hypothesis import strategies as st

from stratastore.chain import Checkpoint, Conversation, PrefixIndex, as_tokens, enforce_count

MODEL = b"\x33" * 32
SYSTEM = 50

# an operation: ("turn", n tokens) or ("edit", tokens back from the end, new turn length)
turn = st.tuples(st.just("turn"), st.integers(1, 150))
edit = st.tuples(st.just("edit"), st.integers(0, 3000), st.integers(1, 150))
# mostly turns (a conversation must grow past the checkpoint count before edits can tell the
# policies apart), with edits among them
ops = st.lists(st.one_of(turn, turn, turn, edit), min_size=1, max_size=60)


class Engine:
    """One slot under one policy: resume from the index, add a checkpoint at each turn's end."""

    def __init__(self, policy: str, count: int, page: int | None) -> None:
        self.policy, self.count, self.page = policy, count, page
        self.index = PrefixIndex()
        self.chain: list[Checkpoint] = [Checkpoint(SYSTEM, pinned=True)]
        self.tick = 0

    def prompt(self, tokens: np.ndarray) -> int:
        """Serve a prompt; returns where it resumed (after checking it is an exact prefix)."""
        m = self.index.lookup(MODEL, tokens, page_tokens=self.page)
        resumed = m.length if m else 0
        if m is not None:
            stored = self.index.stored_tokens(m.conv_id)
            assert m.length <= m.matched <= len(tokens)
            assert np.array_equal(stored[: m.matched], tokens[: m.matched])
        self.chain = [c for c in self.chain if c.length <= max(resumed, SYSTEM)]
        self.tick += 1
        self.chain.append(Checkpoint(len(tokens), last_used=self.tick))
        enforce_count(self.chain, self.count, self.policy)  # type: ignore[arg-type]
        conv = Conversation("slot", as_tokens(tokens), list(self.chain), cuts=[0, SYSTEM])
        self.index.add(MODEL, conv)
        return resumed

    def distances(self, end: int) -> set[int]:
        return {end - c.length for c in self.chain}


@settings(max_examples=300, deadline=None)
@given(ops=ops, count=st.integers(2, 8), seed=st.integers(0, 2**16))
# a case where the policies differ: spread still has a checkpoint 1,000 tokens back, LRU not
@example(ops=[("turn", 100)] * 60 + [("edit", 1000, 100)], count=6, seed=1)
def test_lookup_is_exact_and_spread_keeps_at_least_lru(
    ops: list[tuple[int, ...]], count: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 1000, SYSTEM).astype(np.uint32)
    spread, lru = Engine("spread", count, None), Engine("lru", count, None)
    pages = Engine("spread", count, 16)
    widest = 0
    for op in ops:
        if op[0] == "edit":
            back = min(int(op[1]), len(tokens) - SYSTEM)
            tokens = tokens[: len(tokens) - back].copy()
            if back:
                tokens[-1] ^= 1  # the edited token differs from the stored one
        n = int(op[-1])
        tokens = np.concatenate([tokens, rng.integers(0, 1000, n).astype(np.uint32)])
        spread.prompt(tokens)
        lru.prompt(tokens)
        pages.prompt(tokens)
        end = len(tokens)
        kept_spread, kept_lru = len(spread.distances(end)), len(lru.distances(end))
        widest = max(widest, kept_spread - kept_lru)
        assert kept_spread >= kept_lru
    target(float(widest))  # steer the search towards cases where the policies differ
