"""The transformers adapter as an engine uses it, with a randomly initialised tiny Llama and an
in-memory word-level tokenizer (no download): the Store's counters, a batched restore, named
sessions, pinning, a sliding-window config refused at open, the documented examples run as written
(one forward keyword: ``cache=``), nothing warned at open, no torch copy in a park or a restore (a
restore lands in the tensors the cache holds; measured), message openers from the chat template, an
IncompatibleFingerprint that tells the two models apart, a prompt parked whole that restores all but
its last token, and a conversation parked turn after turn that continues exactly. Needs the
``transformers`` extra (``pip install -e '.[transformers]'``); skipped with that reason without
it."""

from __future__ import annotations

import copy
import logging
import re
import tempfile
import textwrap
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

EXTRA = "needs the transformers extra: pip install -e '.[transformers]'"
torch = pytest.importorskip("torch", reason=EXTRA)
transformers = pytest.importorskip("transformers", reason=EXTRA)

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import stratastore.adapters.hf  # noqa: E402
from stratastore import ConfigError, IncompatibleFingerprint, StrataError  # noqa: E402
from stratastore.adapters.hf import TransformersCache  # noqa: E402
from stratastore.adapters.hf import cache as hf  # noqa: E402
from stratastore.adapters.hf import tensors as hf_tensors  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODEL = "test/tiny-llama@seed0"
SMALL = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def tiny(seed: int = 0, **overrides: Any) -> Any:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, **overrides)).eval()


def forward(model: Any, ids: Any, cache: Any = None) -> tuple[Any, Any]:
    """The documented call: ``model(input_ids=..., cache=cache, use_cache=True)``."""
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, use_cache=True)
    return out.logits, out.cache


