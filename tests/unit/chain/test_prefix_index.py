"""Prefix lookup: exact prefixes only, deepest point, pages for attention layouts, media,
models kept apart, removal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stratastore import ConfigError
from stratastore.chain import Checkpoint, Conversation, PrefixIndex, as_tokens

M1, M2 = b"\x01" * 32, b"\x02" * 32


def conv(
    cid: str,
    tokens: np.ndarray | list[int],
    ckpts: list[int],
    cuts: list[int] | None = None,
    media: dict[int, bytes] | None = None,
) -> Conversation:
    return Conversation(
        cid, as_tokens(tokens), [Checkpoint(n) for n in ckpts], media=media or {}, cuts=cuts or [0]
    )


@pytest.fixture
def index() -> PrefixIndex:
    idx = PrefixIndex()
    system = np.arange(1000, 1100)
    a = np.concatenate([system, np.arange(500)])
    b = np.concatenate([system, np.arange(500, 800)])
    idx.add(M1, conv("a", a, [100, 300, 600], cuts=[0, 100, 300]))
    idx.add(M1, conv("b", b, [100, 250, 400], cuts=[0, 100, 250]))
    return idx


def test_deepest_checkpoint_on_the_prompt_path(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500), [7, 7]])
    m = index.lookup(M1, prompt)
    assert m is not None and (m.conv_id, m.length, m.via, m.matched) == (
        "a",
        600,
        "checkpoint",
        600,
    )


def test_shared_root_two_conversations(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500, 700)])
    m = index.lookup(M1, prompt)
    assert m is not None and m.conv_id == "b" and m.length == 250 and m.matched == 300


def test_prompt_shorter_than_every_point(index: PrefixIndex) -> None:
    assert index.lookup(M1, np.arange(1000, 1050)) is None
    assert index.lookup(M1, []) is None
    assert index.lookup(M1, [5, 6, 7]) is None


def test_edit_far_back_and_mid_page_divergence(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500)])
    prompt[137] = 99999  # diverges 37 tokens into the conversation, mid-page
    m = index.lookup(M1, prompt)
    assert m is not None and m.length == 100 and m.matched == 137
    p = index.lookup(M1, prompt, page_tokens=16)
    assert p is not None and p.via == "page" and p.length == 132  # cut 100 + 2 whole pages


def test_page_resume_never_passes_the_divergence(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500)])
    for d in range(100, 600, 7):
        q = prompt.copy()
        q[d:] += 1
        m = index.lookup(M1, q, page_tokens=16)
        assert m is not None and m.length <= d and m.length <= m.matched == d


def test_other_model_never_hits(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500)])
    assert index.lookup(M2, prompt) is None
    index.add(M2, conv("c", prompt[:150], [150]))
    m = index.lookup(M2, prompt)
    assert m is not None and m.conv_id == "c" and m.length == 150


def test_media_must_match_too() -> None:
    idx = PrefixIndex()
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    pic, other = b"\xaa" * 32, b"\xbb" * 32
    idx.add(M1, conv("p", toks, [2, 6, 8], media={3: pic}))
    m = idx.lookup(M1, toks, {3: pic})
    assert m is not None and m.length == 8
    m = idx.lookup(M1, toks, {3: other})  # another picture at the same place
    assert m is not None and m.length == 2 and m.matched == 3
    m = idx.lookup(M1, toks)  # no picture where the stored one had one
    assert m is not None and m.length == 2
    m = idx.lookup(M1, toks, {5: pic, 3: pic})  # an extra picture further on
    assert m is not None and m.length == 2 and m.matched == 5
    idx.add(M1, conv("q", toks, [8], media={3: other}))
    m = idx.lookup(M1, toks, {3: other})
    assert m is not None and m.conv_id == "q" and m.length == 8


def test_remove_and_replace(index: PrefixIndex) -> None:
    prompt = np.concatenate([np.arange(1000, 1100), np.arange(500)])
    index.remove("a")
    m = index.lookup(M1, prompt)
    assert m is not None and m.conv_id == "b" and m.length == 100  # only the root is shared
    index.remove("b")
    assert index.lookup(M1, prompt) is None and len(index) == 0
    index.add(M1, conv("a", prompt, [50]))
    index.add(M1, conv("a", prompt, [80]))  # re-adding replaces
    m = index.lookup(M1, prompt)
    assert m is not None and m.length == 80 and len(index) == 1


def test_conversation_validation_is_typed() -> None:
    with pytest.raises(ConfigError, match="ascend"):
        conv("x", [1, 2, 3], [2, 1])
    with pytest.raises(ConfigError, match="past"):
        conv("x", [1, 2, 3], [5])
    with pytest.raises(ConfigError):
        as_tokens([-1])
    with pytest.raises(ConfigError):
        as_tokens([[1]])


def test_checkpoint_keys_are_shared_by_equal_prefixes(tmp_path: Path) -> None:
    from stratastore.levels.local import SegmentStore
    from tests.conftest import kv_bytes, tiny_fp

    fp = tiny_fp()
    root = fp.digest()
    system = np.arange(100, 140)
    a = conv("a", np.concatenate([system, np.arange(30)]), [40, 55, 70], cuts=[0, 40])
    b = conv("b", np.concatenate([system, np.arange(5, 25)]), [40, 60], cuts=[0, 40])
    ka, kb = a.checkpoint_keys(root), b.checkpoint_keys(root)
    assert ka[40] == kb[40] and ka[55] != kb[60]
    pic = conv(
        "p",
        np.concatenate([system, np.arange(30)]),
        [40, 70],
        cuts=[0, 40],
        media={45: b"\x01" * 32},
    )
    assert pic.checkpoint_keys(root)[40] == ka[40] and pic.checkpoint_keys(root)[70] != ka[70]
    # the keys are the segment store's keys: storing the segments yields the same ones
    with SegmentStore.open(tmp_path, fp) as store:
        parent = store.root_key
        for start, end, key in a.segments(root):
            r = store.put_kv(
                parent, a.tokens[start:end], kv_bytes(fp, end - start), token_start=start
            )
            assert r.key == key
            parent = key
        assert ka[70] in store
