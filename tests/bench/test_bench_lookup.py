"""Benchmark: prefix lookup of a 200K-token prompt against 10,000 stored conversations.

Ten system prompts of 5,000 tokens; 10,000 conversations each continuing one of them for 500 to
3,000 tokens; one 200,000-token conversation among them. The prompt is that long conversation
edited 1,000 tokens before its end, so the lookup walks (and compares) 199,000 tokens. Measures;
never asserts a time (the figure goes in the README with the command that made it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stratastore.chain import Checkpoint, Conversation, PrefixIndex, as_tokens

MODEL = b"\x44" * 32
N_CONVS = 10_000
PROMPT_TOKENS = 200_000


@pytest.fixture(scope="module")
def stored() -> tuple[PrefixIndex, np.ndarray]:
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 150_000, 5_000) for _ in range(10)]
    index = PrefixIndex()
    for i in range(N_CONVS - 1):
        tail = rng.integers(0, 150_000, int(rng.integers(500, 3_000)))
        toks = np.concatenate([systems[i % 10], tail])
        ckpts = [Checkpoint(5_000, pinned=True), Checkpoint(len(toks))]
        index.add(MODEL, Conversation(f"c{i}", as_tokens(toks), ckpts, cuts=[0, 5_000]))
    long = np.concatenate([systems[3], rng.integers(0, 150_000, PROMPT_TOKENS - 5_000)])
    lengths = [5_000, *range(10_000, PROMPT_TOKENS, 10_000), PROMPT_TOKENS]
    index.add(
        MODEL,
        Conversation(
            "long", as_tokens(long), [Checkpoint(n) for n in lengths], cuts=[0, *lengths[:-1]]
        ),
    )
    prompt = long.copy()
    prompt[-1_000:] += 1
    return index, as_tokens(prompt)


Stored = tuple[PrefixIndex, np.ndarray]


def test_lookup_200k_prompt_10k_conversations(benchmark: Any, stored: Stored) -> None:
    index, prompt = stored
    benchmark.group = "lookup"
    benchmark.extra_info["prompt_tokens"] = len(prompt)
    benchmark.extra_info["conversations"] = len(index)
    m = benchmark(index.lookup, MODEL, prompt, page_tokens=16)
    assert m is not None and m.conv_id == "long" and m.matched == PROMPT_TOKENS - 1_000
    assert m.length == PROMPT_TOKENS - 1_000 - (PROMPT_TOKENS - 1_000 - 190_000) % 16
    if benchmark.stats is not None:
        med = benchmark.stats.stats.median
        print(
            f"\nlookup: {med * 1e6:.0f} us median for a {len(prompt):,}-token prompt against "
            f"{len(index):,} conversations ({med / len(prompt) * 1e9:.2f} ns/token)"
        )
