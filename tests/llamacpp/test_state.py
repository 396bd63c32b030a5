"""The per-sequence state of llama.cpp (``llama_state_seq_get_data``) as the tests' own reader
of it (:mod:`.layout`, apart from the adapter's) reads it, and the prefix trick the adapter
rests on: the state of the first P tokens is the first P cells of a longer state
(and, with V transposed, the first P of each V row); loaded into a fresh context it continues
bit for bit as the context that evaluated those P tokens itself."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from . import layout as S
from .engine import adopt, get_seq, load, logits, pos_max, set_seq

N, P = 40, 16
PROMPT = [int(x) for x in np.random.default_rng(7).integers(3, 500, N)]


def evaluated(path: Path, n: int = N, **kw: Any) -> Any:
    llm = load(path, **kw)
    llm.eval(PROMPT[:n])
    return llm


@pytest.mark.parametrize("flash_attn", [False, True])
def test_layout_sizes_and_round_trip(tiny: Path, flash_attn: bool) -> None:
    buf = get_seq(evaluated(tiny, flash_attn=flash_attn))
    st = S.parse(buf)
    s0 = st["streams"][0]
    assert (st["kind"], st["seq_id"], st["n_stream"], s0["cell_count"]) == ("seq", 0, 1, N)
    assert s0["positions"].tolist() == list(range(N))
    assert all(ids.tolist() == [0] for ids in s0["seq_ids"])
    # flash attention off: V is stored transposed (one row per element, a column per cell)
    assert s0["v_trans"] is (not flash_attn)
    row = 2 * 16 * 2  # kv heads x head dim x f16
    assert [k.shape for k in s0["k"]] == [(N, row)] * 2
    v_shape = (2 * 16, N, 2) if s0["v_trans"] else (N, row)
    assert [v.shape for v in s0["v"]] == [v_shape] * 2
    header, meta, per_layer = 4 + 4 + 4 + 4, N * (4 + 4 + 4), 12 + N * row
    assert len(buf) == header + meta + 8 + 2 * 2 * per_layer
    assert S.serialize(st) == buf


def test_whole_context_state_is_the_same_stream(tiny: Path) -> None:
    import ctypes

    import llama_cpp

    llm = evaluated(tiny)
    n = llama_cpp.llama_state_get_size(llm.ctx)
    buf = (ctypes.c_uint8 * n)()
    assert llama_cpp.llama_state_get_data(llm.ctx, buf, n) == n
    whole, seq = S.parse(bytes(buf)), S.parse(get_seq(llm))
    assert (whole["kind"], whole["arch"]) == ("context", "llama")
    for a, b in zip(whole["streams"][0]["k"], seq["streams"][0]["k"], strict=True):
        assert np.array_equal(a, b)
    assert S.serialize(whole) == bytes(buf)


CACHES = [
    ("tiny", False, "f16", None),
    ("tiny", True, "f16", None),
    ("tiny", False, "q8_0", "f16"),  # a quantized K needs no flash attention
    ("wide", True, "q8_0", "f16"),
    ("wide", True, "q8_0", "q8_0"),  # a quantized V does (and V is then never transposed)
]


@pytest.mark.parametrize(("model", "flash_attn", "kv", "v"), CACHES)
def test_prefix_state_continues_bit_for_bit(
    request: pytest.FixtureRequest, model: str, flash_attn: bool, kv: str, v: str | None
) -> None:
    path = request.getfixturevalue(model)
    kw: dict[str, Any] = {"flash_attn": flash_attn, "kv": kv, "v": v}
    full = evaluated(path, **kw)
    cut = S.serialize(S.prefix(S.parse(get_seq(full)), P))
    ref = evaluated(path, P, **kw)
    assert cut == get_seq(ref), "the first P cells differ from the state of P tokens"
    ref.eval(PROMPT[P:])

    restored = load(path, **kw)
    assert set_seq(restored, cut) == len(cut)
    assert pos_max(restored) == P - 1
    adopt(restored, PROMPT[:P])
    restored.eval(PROMPT[P:])
    assert np.array_equal(logits(restored).view(np.uint32), logits(ref).view(np.uint32))
    assert get_seq(restored) == get_seq(ref)
    # and against one pass over all N tokens: bit-equal on the machines measured so far, but
    # another batch split may sum in another order, so only closeness is asserted here
    np.testing.assert_allclose(logits(restored), logits(full), rtol=0, atol=1e-4)


def _damaged(cut: bytes) -> dict[str, bytes]:
    k_type = S.parse(cut)
    k_type["streams"][0]["k_type"][0] = 8  # q8_0 where the context holds f16
    two_seqs = S.parse(cut)
    two_seqs["streams"][0]["seq_ids"][3] = np.array([0, 1], "<i4")
    return {
        "truncated": cut[:-1],
        "truncated in the cells": cut[:40],
        "K type": S.serialize(k_type),
        "a cell of two sequences": S.serialize(two_seqs),
    }


def test_set_data_refusals(tiny: Path) -> None:
    cut = S.serialize(S.prefix(S.parse(get_seq(evaluated(tiny))), P))
    # a wrong magic is refused before anything is touched
    llm = evaluated(tiny, 8)
    assert set_seq(llm, b"\0\0\0\0" + cut[4:]) == 0
    assert pos_max(llm) == 7
    # past the magic, a refusal empties the destination sequence (seq_rm, then state_clear)
    for name, data in _damaged(cut).items():
        llm = evaluated(tiny, 8)
        assert set_seq(llm, data) == 0, name
        assert pos_max(llm) == -1, name
    other = evaluated(tiny, 8, flash_attn=True)
    assert set_seq(other, cut) == 0  # V transposed into a context that keeps it plain
    assert pos_max(other) == -1


def test_set_data_does_not_check(tiny: Path, tiny_other: Path) -> None:
    cut = S.serialize(S.prefix(S.parse(get_seq(evaluated(tiny))), P))
    # trailing bytes: it returns what it read, not an error
    assert set_seq(load(tiny), cut + b"\xff" * 16) == len(cut)
    # the source seq id in the header is read and ignored
    assert set_seq(load(tiny), cut[:4] + struct.pack("<i", 5) + cut[8:]) == len(cut)
    # another model of the same geometry: loaded without a word (the store must fingerprint)
    assert set_seq(load(tiny_other), cut) == len(cut)
    # a state of 0 cells leaves the destination as it was (no seq_rm on that path)
    empty = S.serialize(S.select(S.parse(cut), np.zeros(P, bool)))
    llm = evaluated(tiny, 8)
    assert set_seq(llm, empty) == len(empty) == 16
    assert pos_max(llm) == 7


def test_llama_cache_hook_takes_a_cut_state(tiny: Path) -> None:
    """llama-cpp-python's own hook (``Llama.set_cache``) restores a prefix cut from a stored
    whole-context state; the completion is the one computed from scratch."""
    from llama_cpp.llama import Llama, LlamaState
    from llama_cpp.llama_cache import BaseLlamaCache

    class PrefixCache(BaseLlamaCache):
        def __init__(self, n_ctx: int, n_vocab: int) -> None:
            super().__init__()
            self.n_ctx, self.n_vocab = n_ctx, n_vocab
            self.saved: dict[tuple[int, ...], bytes] = {}
            self.hits: list[int] = []

        @property
        def cache_size(self) -> int:
            return sum(map(len, self.saved.values()))

        def _best(self, key: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
            found = [(Llama.longest_token_prefix(k, key), k) for k in self.saved]
            return max(((n, k) for n, k in found if n), default=None)

        def __contains__(self, key: Any) -> bool:
            return self._best(tuple(key)) is not None

        def __getitem__(self, key: Any) -> LlamaState:
            best = self._best(tuple(key))
            if best is None:
                raise KeyError(key)
            n = min(best[0], len(key) - 1)  # one token left to decode: fresh logits
            data = S.serialize(S.prefix(S.parse(self.saved[best[1]]), n))
            ids = np.zeros(self.n_ctx, np.intc)  # load_state takes the whole array
            ids[:n] = best[1][:n]
            self.hits.append(n)
            scores = np.zeros((min(n, 512), self.n_vocab), np.single)
            return LlamaState(ids, scores, n, data, len(data), 0)

        def __setitem__(self, key: Any, value: LlamaState) -> None:
            self.saved[tuple(key)] = bytes(value.llama_state[: value.llama_state_size])

    rng = np.random.default_rng(3)
    shared = [int(x) for x in rng.integers(3, 500, 60)]
    first, second = (shared + [int(x) for x in rng.integers(3, 500, 10)] for _ in range(2))

    def complete(llm: Any, prompt: list[int]) -> str:
        out = llm.create_completion(prompt, max_tokens=16, temperature=0.0)
        return str(out["choices"][0]["text"])

    a = load(tiny)
    cache = PrefixCache(a.n_ctx(), a.n_vocab())
    a.set_cache(cache)
    complete(a, first)  # parks the state of `first` and its completion
    b = load(tiny)
    b.set_cache(cache)
    assert complete(b, second) == complete(load(tiny), second)
    assert cache.hits == [60]
