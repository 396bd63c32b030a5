"""Compile every CUDA kernel to PTX for a given compute capability, without a GPU.

numba compiles a kernel's device functions for the *current* device's compute capability, so a
machine without a GPU needs a stand-in device (FACTS.md); NVVM comes from ``CUDA_HOME`` (the
``nvidia-cuda-nvcc-cu12`` wheel's ``nvidia/cuda_nvcc`` folder, see :func:`nvcc_wheel_home`) or
a system CUDA toolkit. Must run with the simulator off (``NUMBA_ENABLE_CUDASIM=0``):
``python -m numba_kernels.ptx`` prints one line per kernel, which is how the test drives it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from typing import Any

__all__ = ["KERNELS", "compile_all", "nvcc_wheel_home"]

#: every kernel (one module per concern), each with the argument types its launchers pass
KERNELS = (
    "page_hash",
    "first_bad",
    "first_bad_words",
    "ladder_copy",
    "scatter_rows",
    "gather_rows",
    "zero_rows",
)
#: the module and kernel of each entry of :data:`KERNELS`
_WHERE = {
    "page_hash": ("_hash_kernel", "page_hash"),
    "first_bad": ("_validate_kernel", "first_bad"),
    "first_bad_words": ("_validate_kernel", "first_bad"),
    "ladder_copy": ("_copy_kernels", "ladder_copy"),
    "scatter_rows": ("_copy_kernels", "scatter_rows"),
    "gather_rows": ("_copy_kernels", "gather_rows"),
    "zero_rows": ("_copy_kernels", "zero_rows"),
}


def nvcc_wheel_home() -> str | None:
    """The ``CUDA_HOME`` of the installed nvcc wheel (``nvidia/cuda_nvcc``), or None."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(next(iter(spec.submodule_search_locations)))


def _signatures() -> dict[str, tuple[Any, ...]]:
    from numba import types

    u8 = types.Array(types.uint8, 1, "C")
    i64 = types.int64
    return {
        "page_hash": (
            u8,
            i64,
            i64,
            types.Array(types.uint32, 1, "C"),
            types.Array(types.int64, 2, "C"),
            types.Array(types.int64, 2, "C"),
            types.Array(types.uint32, 2, "C"),
        ),
        "first_bad": (
            types.Array(types.uint8, 2, "C"),
            types.Array(types.uint8, 2, "C"),
            types.Array(types.int64, 1, "C"),
        ),
        "first_bad_words": (
            types.Array(types.uint32, 2, "C"),
            types.Array(types.uint32, 2, "C"),
            types.Array(types.int64, 1, "C"),
        ),
        "ladder_copy": (u8, i64, i64, u8, types.Array(types.int64, 1, "C")),
        "scatter_rows": (u8, i64, i64, i64, i64, i64, u8, u8, types.Array(types.int64, 1, "C")),
        "gather_rows": (u8, i64, i64, i64, i64, i64, u8, u8, types.Array(types.int64, 1, "C")),
        "zero_rows": (u8, i64, types.Array(types.int64, 1, "C"), i64),
    }


def compile_all(cc: tuple[int, int] = (9, 0)) -> dict[str, str]:
    """PTX text of every kernel for compute capability ``cc``. Raises whatever numba raises
    (``NvvmSupportError`` when no NVVM is found)."""
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda import compile_ptx  # type: ignore[attr-defined]

    class _StandIn:
        compute_capability = cc

    # device functions compile for the current device's capability: make it `cc`
    dispatcher.get_current_device = lambda: _StandIn()  # type: ignore[attr-defined]
    out = {}
    for name, sig in _signatures().items():
        module, kernel = _WHERE[name]
        fn = getattr(importlib.import_module(f"{__package__}.{module}"), kernel).py_func
        out[name] = compile_ptx(fn, sig, cc=cc)[0]  # type: ignore[no-untyped-call]
    return out


def _main() -> int:
    cc = tuple(int(p) for p in (sys.argv[1] if len(sys.argv) > 1 else "9.0").split("."))
    try:
        out = compile_all((cc[0], cc[1]))
    except Exception as exc:  # reported to the caller, which decides whether it is a skip
        print(f"ERROR {type(exc).__name__}: {exc}")
        return 1
    for name, ptx in out.items():
        target = re.search(r"^\.target (\S+)", ptx, re.M)
        print(
            f"{name} target={target.group(1) if target else '?'} bytes={len(ptx)} "
            f"funnel_shifts={ptx.count('shf.l.wrap.b32')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(_main())
