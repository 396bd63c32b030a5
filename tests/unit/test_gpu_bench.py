"""tools/gpu_bench.py, the end-to-end benchmark of tools/gpu_check.sh, run in the CUDA simulator at
a tiny size: the script works, and checks what it restored, before a device is lent (its figures
here mean nothing and are not looked at)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.conftest import tiny_fp

ROOT = Path(__file__).resolve().parents[2]


def test_the_end_to_end_benchmark_restores_into_a_device_pool_and_checks_it() -> None:
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "tools" / "gpu_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["gpu_bench"] = bench
    spec.loader.exec_module(bench)
    out = bench.end_to_end(fp=tiny_fp(), runs=1, block_size=3, tokens=22)
    assert out["bytes"] == 22 * tiny_fp().token_bytes
    assert out["restore_s"] > 0 and out["raw_s"] > 0
