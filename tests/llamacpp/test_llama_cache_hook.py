"""``Llama.set_cache(StrataLlamaCache(...))``: llama-cpp-python's own cache hook on stratastore.
A completion parks its state; another ``Llama`` whose prompt shares only a prefix with it gets
that prefix back and completes with the tokens it gives with no cache at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .engine import load

RNG = np.random.default_rng(3)
SHARED = [int(x) for x in RNG.integers(3, 500, 60)]
FIRST = SHARED + [int(x) for x in RNG.integers(3, 500, 10)]
SECOND = SHARED + [int(x) for x in RNG.integers(3, 500, 10)]


def config(path: Path) -> dict[str, Any]:
    return {
        "park": "disk",
        "ram_mib": 0,
        "cold_dir": str(path),
        "cold_mib": 256,
        "page_resume": True,
    }


def complete(llm: Any, prompt: list[int]) -> str:
    out = llm.create_completion(prompt, max_tokens=16, temperature=0.0)
    return str(out["choices"][0]["text"])


@pytest.mark.parametrize("flash_attn", [False, True])
def test_a_shared_prefix_is_restored_through_the_hook(
    tiny: Path, tmp_path: Path, flash_attn: bool
) -> None:
    from stratastore.adapters.llamacpp import StrataLlamaCache

    a = load(tiny, flash_attn=flash_attn)
    with StrataLlamaCache(a, config(tmp_path)) as cache:
        a.set_cache(cache)
        complete(a, FIRST)
        assert FIRST in cache and cache.cache_size > 0
    b = load(tiny, flash_attn=flash_attn)
    with StrataLlamaCache(b, config(tmp_path)) as cache:
        b.set_cache(cache)
        got = complete(b, SECOND)
        restored = cache.store.store.stats()["tokens_restored"]
    assert 48 <= restored <= len(SHARED)  # the shared prefix, to its last whole page at least
    assert got == complete(load(tiny, flash_attn=flash_attn), SECOND)


def test_a_prompt_with_nothing_stored_is_a_miss(tiny: Path, tmp_path: Path) -> None:
    from stratastore.adapters.llamacpp import StrataLlamaCache

    llm = load(tiny)
    with StrataLlamaCache(llm, config(tmp_path)) as cache:
        assert FIRST not in cache
        with pytest.raises(KeyError):
            cache[FIRST]
        llm.set_cache(cache)
        assert complete(llm, FIRST) == complete(load(tiny), FIRST)


def test_a_park_that_fails_is_logged_and_the_completion_served(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from stratastore.adapters.llamacpp import StrataLlamaCache
    from stratastore.errors import StrataError

    llm = load(tiny)
    with StrataLlamaCache(llm, config(tmp_path)) as cache:

        def failing(*args: Any, **kw: Any) -> None:
            raise StrataError("the disk level is full (injected)")

        monkeypatch.setattr(cache.store, "park_rows", failing)
        llm.set_cache(cache)
        assert complete(llm, FIRST) == complete(load(tiny), FIRST)
        assert cache.errors == 1 and "injected" in caplog.text


def test_a_hit_is_loaded_into_the_context_and_no_state_handed_to_load_state(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cache[prompt]`` loads the stored prefix into the ``Llama`` itself and raises
    ``KeyError``: ``Llama.load_state`` (a copy of the whole state) never runs."""
    from llama_cpp import Llama

    from stratastore.adapters.llamacpp import StrataLlamaCache

    a = load(tiny)
    with StrataLlamaCache(a, config(tmp_path)) as cache:
        a.set_cache(cache)
        complete(a, FIRST)
    loads: list[int] = []
    monkeypatch.setattr(Llama, "load_state", lambda self, state: loads.append(state.n_tokens))
    b = load(tiny)
    with StrataLlamaCache(b, config(tmp_path)) as cache:
        with pytest.raises(KeyError):
            cache[SECOND]
        held = b.n_tokens
        assert 48 <= held <= len(SHARED)
        assert list(b.input_ids[:held]) == SECOND[:held]
        b.set_cache(cache)
        evaluated: list[int] = []
        eval_ = Llama.eval
        monkeypatch.setattr(
            Llama, "eval", lambda self, t: (evaluated.append(len(t)), eval_(self, t))
        )
        got = complete(b, SECOND)
        restored = cache.store.store.stats()["tokens_restored"]
    assert restored == held  # the completion read nothing more: the Llama held the prefix
    assert evaluated[0] == len(SECOND) - held  # and evaluated the prompt from there on
    assert loads == []
    assert got == complete(load(tiny), SECOND)


def test_a_restore_llama_cpp_refuses_is_logged_and_the_prompt_evaluated_whole(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import llama_cpp

    from stratastore.adapters.llamacpp import StrataLlamaCache

    a = load(tiny)
    with StrataLlamaCache(a, config(tmp_path)) as cache:
        a.set_cache(cache)
        complete(a, FIRST)
    b = load(tiny)
    with StrataLlamaCache(b, config(tmp_path)) as cache:
        monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", lambda *args: 0)
        b.set_cache(cache)
        got = complete(b, SECOND)
        assert cache.errors == 1 and "refused the restored state" in caplog.text
    assert got == complete(load(tiny), SECOND)
