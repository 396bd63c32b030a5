"""The transformers adapter with a randomly initialised tiny Llama (no download): a multi-turn
conversation parked, evicted to the cold level, restored and continued gives logits identical to
those on the cache the model computed (see assert_continues_exactly); an edited history resumes at
the right checkpoint; another model config never matches; fp16 and bfloat16 K/V round-trip
bit-exactly. Needs the ``transformers`` extra (``pip install -e '.[transformers]'``); skipped with
that reason without it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

EXTRA = "needs the transformers extra: pip install -e '.[transformers]'"
torch = pytest.importorskip("torch", reason=EXTRA)
transformers = pytest.importorskip("transformers", reason=EXTRA)

from stratastore import IncompatibleFingerprint, StrataError  # noqa: E402
from stratastore.adapters.hf import TransformersCache  # noqa: E402


def tiny(seed: int = 0, **overrides: Any) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        **overrides,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def prefill(model: Any, ids: Any, cache: Any = None) -> tuple[Any, Any]:
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, use_cache=True)
    return out.logits, out.cache  # transformers 5.24's name (past_key_values: deprecated)


def assert_continues_exactly(model: Any, prompt: Any, n: int, restored: Any, kept: Any) -> None:
    """The logits of ``prompt[n:]`` on the restored cache are bit-identical (max abs diff 0) to
    those on the cache the model computed in the first place (``kept``, cut to ``n`` tokens):
    the store adds nothing. Against one full prefill of the whole prompt both differ by the
    same <1e-6 in fp32 (torch 2.13 on the CPU sums a chunked prefill in another order; no store
    is involved in that)."""
    got, _ = prefill(model, prompt[:, n:], restored)
    base = copy.deepcopy(kept)
    if base.get_seq_length() > n:
        base.crop(n - base.get_seq_length())  # transformers 5 crops by a negative count
    want, _ = prefill(model, prompt[:, n:], base)
    assert (got - want).abs().max().item() == 0.0
    full, _ = prefill(model, prompt)
    assert (got - full[:, n:]).abs().max().item() < 1e-5


def config(tmp_path: Path, ram_mib: int = 1) -> dict[str, Any]:
    return {
        "ram_mib": ram_mib,
        "slots": 1,
        "min_free_mib": 1,
        "park_min_free_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 256,
        "spill_on": "evict",
    }


def ids_of(n: int, seed: int) -> Any:
    return torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(seed))


def test_parked_evicted_restored_then_continued_equals_a_full_prefill(tmp_path: Path) -> None:
    model = tiny()
    turns = [ids_of(n, s) for n, s in [(40, 1), (37, 2), (51, 3)]]  # system, user, assistant
    history = torch.cat(turns, dim=1)
    checkpoints = [40, 77, 128]
    _, cache = prefill(model, history)
    kept = copy.deepcopy(cache)
    with TransformersCache.open(
        model.config, "test/tiny-llama@seed0", config(tmp_path), probe=lambda: 1 << 40
    ) as kv:
        assert kv.park("chat", history, cache, checkpoints=checkpoints).where == "ram"
        for other in range(12):  # other conversations fill the 1 MiB of RAM: chat is evicted
            o = ids_of(128, 100 + other)
            kv.park(f"other{other}", o, prefill(model, o)[1])
        kv.store.flush()
        assert kv.store.lookup(history[0].numpy()) == ("disk", 128), "chat was not evicted"
        prompt = torch.cat([history, ids_of(9, 4)], dim=1)  # the next user turn
        restored, n = kv.restore(prompt)
        assert n == 128
        assert_continues_exactly(model, prompt, n, restored, kept)
        assert kv.store.stats()["hits_disk"] == 1


def test_an_edited_history_resumes_at_the_last_checkpoint_before_the_edit(tmp_path: Path) -> None:
    model = tiny()
    history = torch.cat([ids_of(40, 1), ids_of(37, 2), ids_of(51, 3)], dim=1)
    with TransformersCache.open(
        model.config, "test/tiny-llama@seed0", config(tmp_path, 64), probe=lambda: 1 << 40
    ) as kv:
        _, cache = prefill(model, history)
        kept = copy.deepcopy(cache)
        kv.park("chat", history, cache, checkpoints=[40, 77])
        edited = torch.cat([history[:, :60], ids_of(30, 9)], dim=1)  # turn 2 rewritten at 60
        assert kv.lookup(edited) == 40
        restored, n = kv.restore(edited)
        assert n == 40
        assert_continues_exactly(model, edited, n, restored, kept)


def test_another_model_config_never_matches(tmp_path: Path) -> None:
    model = tiny()
    history = ids_of(64, 1)
    with TransformersCache.open(
        model.config, "test/tiny-llama@seed0", config(tmp_path) | {"park": "disk"}
    ) as kv:
        kv.park("chat", history, prefill(model, history)[1])
        kv.store.flush()
    other = tiny(rope_theta=500000.0)  # same geometry, other positions: other K/V
    with pytest.raises(IncompatibleFingerprint):  # its directory refuses another fingerprint
        TransformersCache.open(other.config, "test/tiny-llama@seed0", config(tmp_path))
    fresh = config(tmp_path)
    fresh["cold_dir"] = str(tmp_path / "other")
    with TransformersCache.open(other.config, "test/tiny-llama@seed0", fresh) as kv2:
        assert kv2.lookup(history) == 0
    with TransformersCache.open(
        model.config, "test/tiny-llama@seed1", fresh | {"cold_dir": str(tmp_path / "third")}
    ) as kv3:
        assert kv3.lookup(history) == 0  # other weights: another model id


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_half_precision_round_trips_bit_exactly(tmp_path: Path, dtype: str) -> None:
    model = tiny().to(getattr(torch, dtype))
    history = ids_of(70, 5)
    _, cache = prefill(model, history)
    with TransformersCache.open(
        model.config,
        "test/tiny-llama@seed0",
        config(tmp_path) | {"park": "disk"},
        dtype=getattr(torch, dtype),
    ) as kv:
        kv.park("chat", history, cache, checkpoints=[32])
        restored, n = kv.restore(history, max_tokens=70)  # all of it (the default leaves one)
        assert n == 70
        for a, b in zip(cache.layers, restored.layers, strict=True):
            for x, y in ((a.keys, b.keys), (a.values, b.values)):
                assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_bad_input_is_typed(tmp_path: Path) -> None:
    model = tiny()
    history = ids_of(20, 1)
    _, cache = prefill(model, history)
    with TransformersCache.open(
        model.config, "test/tiny-llama@seed0", config(tmp_path, 64), probe=lambda: 1 << 40
    ) as kv:
        with pytest.raises(StrataError, match="shape"):
            kv.park("chat", ids_of(21, 1), cache)  # ids and cache disagree
        with pytest.raises(StrataError, match="one sequence"):
            kv.lookup(np.zeros((2, 3), np.int64))


def test_unsupported_dtype_and_wrong_cache_dtype_are_typed(tmp_path: Path) -> None:
    from stratastore import ConfigError
    from stratastore.adapters.hf import fingerprint_for

    model = tiny()
    with pytest.raises(ConfigError, match="not supported; use float16, bfloat16 or float32"):
        fingerprint_for(model.config, "test/tiny", torch.int8)
    history = ids_of(20, 1)
    _, cache = prefill(model, history)  # float32 K/V
    with TransformersCache.open(
        model.config,
        "test/tiny-llama@seed0",
        config(tmp_path, 64),
        dtype=torch.float16,
        probe=lambda: 1 << 40,
    ) as kv:
        with pytest.raises(ConfigError, match=r"open it with dtype=torch\.float32"):
            kv.park("chat", history, cache)
        assert kv.lookup(history) == 0  # nothing was stored
