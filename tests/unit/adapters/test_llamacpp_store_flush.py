"""When a llama.cpp park is durable (stratastore.adapters.llamacpp.LlamaCppStore), no llama.cpp
needed (a stand-in ``Llama``, rows parked with ``park_rows``): under ``park = "ram"`` (the
default) the disk copy is written in the background, ``flush()`` waits for it and raises the
store's SpillError for a write that failed (once), and a process that opens the directory after
``flush()`` finds the park; under ``park = "disk"`` the park is written within its call (an I/O
error raises from it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import SpillError, StrataIOError
from stratastore.adapters.llamacpp import LlamaCppStore
from stratastore.adapters.llamacpp import store as store_module
from stratastore.io import faults
from stratastore.io.faults import Fault
from tests.llama_stand_in import LAYOUT, fake_llama, write_gguf

N = 40  #: tokens a park holds
TOKENS = list(range(1, N + 1))


@pytest.fixture
def llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(store_module, "context_layout", lambda llm: LAYOUT)
    return fake_llama(write_gguf(tmp_path / "model.gguf"))


def _cfg(tmp_path: Path, park: str) -> dict[str, Any]:
    ram = {"ram_mib": 16, "slots": 2} if park == "ram" else {"ram_mib": 0}
    return {**ram, "park": park, "cold_dir": str(tmp_path / "cold"), "cold_mib": 16}


def _rows() -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.random.default_rng(1).integers(0, 255, (LAYOUT.n_layer, N, 128), dtype=np.uint8)


def _open(llm: Any, tmp_path: Path, park: str) -> LlamaCppStore:
    return LlamaCppStore.open(llm, _cfg(tmp_path, park), probe=lambda: 1 << 40)


def test_flush_raises_the_failed_background_write_once(llm: Any, tmp_path: Path) -> None:
    with _open(llm, tmp_path, "ram") as store:
        failing = Fault(op="write", path_contains="strata-conv-", persistent=True)
        with faults.inject(failing):
            assert store.park_rows("conv-1", TOKENS, _rows()).where == "ram"
            with pytest.raises(SpillError, match="'conv-1'") as got:
                store.flush()
        assert [cid for cid, _ in got.value.failures] == ["conv-1"]
        assert failing.fired >= 1
        store.flush()  # reported once


def test_a_park_is_on_disk_for_another_process_once_flush_returns(llm: Any, tmp_path: Path) -> None:
    with _open(llm, tmp_path, "ram") as store:
        assert store.park_rows("conv-1", TOKENS, _rows()).where == "ram"
        store.flush()
        # another process, the same directory with no RAM level: what it finds is on disk
        code = textwrap.dedent(
            f"""
            import sys
            from stratastore.facade import Store
            from stratastore.format import ModelFingerprint
            fp = ModelFingerprint.unpack(bytes.fromhex({store.fp.pack().hex()!r}))
            cfg = {{"ram_mib": 0, "park": "disk", "cold_dir": {str(tmp_path / "cold")!r},
                   "cold_mib": 16}}
            with Store.open(fp, cfg) as other:
                hit = other.lookup({TOKENS!r})
                sys.stdout.write(str(hit[1] if hit else 0))
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout == str(N)  # the whole park: its last length is a checkpoint


def test_a_disk_park_is_written_within_its_call(llm: Any, tmp_path: Path) -> None:
    with _open(llm, tmp_path, "disk") as store:
        failing = Fault(op="write", path_contains="strata-conv-", persistent=True)
        with faults.inject(failing), pytest.raises(StrataIOError):
            store.park_rows("conv-1", TOKENS, _rows())  # raised here, not by a later flush
        store.flush()  # nothing was acknowledged: nothing to report
        assert store.park_rows("conv-2", TOKENS, _rows()).where == "disk"
        store.flush()
        assert store.lookup([*TOKENS, 0]) == N
