"""The vLLM offload tier's settings (its ``secondary_tiers`` entry or a TOML file it names) and
the identity its chunks are keyed under, without vLLM: every mistake a ConfigError naming it;
the prefix-hash settings vLLM cannot keep stable across processes refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratastore.adapters.vllm.tier_identity import (
    TierModel,
    hash_problem,
    offload_chunk_key,
    unstable_seed_problem,
)
from stratastore.adapters.vllm.tier_settings import TierSettings
from stratastore.errors import ConfigError


def test_levels_inline() -> None:
    s = TierSettings.from_kwargs(
        {
            "levels": [
                {"spec": "/nvme/kv", "budget_gib": 2},
                {"spec": "redis://h:6379/0", "budget_bytes": 1000, "settings": {"name": "kv"}},
            ],
            "store_threads": 2,
        }
    )
    assert [lv.budget_bytes for lv in s.chunks.levels] == [2 << 30, 1000]
    assert s.chunks.levels[1].settings == {"name": "kv"}
    assert s.store_threads == 2 and s.load_threads == 16  # the documented default


def test_levels_from_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "tier.toml"
    path.write_text('load_threads = 8\n[[levels]]\nspec = "/nvme/kv"\nbudget_bytes = 4096\n')
    s = TierSettings.from_kwargs({"config": str(path)})
    assert s.load_threads == 8 and s.chunks.levels[0].spec == "/nvme/kv"
    with pytest.raises(ConfigError, match="both inline and in"):
        TierSettings.from_kwargs({"config": str(path), "load_threads": 2})


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({}, "levels"),
        ({"levels": [{"spec": "/d"}]}, "exactly one of budget_bytes and budget_gib"),
        ({"levels": [{"spec": "/d", "budget_gib": 1, "budget_bytes": 1}]}, "exactly one"),
        ({"levels": [{"spec": "/d", "budget_gib": -1}]}, "budget_gib"),
        ({"levels": [{"spec": "/d", "budget_bytes": 1, "size": 1}]}, "size"),
        ({"levels": [{"spec": "/d", "budget_bytes": 1}], "root_dir": "/x"}, "root_dir"),
        ({"levels": [{"spec": "/d", "budget_bytes": 1}], "store_threads": 0}, "store_threads"),
        ({"levels": [{"spec": "/d", "budget_bytes": 1}], "hash_algo": "md5"}, "hash_algo"),
        ({"levels": [{"spec": "/d", "budget_bytes": 1}], "when_full": "drop"}, "when_full"),
    ],
)
def test_a_mistake_is_named(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        TierSettings.from_kwargs(kwargs)


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        TierSettings.from_kwargs({"config": str(tmp_path / "none.toml")})


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_cryptographic_hashes_are_stable_without_a_seed(algo: str) -> None:
    assert hash_problem(algo, None) is None


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_xxhash_needs_pythonhashseed(algo: str) -> None:
    problem = hash_problem(algo, None)
    assert problem is not None and "sha256" in str(problem) and "PYTHONHASHSEED" in str(problem)
    assert hash_problem(algo, "0") is None


def test_a_random_seed_is_seen() -> None:
    assert unstable_seed_problem("vllm-none-hash", "vllm-none-hash", None) is None
    assert unstable_seed_problem("7", "vllm-none-hash", "7") is None
    assert unstable_seed_problem("ab12", "vllm-none-hash", None) is not None


def _model(**changes: object) -> TierModel:
    base: dict[str, object] = dict(
        model="org/model", revision=None, hf_config={"hidden_size": 8}, dtype="bfloat16",
        kv_cache_layout="NHD", groups=((16, 32),), tokens_per_hash=16, blocks_per_chunk=1,
        worker_kv_bytes_per_block=2 << 20, row_bytes=2 << 20, parallel="agnostic",
        canonical_layout=False, replicated_layout=False,
    )  # fmt: skip
    base.update(changes)
    return TierModel(**base)  # type: ignore[arg-type]


def test_the_fingerprint_covers_what_makes_the_bytes() -> None:
    fp = _model().fingerprint()
    assert _model().fingerprint() == fp
    for change in (
        {"hf_config": {"hidden_size": 9}},
        {"dtype": "float16"},
        {"kv_cache_layout": "HND"},
        {"groups": ((32, 32),)},
        {"blocks_per_chunk": 2},
        {"parallel": "world=2,tp=2,pp=1,pcp=1,dcp=1"},
        {"model": "org/other"},
    ):
        assert _model(**change).fingerprint() != fp, change


def test_keys_depend_on_the_hash_algorithm() -> None:
    key = b"\x01" * 32 + b"\x00\x00\x00\x00"
    assert offload_chunk_key(key, "sha256") == offload_chunk_key(key, "sha256")
    assert offload_chunk_key(key, "sha256") != offload_chunk_key(key, "sha256_cbor")
    assert len(offload_chunk_key(key, "sha256")) == 32
