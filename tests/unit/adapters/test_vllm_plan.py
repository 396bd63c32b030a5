"""What the vLLM connector decides without vLLM (numpy only): the store's page apart from vLLM's
block, how much a request loads (whole pages, never the whole prompt), what a park holds and
where it is cut, the conversation a request parks under, the store's settings from vLLM's
config, and a fingerprint that names what determines the K/V and nothing else."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stratastore import ConfigError
from stratastore.adapters.vllm.plan import (
    conversation_id,
    default_store_dir,
    fingerprint,
    keyable,
    load_unit,
    loadable,
    page_tokens,
    save_cuts,
    saved_tokens,
    store_config,
)


def test_the_page_is_the_connectors_and_divides_vllms_block() -> None:
    assert page_tokens(None, 128) == 16 and page_tokens({}, 16) == 16
    assert page_tokens(None, 8) == 8 and page_tokens(None, 24) == 8  # a divisor of the block
    assert page_tokens({"page_tokens": 32}, 128) == 32
    assert page_tokens({"page_tokens": 128}, 128) == 128  # a page a block, as before
    for bad, match in (
        ({"page_tokens": 48}, "does not divide vLLM's block of 128"),
        ({"page_tokens": 0}, "positive integer"),
        ({"page_tokens": "16"}, "positive integer"),
        ({"page_tokens": True}, "positive integer"),
    ):
        with pytest.raises(ConfigError, match=match):
            page_tokens(bad, 128)


def test_the_default_page_is_the_gcd_of_16_and_the_block_as_its_docstring_says() -> None:
    """The default page is ``gcd(16, block)`` (8 for a block of 24, not 12): part of the
    model's fingerprint, so pinned for every block size, and its docstring says so (it said
    "the largest divisor of the block up to 16", which is 12 for 24)."""
    for block in range(1, 1025):
        page = page_tokens(None, block)
        assert page == math.gcd(16, block) and block % page == 0, block
    doc = " ".join((page_tokens.__doc__ or "").split())
    assert "greatest common divisor" in doc, doc
    assert "the largest divisor of vLLM's block up to it" not in doc, doc
    assert "8 for a block of 24" in doc, doc


def test_a_request_loads_whole_pages_and_leaves_a_token() -> None:
    assert loadable(1000, 361, 16) == 352  # part of a 128-token block
    assert loadable(1000, 361, 128) == 256
    assert loadable(256, 257, 16) == 256
    assert loadable(256, 256, 16) == 240  # never the whole prompt
    assert loadable(0, 500, 16) == 0 and loadable(15, 500, 16) == 0


def test_loads_end_on_a_page_unless_whole_blocks_are_asked_for() -> None:
    assert load_unit(None, 128, 16) == 16 and load_unit({}, 128, 16) == 16
    assert load_unit({"load_whole_blocks": False}, 128, 16) == 16
    unit = load_unit({"load_whole_blocks": True}, 128, 16)  # where vLLM's own cache would end
    assert unit == 128 and loadable(1983, 2112, unit) == 1920
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match='"load_whole_blocks" must be true or false'):
            load_unit({"load_whole_blocks": bad}, 128, 16)


def test_parks_are_whole_pages_cut_where_they_resumed() -> None:
    assert saved_tokens(320, 3 * 128, 16) == 320
    assert saved_tokens(330, 3 * 128, 16) == 320
    assert saved_tokens(1000, 2 * 128, 16) == 256  # no more than the blocks hold
    assert save_cuts(512, 16, 256) == (0, 256) and save_cuts(256, 16) == (0,)
    assert save_cuts(256, 16, 256) == (0,)
    assert save_cuts(1000, 128, 384) == (0, 256, 384, 512, 768)
    assert save_cuts(96, 16, 48) == (0, 48) and save_cuts(600, 16) == (0, 256, 512)
    assert save_cuts(616, 16, 0, 600) == (0, 256, 512, 600)  # where the prompt's park ended
    assert save_cuts(1024, 384) == (0, 384, 768)  # a chunk is whole pages


def test_a_requests_parks_share_one_conversation_of_its_own() -> None:
    a = np.arange(100, dtype=np.uint32)
    assert conversation_id(a, "r1") == conversation_id(a.copy(), "r1")
    assert conversation_id(a, "r1") != conversation_id(a[:99], "r1")
    assert conversation_id(a, "r1") != conversation_id(a, "r2")  # a retry parks its own
    assert conversation_id(a, "r1").startswith("vllm-")


def test_only_requests_keyed_by_their_token_ids_alone_are_stored() -> None:
    plain = SimpleNamespace(prompt_token_ids=[1, 2, 3], lora_request=None, mm_features=[])
    assert keyable(plain)
    for other in (
        {"prompt_token_ids": None},  # prompt embeddings
        {"lora_request": object()},
        {"mm_features": [object()]},
        {"prompt_embeds": object()},
        {"cache_salt": "tenant-a"},
    ):
        assert not keyable(SimpleNamespace(**{**vars(plain), **other})), other


def test_store_settings_from_vllms_extra_config(tmp_path: Path) -> None:
    cfg, said = store_config(None)
    assert cfg.cold_dir == default_store_dir() and cfg.page_resume and cfg.park == "disk"
    assert "default store" in said
    cfg, _ = store_config({"strata": {"cold_dir": str(tmp_path), "cold_mib": 8}})
    assert cfg.cold_dir == str(tmp_path) and cfg.cold_mib == 8 and cfg.page_resume
    toml = tmp_path / "strata.toml"
    toml.write_text(f'cold_dir = "{tmp_path}"\ncold_mib = 4\n')
    cfg, said = store_config({"strata_config": str(toml), "page_tokens": 16})
    assert cfg.cold_mib == 4 and str(toml) in said
    # the connector's defaults hold for a file as for inline settings, unless it says otherwise
    inline, _ = store_config({"strata": {"cold_dir": str(tmp_path), "cold_mib": 4}})
    assert (cfg.park, cfg.page_resume, cfg.ram_mib) == ("disk", True, 0)
    assert (cfg.park, cfg.page_resume, cfg.ram_mib) == (inline.park, inline.page_resume, 0)
    toml.write_text(f'cold_dir = "{tmp_path}"\ncold_mib = 4\npage_resume = false\n')
    assert not store_config({"strata_config": str(toml)})[0].page_resume
    assert default_store_dir({"XDG_CACHE_HOME": "/x"}) == "/x/stratastore/vllm"
    for bad, match in (
        ({"strata": {}, "strata_config": "f"}, "not both"),
        ({"strata": [1]}, "mapping"),
        ({"strata_config": 3}, "TOML"),
        ({"strata": {"cold_mib": "lots"}}, "cold_mib"),
    ):
        with pytest.raises(ConfigError, match=match):
            store_config(bad)


def _fp(**over: object) -> object:
    args: dict[str, object] = dict(
        weights="weights:abc",
        revision="r1",
        hf_config={"x": 1, "_name_or_path": "/models/a"},
        n_layers=2,
        n_kv_heads=2,
        head_dim=8,
        page_tokens=16,
        dtype="bfloat16",
        backend="cpu/vec",
    )
    args.update(over)
    w, r, c = args.pop("weights"), args.pop("revision"), args.pop("hf_config")
    return fingerprint(w, r, c, **args)  # type: ignore[arg-type]


def test_the_fingerprint_names_what_determines_the_kv() -> None:
    a = _fp()
    assert a == _fp(dtype="torch.bfloat16")
    # where the files lie is not the model: another path in the config is the same store
    assert a == _fp(hf_config={"x": 1, "_name_or_path": "/mnt/elsewhere/a"})
    for other in (
        {"backend": "cpu/amx"},
        {"hf_config": {"x": 2}},
        {"revision": "r2"},
        {"weights": "weights:abd"},
        {"page_tokens": 32},
        {"tp_size": 2},
    ):
        assert _fp(**other) != a, other
    with pytest.raises(ConfigError, match="dtype"):
        _fp(dtype="torch.complex64")
    with pytest.raises(ConfigError):  # a config no canonical form can digest: typed, named
        _fp(hf_config={"x": object()})
