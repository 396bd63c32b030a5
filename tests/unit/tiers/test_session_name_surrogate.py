"""A session name that is not valid for ``.encode()`` reaches the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratastore import Store, StrataError
from tests.conftest import tiny_fp

FP = tiny_fp()


def test_delete_session_of_unencodable_name_is_a_typed_answer(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 4}
    with Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda _m: None) as store:
        try:
            got = store.delete_session("bad\ud800name")  # a lone surrogate: no UTF-8 form
        except StrataError:
            return  # a typed refusal is fine
        except Exception as e:
            pytest.fail(f"delete_session raised {type(e).__name__}: {e}")
        assert got is False
