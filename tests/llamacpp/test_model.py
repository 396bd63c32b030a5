"""The GGUF written at test time is a model llama.cpp loads, evaluates and decodes from,
deterministically; two seeds are two models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .engine import load, logits
from .models import CHAT_TEMPLATE

PROMPT = [int(x) for x in np.random.default_rng(7).integers(3, 500, 40)]


def greedy(llm: Any, prompt: list[int], n: int = 48) -> list[int]:
    llm.reset()
    out: list[int] = []
    for tok in llm.generate(prompt, temp=0.0, top_k=1):
        out.append(int(tok))
        if len(out) == n:
            return out
    return out


def test_loads_and_evaluates_token_ids(tiny: Path) -> None:
    llm = load(tiny)
    assert (llm.n_vocab(), llm.token_bos(), llm.token_eos()) == (512, 1, 2)
    llm.eval(PROMPT)
    assert llm.n_tokens == len(PROMPT)
    assert np.isfinite(logits(llm)).all()


def test_greedy_decoding_is_deterministic_and_varied(tiny: Path) -> None:
    llm = load(tiny)
    first = greedy(llm, PROMPT)
    assert greedy(llm, PROMPT) == first
    assert greedy(load(tiny), PROMPT) == first  # a fresh context decodes the same
    assert len(set(first)) >= 24, f"the model repeats itself: {first}"


def test_two_seeds_are_two_models(tiny: Path, tiny_other: Path) -> None:
    a, b = load(tiny), load(tiny_other)
    a.eval(PROMPT)
    b.eval(PROMPT)
    assert not np.array_equal(logits(a), logits(b))
    assert greedy(a, PROMPT) != greedy(b, PROMPT)


def test_tokenizer_and_chat_template(tiny: Path) -> None:
    llm = load(tiny)
    text = b"Hello world\n"
    ids = llm.tokenize(text)
    assert ids[0] == llm.token_bos()
    assert llm.detokenize(ids) == text
    assert llm.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    out = llm.create_chat_completion(
        messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0
    )
    assert out["choices"][0]["finish_reason"] in ("length", "stop")
