"""The HiCache backend's tests against SGLang's own storage modules (``sglang``, installed
without its dependencies beside torch's CPU wheel), run by ``make test-sglang`` in its own
environment (``.venv-sglang``). Where SGLang or torch is not installed (``make test``'s
``.venv``) they skip, naming ``make test-sglang``; with ``STRATA_REQUIRE_SGLANG=1`` they fail
instead, so CI cannot pass by skipping."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "STRATA_REQUIRE_SGLANG"


@pytest.fixture(autouse=True, scope="session")
def _sglang_installed() -> None:
    missing = [m for m in ("sglang", "torch") if importlib.util.find_spec(m) is None]
    if not missing:
        return
    msg = f"{', '.join(missing)} not installed here: `make test-sglang` builds .venv-sglang"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires it)", pytrace=False)
    pytest.skip(msg)
