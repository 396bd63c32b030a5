"""Tests against the real llama.cpp (llama-cpp-python, compiled from its sdist), run by
``make test-llamacpp`` in its own environment (``.venv-llama``). Where llama_cpp or gguf is
not installed (``make test``'s ``.venv``) they skip, naming ``make test-llamacpp``; with
``STRATA_REQUIRE_LLAMACPP=1`` they fail instead, so CI cannot pass by skipping."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from .models import make_gguf

REQUIRE_ENV = "STRATA_REQUIRE_LLAMACPP"


@pytest.fixture(autouse=True, scope="session")
def _llamacpp_installed() -> None:
    missing = [m for m in ("llama_cpp", "gguf") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    msg = f"{', '.join(missing)} not installed here: `make test-llamacpp` builds .venv-llama"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires it)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="session")
def tiny(models_dir: Path, _llamacpp_installed: None) -> Path:
    """2 layers x 2 kv heads x 16 dims: 256 bytes of f16 K/V a token."""
    return make_gguf(models_dir / "tiny-s0.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_other(models_dir: Path, _llamacpp_installed: None) -> Path:
    """The same geometry as ``tiny``, other weights: another model for fingerprint tests."""
    return make_gguf(models_dir / "tiny-s1.gguf", seed=1)


@pytest.fixture(scope="session")
def wide(models_dir: Path, _llamacpp_installed: None) -> Path:
    """Head dim 32, so q8_0 (blocks of 32) fits a head: the quantized K/V cache types."""
    return make_gguf(models_dir / "wide-s0.gguf", seed=0, n_embd=128, n_head=4, n_head_kv=2)


@pytest.fixture(scope="session")
def mamba(models_dir: Path, _llamacpp_installed: None) -> Path:
    """A recurrent model: one state a sequence, no K/V."""
    from .models import make_mamba_gguf

    return make_mamba_gguf(models_dir / "mamba-s0.gguf", seed=0)


@pytest.fixture(scope="session")
def gemma2(models_dir: Path, _llamacpp_installed: None) -> Path:
    """A sliding-window model: a window of 32 tokens on every other layer."""
    from .models import make_gemma2_gguf

    return make_gemma2_gguf(models_dir / "gemma2-s0.gguf", seed=0)
