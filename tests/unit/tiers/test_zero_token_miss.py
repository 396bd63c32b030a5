"""A match of zero tokens is a miss: a checkpoint at 0 (which every conversation of a model
shares: the empty prefix) restores nothing, so no lookup or restore of an unrelated prompt
reports it as a hit, in any level, and it is counted as a miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation
from stratastore.chain import PrefixIndex, as_tokens
from stratastore.facade import Store
from tests.conftest import tiny_fp

FP = tiny_fp()


def _rooted(cid: str, n: int, base: int) -> tuple[Conversation, np.ndarray]:
    """``n`` tokens with a checkpoint at 0 (root) and at ``n``."""
    c = Conversation(cid, as_tokens(np.arange(base, base + n)), [Checkpoint(0), Checkpoint(n)])
    kv = np.random.default_rng(base).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return c, kv


def test_the_prefix_index_never_answers_a_zero_token_point() -> None:
    index = PrefixIndex()
    c, _ = _rooted("a", 32, 0)
    index.add(b"m" * 32, c)
    assert index.lookup(b"m" * 32, np.arange(1000, 1040)) is None
    assert index.lookup(b"m" * 32, np.arange(1000, 1040), page_tokens=16) is None
    hit = index.lookup(b"m" * 32, np.arange(0, 40))
    assert hit is not None and hit.length == 32


@pytest.mark.parametrize(
    "cfg",
    [
        {"ram_mib": 0, "park": "disk", "cold_mib": 64},
        {"ram_mib": 64, "park": "ram"},
    ],
    ids=["disk", "ram"],
)
def test_an_unrelated_prompt_is_a_miss_in_every_path_and_counter(
    tmp_path: Path, cfg: dict[str, Any]
) -> None:
    if "cold_mib" in cfg:
        cfg = {**cfg, "cold_dir": str(tmp_path / "cold")}
    with Store.open(FP, cfg) as store:
        c, kv = _rooted("rooted", 32, 0)
        store.park(c, kv)
        store.flush()
        unrelated = np.arange(5000, 5064)
        assert store.lookup(unrelated) is None
        out = np.zeros(64 * FP.token_bytes, np.uint8)
        got = store.restore(unrelated, out)
        assert (got.source, got.tokens) == ("none", 0)
        [many] = store.restore_many([(unrelated, out)])
        assert (many.source, many.tokens) == ("none", 0)
        s = store.stats()
        assert s["restore_misses"] == 2
        hits = {k: v for k, v in s.items() if k.startswith("hits_")}  # of what is configured
        assert "hits_ram" in hits and set(hits.values()) == {0}, hits
        assert s["tokens_restored"] == 0
        assert s["tokens_reread"] == 128
        # the conversation itself still restores whole
        assert store.restore(np.arange(0, 40), out).tokens == 32
