"""Models whose memory is not a plain K/V cache, a recurrent one (mamba) and a sliding-window one
(gemma2), made at test time: their sequence state is stored whole at checkpoints (the end of each
message, every N tokens, the end of each completion) and restored at the deepest stored
checkpoint that is a prefix of the prompt, through llama-cpp-python's cache hook. A second turn
in another process replies as a full evaluation does; an edit back in history resumes at an
earlier checkpoint; a flipped byte in the deepest checkpoint's state restores the one before it
with the same reply; fsck finds the store clean."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore.errors import ConfigError
from tests.fresh_process import run_step
from tests.fsck_cli import fsck_deep

from .chat_turn import store_config
from .engine import load

SYSTEM = {"role": "system", "content": "You answer in one line."}
FIRST = {"role": "user", "content": "Tell me about the tides of the northern sea. " * 4}
SECOND = {"role": "user", "content": "And the winds?"}
EVERY = 64  #: a checkpoint every this many tokens, besides the message ends


def turn(model: Path, store: Path | None, **prompt: Any) -> dict[str, Any]:
    """One turn in a fresh process (:mod:`tests.llamacpp.chat_turn`): ``messages=`` (a chat)
    or ``prompt=`` (token ids)."""
    args = {"model": str(model), "every": EVERY, **prompt}
    if store is not None:
        args["store"] = str(store)
    return run_step("tests.llamacpp.chat_turn", args)


@pytest.fixture(params=["mamba", "gemma2"])
def model(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(request.param)
    return path


def test_a_second_turn_in_another_process_replies_as_a_full_evaluation(
    model: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    rng = np.random.default_rng(7)
    first = turn(model, store, prompt=[1, *(int(x) for x in rng.integers(3, 500, 100))])
    assert first["restored"] == 0 and first["errors"] == 0
    prompt = first["held"] + [int(x) for x in rng.integers(3, 500, 20)]
    second = turn(model, store, prompt=prompt)
    assert second["errors"] == 0
    assert second["restored"] == len(first["held"])  # the first turn's end: prompt and reply
    assert second["reply"] == turn(model, None, prompt=prompt)["reply"]
    fsck = fsck_deep(store)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_a_chat_resumes_at_its_deepest_checkpoint_and_after_an_edit_at_an_earlier_one(
    model: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = turn(model, store, messages=[SYSTEM, FIRST])
    chat = [SYSTEM, FIRST, {"role": "assistant", "content": first["reply"]}, SECOND]
    second = turn(model, store, messages=chat)
    # the end of the first user message at least (a message end, where a checkpoint is)
    assert second["restored"] >= _template_tokens(model, [SYSTEM, FIRST])
    assert second["reply"] == turn(model, None, messages=chat)["reply"]
    edited = {"role": "user", "content": FIRST["content"][:-12] + "the southern sea?"}
    chat = [SYSTEM, edited, {"role": "assistant", "content": first["reply"]}, SECOND]
    resumed = turn(model, store, messages=chat)
    # before the edit: the system prompt's end at least, the deepest checkpoint of it at most
    assert _template_tokens(model, [SYSTEM]) <= resumed["restored"]
    assert resumed["restored"] < _template_tokens(model, [SYSTEM, edited]) - 8
    assert resumed["reply"] == turn(model, None, messages=chat)["reply"]


def test_a_flipped_byte_in_a_state_restores_the_checkpoint_before_it(
    model: Path, tmp_path: Path
) -> None:
    from stratastore.adapters.llamacpp import LlamaCheckpointStore

    store = tmp_path / "store"
    rng = np.random.default_rng(5)
    prompt = [1, *(int(x) for x in rng.integers(3, 500, 150))]
    llm = load(model, n_ctx=1024)
    with LlamaCheckpointStore.open(llm, store_config(str(store))) as s:
        assert s.prefill(prompt[:120], every=40) == [40, 80]
        before = _data_files(store)
        llm.eval(prompt[80:120])
        assert s.park().where == "disk"  # the checkpoint at 120
    added = _data_files(store) - before
    states = [p for p in added if p.stat().st_size > 8192]  # the token pages are small
    assert len(states) == 1, sorted(p.stat().st_size for p in added)
    raw = bytearray(states[0].read_bytes())
    raw[4096 + 100] ^= 0x01  # in the state, after the segment's 4 KiB header
    states[0].write_bytes(bytes(raw))

    def reply(llm: Any) -> list[int]:
        out = []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            out.append(int(tok))
            if len(out) == 12:
                return out
        return out

    llm = load(model, n_ctx=1024)
    with LlamaCheckpointStore.open(llm, store_config(str(store))) as s:
        assert s.lookup(prompt) == 120
        assert s.restore(prompt) == 80  # the damaged state is passed over, never loaded
        got = reply(llm)
    assert got == reply(load(model, n_ctx=1024))


def test_one_llama_repeating_a_prompt_or_editing_it_replies_as_a_full_evaluation(
    model: Path, tmp_path: Path
) -> None:
    from stratastore.adapters.llamacpp import StrataLlamaCache

    rng = np.random.default_rng(9)
    prompt = [1, *(int(x) for x in rng.integers(3, 500, 150))]
    edited = prompt[:100] + [int(x) for x in rng.integers(3, 500, 30)]

    def complete(llm: Any, p: list[int]) -> str:
        return str(llm.create_completion(p, max_tokens=12, temperature=0.0)["choices"][0]["text"])

    llm = load(model, n_ctx=1024)
    cfg = {**store_config(str(tmp_path / "store")), "page_resume": True}
    with StrataLlamaCache(llm, cfg, checkpoint_tokens=40) as cache:
        llm.set_cache(cache)
        first = complete(llm, prompt)
        # the same prompt again: the Llama holds it and its reply; a memory that cannot be
        # cut back to the prompt (recurrent) restores the checkpoint at 120
        before = cache.store.store.stats()["tokens_restored"]
        assert complete(llm, prompt) == first
        again = cache.store.store.stats()["tokens_restored"] - before
        reads = []
        real = cache.store.store.restore
        cache.store.store.restore = lambda *a, **k: reads.append(1) or real(*a, **k)
        got = complete(llm, edited)  # the Llama holds the old prompt: cut back, or restored
        restored = cache.store.store.stats()["tokens_restored"] - before - again
    assert first == complete(load(model, n_ctx=1024), prompt)
    assert got == complete(load(model, n_ctx=1024), edited)
    if "mamba" in model.name:
        assert again == 120
        assert restored == 80 and len(reads) == 1  # one read: page_resume is off here
    else:  # a sliding-window cache is cut back to what it holds of the prompt
        assert again == restored == 0


def test_a_llama_keeping_every_tokens_logits_or_only_the_window_is_refused(
    mamba: Path, gemma2: Path, tmp_path: Path
) -> None:
    import llama_cpp

    from stratastore.adapters.llamacpp import LlamaCheckpointStore

    cfg = store_config(str(tmp_path / "store"))
    llm = llama_cpp.Llama(str(mamba), n_ctx=256, logits_all=True, verbose=False)
    with pytest.raises(ConfigError, match="logits_all"):
        LlamaCheckpointStore.open(llm, cfg)
    llm = llama_cpp.Llama(str(gemma2), n_ctx=256, swa_full=False, verbose=False)
    with pytest.raises(ConfigError, match="swa_full"):
        LlamaCheckpointStore.open(llm, cfg)
    # a model with no sliding window: the setting changes nothing, and is taken
    llm = llama_cpp.Llama(str(mamba), n_ctx=256, swa_full=False, verbose=False)
    LlamaCheckpointStore.open(llm, cfg).close()


def test_the_page_store_and_the_checkpoint_store_refuse_each_others_models(
    tiny: Path, mamba: Path, gemma2: Path, tmp_path: Path
) -> None:
    from stratastore.adapters.llamacpp import LlamaCheckpointStore, LlamaCppStore

    cfg = store_config(str(tmp_path / "store"))
    for path, what in [(mamba, "a recurrent state"), (gemma2, "a sliding-window")]:
        with pytest.raises(ConfigError, match=f"{what}.*LlamaCheckpointStore"):
            LlamaCppStore.open(load(path), cfg)
    with pytest.raises(ConfigError, match="plain K/V cache: LlamaCppStore"):
        LlamaCheckpointStore.open(load(tiny), cfg)


def test_checkpoints_fall_after_each_end_of_message_token_and_every_n_tokens() -> None:
    from stratastore.adapters.llamacpp.checkpoints import checkpoint_lengths

    ids = np.array([1, 5, 2, 7, 7, 2, 9, 9, 9, 9], np.uint32)
    assert checkpoint_lengths(ids, [2], 0) == [3, 6]
    assert checkpoint_lengths(ids, [2], 4) == [3, 4, 6, 8]
    assert checkpoint_lengths(ids, [], 5) == [5, 10]
    with pytest.raises(ConfigError, match="token count"):
        checkpoint_lengths(ids, [2], -1)


def _template_tokens(model: Path, messages: list[dict[str, str]]) -> int:
    """How many tokens the chat template renders ``messages`` into (no generation prompt)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = load(model)
    fmt = Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"],
        eos_token="</s>",
        bos_token="<s>",
        add_generation_prompt=False,
    )
    text = fmt(messages=messages).prompt  # the template writes no BOS; the chat handler adds none
    return len(llm.tokenize(text.encode(), add_bos=False, special=True))


def _data_files(store: Path) -> set[Path]:
    return {p for p in store.rglob("strata-conv-*") if p.suffix != ".sidecar"}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64"])
def test_a_checkpoint_interval_that_is_not_a_token_count_is_refused(
    mamba: Path, tmp_path: Path, bad: Any
) -> None:
    from stratastore.adapters.llamacpp import StrataLlamaCache

    with pytest.raises(ConfigError, match="checkpoint_tokens"):
        StrataLlamaCache(load(mamba), store_config(str(tmp_path / "store")), checkpoint_tokens=bad)
    assert not (tmp_path / "store").exists()  # refused before the store was opened
