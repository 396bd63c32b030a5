"""tools/gpu_connector_check.py, the connector check of tools/gpu_check.sh, run in the CUDA
simulator at a tiny size with device memory seen only through ``__cuda_array_interface__``:
the script works, and finds both layouts equal to the host path, before a device is lent."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

from tests.conftest import CudaInterface

ROOT = Path(__file__).resolve().parents[2]


def test_the_connector_check_finds_both_layouts_equal_to_the_host_path(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gpu_connector_check", ROOT / "tools" / "gpu_connector_check.py"
    )
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    sys.modules["gpu_connector_check"] = tool
    spec.loader.exec_module(tool)

    def device(a: np.ndarray) -> Any:
        return CudaInterface(cuda.to_device(a))

    lines = tool.check(
        device, layers=2, heads=2, dim=8, page=16, block=16, blocks=12, work=tmp_path
    )
    assert [line.split(":")[0] for line in lines] == ["FlashAttention", "FlashInfer"]
    assert all("park equal" in line and "stopped alike" in line for line in lines)
