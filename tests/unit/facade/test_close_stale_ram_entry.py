"""close() writes down what only RAM holds (spill_on_close) -- but a RAM entry can be an *older*
park of a conversation whose newer park went to disk (the RAM admission failed for it, so the park
went to disk under the transient floor and the RAM entry of the previous park stayed). close() then
writes that stale RAM copy over the newer, acknowledged disk copy: the newer park is lost after a
graceful restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from tests.conftest import tiny_fp

FP = tiny_fp()
MIB = 1 << 20


def conversation(cid: str, tokens: np.ndarray, seed: int) -> tuple[Conversation, np.ndarray]:
    n = len(tokens)
    lengths = [*range(16, n, 16), n]
    conv = Conversation(
        cid, as_tokens(tokens), [Checkpoint(x) for x in lengths], cuts=[0, *lengths[:-1]]
    )
    kv = np.random.default_rng(seed).integers(0, 256, n * FP.token_bytes, dtype=np.uint8)
    return conv, kv


@pytest.mark.parametrize("spill_on", ["park", "evict"])
def test_close_does_not_write_an_older_ram_park_over_a_newer_disk_park(
    tmp_path: Path, spill_on: str
) -> None:
    free = [1 << 40]
    cfg: dict[str, Any] = {
        "ram_mib": 4,
        "spill_on": spill_on,
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
        "min_free_mib": 100,
        "park_min_free_mib": 0,
    }
    v1_tokens = np.arange(0, 80)
    # the engine edits back in history: turn 2 keeps the first 40 tokens, then diverges
    v2_tokens = np.concatenate([np.arange(0, 40), np.arange(5000, 5120)])
    v1, kv1 = conversation("a", v1_tokens, 1)
    v2, kv2 = conversation("a", v2_tokens, 2)
    kv2[: 40 * FP.token_bytes] = kv1[: 40 * FP.token_bytes]  # one prefix, one K/V (a model)
    kv2_copy = kv2.copy()
    with Store.open(FP, cfg, probe=lambda: free[0], warn=lambda m: None) as store:
        assert store.park(v1, kv1).where == "ram"
        free[0] = 50 * MIB  # below the parking floor, above the transient one: disk
        assert store.park(v2, kv2).where == "disk"
        store.flush()
        # the newer park is what the store serves before close
        out = np.zeros(len(v2_tokens) * FP.token_bytes, np.uint8)
        assert store.restore(v2_tokens, out).tokens == len(v2_tokens)
        free[0] = 1 << 40
    # a graceful restart: the acknowledged newer park must still be there
    with Store.open(FP, cfg, warn=lambda m: None) as store:
        out = np.zeros(len(v2_tokens) * FP.token_bytes, np.uint8)
        r = store.restore(v2_tokens, out)
        assert (r.source, r.tokens) == ("disk", len(v2_tokens)), (
            f"close() wrote the older RAM park over the newer disk park: {r}"
        )
        assert np.array_equal(out, kv2_copy)


def test_close_writes_a_ram_park_whose_pictures_differ_from_the_disk_copy(tmp_path: Path) -> None:
    """close()'s "already on disk" test compares tokens only. A conversation re-parked with the
    same tokens but another picture (a multimodal prompt: the placeholder tokens of an image
    do not change with the image) is a different stored prefix (spec F-KEY-7), yet close()
    skips it as "on disk": after a graceful restart the acknowledged park is gone."""
    cfg: dict[str, Any] = {
        "ram_mib": 4,
        "slots": 1,
        "spill_on": "evict",
        "cold_dir": str(tmp_path / "c"),
        "cold_mib": 64,
        "min_free_mib": 0,
        "park_min_free_mib": 0,
    }
    tokens = np.arange(0, 64)
    m1, m2 = {4: b"\x01" * 32}, {4: b"\x02" * 32}

    def with_media(media: dict[int, bytes], seed: int) -> tuple[Conversation, np.ndarray]:
        conv, kv = conversation("a", tokens, seed)
        conv.media = dict(media)
        return conv, kv

    a1, kv1 = with_media(m1, 1)
    a2, kv2 = with_media(m2, 2)
    z, kvz = conversation("z", np.arange(9000, 9064), 3)
    with Store.open(FP, cfg, warn=lambda m: None) as store:
        assert store.park(a1, kv1).where == "ram"
        assert store.park(z, kvz).where == "ram"  # one slot: a (picture 1) spills to disk
        store.flush()
        assert store.park(a2, kv2.copy()).where == "ram"  # z spills; a (picture 2) RAM only
        store.flush()
        assert store.lookup(tokens, m2) == ("ram", 64)
    with Store.open(FP, cfg, warn=lambda m: None) as store:
        assert store.lookup(tokens, m2) == ("disk", 64), (
            "close() did not write the RAM park with another picture (it took the disk copy "
            "of the old picture for it)"
        )