def ids_of(n: int, seed: int) -> Any:
    return torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def config(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {
        "ram_mib": 64,
        "slots": 4,
        "min_free_mib": 1,
        "park_min_free_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 256,
        **kw,
    }


def open_kv(model: Any, tmp_path: Path, **kw: Any) -> TransformersCache:
    return TransformersCache.open(
        model.config, MODEL, config(tmp_path, **kw), probe=lambda: 1 << 40
    )


def assert_continues_exactly(model: Any, prompt: Any, n: int, restored: Any, kept: Any) -> None:
    """The logits of ``prompt[n:]`` on the restored cache are bit-identical to those on the
    model's own cache of the first ``n`` tokens (a recompute: the store adds nothing); against
    one prefill of the whole prompt both differ by the same <1e-6 (torch sums a chunked
    prefill in another order on the CPU, store or not)."""
    got, _ = forward(model, prompt[:, n:], restored)
    base = copy.deepcopy(kept)
    if base.get_seq_length() > n:
        base.crop(n - base.get_seq_length())
    want, _ = forward(model, prompt[:, n:], base)
    assert (got - want).abs().max().item() == 0.0
    full, _ = forward(model, prompt)
    assert (got - full[:, n:]).abs().max().item() < 1e-5


def same_bytes(a: Any, b: Any) -> bool:
    return all(
        x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for la, lb in zip(a.layers, b.layers, strict=True)
        for x, y in ((la.keys, lb.keys), (la.values, lb.values))
    )


# -- item 5: the engine always has a token to compute ------------------------------------------
def test_a_prompt_parked_whole_restores_all_but_its_last_token(tmp_path: Path) -> None:
    model = tiny()
    prompt = ids_of(50, 1)
    _, cache = forward(model, prompt)
    kept = copy.deepcopy(cache)
    with open_kv(model, tmp_path) as kv:
        kv.park("chat", prompt, cache, checkpoints=[20])
        assert kv.lookup(prompt) == 49
        restored, n = kv.restore(prompt)  # default max_tokens: len(prompt) - 1
        assert n == 49, "the model needs the last token's logits"
        assert_continues_exactly(model, prompt, n, restored, kept)
        assert kv.restore(prompt, max_tokens=50)[1] == 50  # the whole prompt, when asked


@pytest.mark.parametrize("where", ["ram", "disk"])
def test_a_conversation_parked_turn_after_turn_continues_exactly(
    tmp_path: Path, where: str
) -> None:
    """The engine's main flow: one conversation id parked at every turn's end (the store keeps the
    earlier turns' checkpoints across parks, the 200-turn edit table), each next prompt restored and
    continued bit-identically."""
    model = tiny()
    ids = ids_of(200, 1)
    _, cache = forward(model, ids)
    with open_kv(model, tmp_path, park=where) as kv:
        for turn in range(3):
            kept = copy.deepcopy(cache)
            kv.park("chat", ids, cache, checkpoints=[ids.shape[1]])
            kv.store.flush()
            prompt = torch.cat([ids, ids_of(60, 10 + turn)], dim=1)
            restored, n = kv.restore(prompt)
            assert n == ids.shape[1]
            assert same_bytes(restored, kept), f"turn {turn}: restored K/V differ"
            assert_continues_exactly(model, prompt, n, copy.deepcopy(restored), kept)
            _, cache = forward(model, prompt[:, n:], restored)  # the next park: this cache
            ids = prompt


# -- item 6: the adapter an engine wants ---------------------------------------------------------
def test_stats_are_the_stores(tmp_path: Path) -> None:
    model = tiny()
    history = ids_of(40, 1)
    with open_kv(model, tmp_path) as kv:
        kv.park("chat", history, forward(model, history)[1])
        kv.restore(torch.cat([history, ids_of(5, 2)], dim=1))
        kv.restore(ids_of(30, 3))  # a miss
        s = kv.stats()
        assert s["parks_ram"] == 1 and s["hits_ram"] == 1 and s["restore_misses"] == 1
        assert s.keys() == kv.store.stats().keys()


def test_restore_many_restores_each_prompt_through_one_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny()
    histories = [ids_of(40 + 7 * i, 10 + i) for i in range(3)]
    with open_kv(model, tmp_path, park="disk") as kv:
        kept = []
        for i, h in enumerate(histories):
            _, cache = forward(model, h)
            kept.append(copy.deepcopy(cache))
            kv.park(f"chat-{i}", h, cache, checkpoints=[16])
        kv.store.flush()
        prompts = [torch.cat([h, ids_of(6, 20 + i)], dim=1) for i, h in enumerate(histories)]
        calls: list[int] = []
        batch = kv.store.restore_many

        def counted(reqs: Any, **kw: Any) -> Any:
            calls.append(len(reqs))
            return batch(reqs, **kw)

        monkeypatch.setattr(kv.store, "restore_many", counted)
        got = kv.restore_many([*prompts, ids_of(30, 99)], max_tokens=[None, 20, None, None])
        assert calls == [4], "one batched call to the Store"
        assert [n for _, n in got] == [40, 16, 54, 0]
        assert got[3] == (None, 0)
        for (restored, n), p, k in zip(got[:3], prompts, kept, strict=True):
            assert_continues_exactly(model, p, n, restored, k)
        assert kv.stats()["hits_disk"] == 3


def test_a_session_is_saved_loaded_in_a_new_process_and_deleted(tmp_path: Path) -> None:
    model = tiny()
    history = ids_of(50, 1)
    _, cache = forward(model, history)
    kept = copy.deepcopy(cache)
    with open_kv(model, tmp_path) as kv:
        kv.save_session("user-7/draft", history, cache, checkpoints=[20])
    with open_kv(model, tmp_path) as kv:  # a restart: the session is on disk
        loaded, n = kv.load_session("user-7/draft")
        assert n == 50 and same_bytes(loaded, kept)
        prompt = torch.cat([history, ids_of(7, 2)], dim=1)
        assert_continues_exactly(model, prompt, n, loaded, kept)
        assert kv.delete_session("user-7/draft") is True
        with pytest.raises(StrataError, match="no saved session"):
            kv.load_session("user-7/draft")
        assert kv.delete_session("user-7/draft") is False


def test_a_pinned_system_prompt_survives_the_disk_filling_up(tmp_path: Path) -> None:
    """``pinned=[len_system]``: when the last level fills, the oldest conversation is cut to its
    pinned prefix (the system prompt keeps serving); an unpinned one goes whole."""
    model = tiny()
    pinned, loose = ids_of(128, 1), ids_of(128, 2)
    with open_kv(model, tmp_path, park="disk", cold_mib=1) as kv:
        kv.park("pinned", pinned, forward(model, pinned)[1], checkpoints=[40, 90], pinned=[40])
        kv.park("loose", loose, forward(model, loose)[1], checkpoints=[40, 90])
        kv.store.flush()
        for i in range(40):  # 64 KiB each: the 1 MiB level evicts the oldest
            o = ids_of(128, 100 + i)
            kv.park(f"other-{i}", o, forward(model, o)[1])
            kv.store.flush()
        assert kv.lookup(torch.cat([pinned, ids_of(5, 3)], dim=1)) == 40
        assert kv.lookup(torch.cat([loose, ids_of(5, 3)], dim=1)) == 0


def test_pin_keeps_the_ram_entry_while_others_are_evicted(tmp_path: Path) -> None:
    model = tiny()
    convs = {c: ids_of(64, i) for i, c in enumerate("abcd")}
    ram_only = {"ram_mib": 64, "slots": 2, "min_free_mib": 1, "park_min_free_mib": 1}
    with TransformersCache.open(model.config, MODEL, ram_only, probe=lambda: 1 << 40) as kv:
        for c, ids in convs.items():
            kv.park(c, ids, forward(model, ids)[1], pin=c == "a")
        assert kv.store.lookup(convs["a"].numpy()[0]) == ("ram", 64)
        assert kv.store.lookup(convs["b"].numpy()[0]) is None  # evicted instead of "a"


@pytest.mark.parametrize(
    ("cls", "kw", "window"),
    [
        ("MistralConfig", {"sliding_window": 64}, 64),
        (
            "Qwen2Config",
            {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1},
            32,
        ),
    ],
)
def test_a_sliding_window_config_is_refused_at_open_naming_the_window(
    tmp_path: Path, cls: str, kw: dict[str, Any], window: int
) -> None:
    cfg = getattr(transformers, cls)(**SMALL, **kw)
    with pytest.raises(ConfigError, match=rf"sliding window of {window} tokens.*whole prefix"):
        TransformersCache.open(cfg, MODEL, config(tmp_path), probe=lambda: 1 << 40)
    assert not (tmp_path / "cold").exists() or not any((tmp_path / "cold").iterdir())
    full = transformers.MistralConfig(**SMALL, sliding_window=None)  # no window: accepted
    TransformersCache.open(full, MODEL, config(tmp_path), probe=lambda: 1 << 40).close()


def _example(text: str) -> str:
    """The first Python block of ``text`` (a ```python fence, or a ``::`` indented block)."""
    fenced = re.search(r"```python\n(.*?)```", text, re.S)
    if fenced:
        return fenced.group(1)
    block = re.search(r"::\n\n((?:    .*\n|\n)+)", text)
    assert block, "no example"
    return textwrap.dedent(block.group(1))


def _engine_md_example() -> str:
    section = (ROOT / "docs" / "engine.md").read_text().split("## The worked example: transformers")
    return _example(section[1])


@pytest.mark.parametrize("where", ["the adapter's docstring", "engine.md"])
def test_the_documented_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """One forward keyword everywhere: the examples pass ``cache=`` and read ``out.cache``,
    and run as written, without a warning, on this transformers."""
    code = (
        _example(stratastore.adapters.hf.__doc__ or "")
        if where == "the adapter's docstring"
        else _engine_md_example()
    )
    assert "past_key_values" not in code
    model, tokenizer = tiny(), chat_tokenizer()
    messages = chat(3)
    ids = torch.tensor([tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "strata.toml").write_text("ram_mib = 64\nslots = 2\nmin_free_mib = 1\n")
    scope = {
        "model": model,
        "tokenizer": tokenizer,
        "messages": messages,
        "ids": ids,
        "prompt_ids": torch.cat([ids, ids_of(5, 9)], dim=1),
        "store_config": {"ram_mib": 64, "slots": 2, "min_free_mib": 1},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            exec(compile(code, where, "exec"), scope)
    assert scope["n"] == ids.shape[1] and scope["out"].logits.shape[1] == 5


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_opening_parking_and_restoring_warn_nothing(tmp_path: Path) -> None:
    """Nothing from the adapter warns or logs a deprecation: the config's dtype is read without
    the deprecated ``torch_dtype`` (transformers logs that once per process, so the once-only
    cache is cleared first)."""
    model = tiny()
    history = ids_of(40, 1)
    _, cache = forward(model, history)
    logging.Logger.warning_once.cache_clear()
    handler = _Records()
    logging.getLogger("transformers").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with open_kv(model, tmp_path) as kv:
                kv.park("chat", history, cache)
                kv.restore(torch.cat([history, ids_of(3, 2)], dim=1))
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in handler.records] == []


# -- copies --------------------------------------------------------------------------------------
_WRITES = {
    "clone",
    "cat",
    "copy_",
    "_to_copy",
    "zero_",
    "fill_",
    "zeros",
    "zeros_like",
    "new_zeros",
    "stack",
    "index_select",
    "contiguous",
}


class TorchCopies(TorchDispatchMode):
    """Bytes torch writes by copying ops (copies, concatenations, fills) while active; views
    and ``empty`` allocations count nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in _WRITES:
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.bytes += t.numel() * t.element_size()
        return out


def measure(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """``(result, torch bytes copied, numpy bytes allocated at peak)`` of ``fn``: the copies
    torch makes (a dispatch mode) and the numpy buffers made (tracemalloc traces numpy's
    data, not torch's)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with TorchCopies() as copies:
            out = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return out, copies.bytes, peak


def synthetic_cache(layers: int, heads: int, n: int, dim: int, dtype: Any) -> Any:
    cache = transformers.DynamicCache()
    g = torch.Generator().manual_seed(0)
    for i in range(layers):
        k, v = (torch.randn((1, heads, n, dim), generator=g).to(dtype) for _ in range(2))
        cache.update(k, v, i)
    return cache


def copy_figures(
    where: str,
    *,
    layers: int = 4,
    heads: int = 8,
    dim: int = 64,
    n: int = 1024,
    reps: int = 3,
    cold_dir: str = "",
) -> dict[str, float]:
    """Per park and per restore of ``n`` fp32 tokens (``where``: a RAM or a disk hit): torch
    bytes copied and numpy bytes allocated at peak (the Store's own buffers included: its
    staging of a RAM hit for a per-layer destination, its read chunks, a re-park's capture), as
    multiples of the payload (the K/V bytes of ``n`` tokens), and the best time of ``reps``
    (a park without its disk write). Runs on the earlier adapter too (to compare)."""
    cfg = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=heads * dim,
        head_dim=dim,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4 * n,
    )
    payload = 2 * layers * heads * dim * 4 * n
    ids = ids_of(n, 1)
    prompt = torch.cat([ids, ids_of(1, 2)], dim=1)  # restores n: leaves one token
    cache = synthetic_cache(layers, heads, n, dim, torch.float32)
    figures: dict[str, float] = {"payload_mib": payload / 2**20}
    store = {
        "ram_mib": 4 * payload >> 20,
        "slots": 2,
        "min_free_mib": 1,
        "park_min_free_mib": 1,
        "park": where,
    } | ({"cold_dir": cold_dir, "cold_mib": 4 * payload >> 20} if where == "disk" else {})
    with TransformersCache.open(
        cfg, MODEL, store, dtype=torch.float32, probe=lambda: 1 << 40
    ) as kv:

        def park() -> None:
            kv.park("c", ids, cache)

        def restore() -> None:
            assert kv.restore(prompt)[1] == n

        for what, call in (("park", park), ("restore", restore)):
            best = float("inf")
            for rep in range(reps + 1):
                park()  # a RAM hit takes the entry out of RAM: park it again before a restore
                kv.store.flush()
                t0 = time.perf_counter()
                if rep:
                    call()
                    best = min(best, time.perf_counter() - t0)
                else:  # the first run is measured, not timed
                    _, figures[f"{what}_torch_x"], figures[f"{what}_numpy_x"] = measure(call)
                kv.store.flush()
            figures[f"{what}_ms"] = best * 1e3
        for k in ("park_torch_x", "park_numpy_x", "restore_torch_x", "restore_numpy_x"):
            figures[k] /= payload
    return figures


class _Recorded(hf_tensors.LayerKV):
    """A ``LayerKV`` that remembers where its K arrays live."""

    made: ClassVar[list[list[int]]] = []

    def __init__(self, fp: Any, k: Any, v: Any, **kw: Any) -> None:
        super().__init__(fp, k, v, **kw)
        _Recorded.made.append([a.ctypes.data for a in k])


@pytest.mark.parametrize("where", ["ram", "disk"])
def test_a_restore_lands_in_the_tensors_the_cache_holds(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore writes the K/V once, into the memory of the tensors the returned cache holds:
    no zero-fill, no copy, no concatenation after it (torch copies nothing); a park copies from
    the cache's tensors straight into the stored layout (no ``.contiguous()`` per layer)."""
    model = tiny()
    history = ids_of(70, 1)
    _, cache = forward(model, history)
    kept = copy.deepcopy(cache)
    monkeypatch.setattr(hf_tensors, "LayerKV", _Recorded)
    _Recorded.made.clear()
    prompt = torch.cat([history, ids_of(1, 2)], dim=1)  # the next token: restores all 70
    with open_kv(model, tmp_path, park=where) as kv:
        _, park_copies, _ = measure(lambda: kv.park("chat", history, cache, checkpoints=[32]))
        kv.store.flush()
        (restored, n), restore_copies, _ = measure(lambda: kv.restore(prompt))
    assert n == 70 and same_bytes(restored, kept)
    assert park_copies == 0 and restore_copies == 0
    assert [layer.keys.data_ptr() for layer in restored.layers] == _Recorded.made[-1]


def test_copy_figures() -> None:
    """The figures of the report (printed with ``-s``): torch copies nothing per park or
    restore; the numpy peak of a RAM-hit restore is the Store's own staging of the capture."""
    for where in ("ram", "disk"):
        with tempfile.TemporaryDirectory() as d:
            f = copy_figures(where, n=512, reps=1, cold_dir=d)
        print(f"\n{where}: copies per call, x the {f['payload_mib']:.0f} MiB payload: {f}")
        assert f["park_torch_x"] == 0 and f["restore_torch_x"] == 0


# -- message openers from the chat template --------------------------------------------------
WORDS = ["<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "thought"] + [
    f"w{i}" for i in range(300)
]
CHATML = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def chat_tokenizer(template: str = CHATML) -> Any:
    """A word-level tokenizer built in memory (ids below the tiny model's 1000) with a chat
    template: no download."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    out.chat_template = template
    return out


def chat(n: int, seed: int = 0, sizes: tuple[int, ...] = (30, 12, 20)) -> list[dict[str, str]]:
    """``n`` messages: a system prompt, then user and assistant turns (``sizes`` words each)."""
    rng = np.random.default_rng(seed)
    roles = ["system", *(["user", "assistant"] * n)][:n]
    words = [sizes[min(i, len(sizes) - 1)] for i in range(n)]
    return [
        {"role": r, "content": " ".join(f"w{w}" for w in rng.integers(0, 300, k))}
        for r, k in zip(roles, words, strict=True)
    ]


def test_message_openers_come_from_the_chat_template(tmp_path: Path) -> None:
    """``park(..., messages=)`` with the tokenizer given at open checkpoints (and cuts) each
    message end the template renders: an edited reply resumes at the end of the message before
    it, the system prompt pinned with the first cut."""
    model, tok = tiny(), chat_tokenizer()
    messages = chat(3)
    ids = torch.tensor([tok.apply_chat_template(messages, tokenize=True, return_dict=False)])
    cuts = hf.cuts_from_chat_template(tok, messages, ids)
    assert cuts == [33, 48, 71] == [*cuts[:2], ids.shape[1]]  # each message: 3 + its words
    _, cache = forward(model, ids)
    kept = copy.deepcopy(cache)
    with TransformersCache.open(
        model.config, MODEL, config(tmp_path), tokenizer=tok, probe=lambda: 1 << 40
    ) as kv:
        kv.park("chat", ids, cache, messages=messages, pinned=cuts[:1])
        edited = [*messages[:2], {"role": "assistant", "content": "w1 w2 w3"}]
        prompt = torch.tensor([tok.apply_chat_template(edited, tokenize=True, return_dict=False)])
        restored, n = kv.restore(prompt)
        assert n == cuts[1], "resumes at the end of the user's message"
        assert_continues_exactly(model, prompt, n, restored, kept)


def test_a_template_that_rewrites_history_gives_no_cut_there() -> None:
    """A template that renders a message differently once others follow (here the last one
    carries a marker, as templates that drop past reasoning do): only the renderings that are
    prefixes of the conversation count, so no cut is ever wrong."""
    marked = CHATML.replace(
        "{{ m['content'] }}", "{{ m['content'] }}{% if loop.last %} thought{% endif %}"
    )
    tok = chat_tokenizer(marked)
    messages = chat(3)
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert hf.cuts_from_chat_template(tok, messages, ids) == [len(ids)]
    assert len(hf.cuts_from_chat_template(tok, messages)) == 3  # without ids: every rendering
    with pytest.raises(ConfigError, match="chat_template"):
        hf.cuts_from_chat_template(chat_tokenizer(None), messages)


# -- the fingerprint error -----------------------------------------------------------------------
def test_incompatible_fingerprint_tells_the_two_models_apart(tmp_path: Path) -> None:
    model = tiny()
    history = ids_of(40, 1)
    with open_kv(model, tmp_path, park="disk") as kv:
        kv.park("chat", history, forward(model, history)[1])
        kv.store.flush()
        written = kv.fp
    other = transformers.LlamaConfig(**SMALL, rope_theta=500000.0)  # one model id, another K/V
    with pytest.raises(IncompatibleFingerprint) as e:
        TransformersCache.open(other, MODEL, config(tmp_path))
    this = hf.fingerprint_for(other, MODEL, torch.float32)
    assert (
        f"architecture digest: {written.extra_digest.hex()[:12]} vs "
        f"{this.extra_digest.hex()[:12]}" in str(e.value)
    )
