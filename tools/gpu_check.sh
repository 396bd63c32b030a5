#!/usr/bin/env bash
# One shot on a machine with an NVIDIA GPU (the device tool's machine): install what the kernels
# need, run the kernel and device-path tests on the real device (simulator off), then
# tools/gpu_connector_check.py (the vLLM connector's pool, saver and loader on torch CUDA
# tensors in FlashAttention's and FlashInfer's layouts, against the host path) and
# tools/gpu_bench.py: page hashing against the host-to-device and device-to-device copy rates,
# and a validated 1 GiB restore into a device paged pool against a raw read plus an unvalidated
# host-to-device copy of the same bytes. Meant to finish in well under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
VENV=.venv-gpu
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
# numba's CUDA target needs NVVM and the runtime headers: the NVIDIA wheels carry them
"$VENV/bin/python" -m pip install -q -e '.[dev]' nvidia-cuda-nvcc-cu12 nvidia-cuda-runtime-cu12
SITE=$("$VENV/bin/python" -c 'import nvidia.cuda_nvcc, os; print(os.path.dirname(nvidia.cuda_nvcc.__file__))')
export CUDA_HOME="$SITE" NUMBA_ENABLE_CUDASIM=0
export LD_LIBRARY_PATH="$SITE/nvvm/lib64:${LD_LIBRARY_PATH:-}"
"$VENV/bin/python" - <<'PY'
from numba import cuda
assert cuda.is_available(), "numba sees no CUDA device"
print("numba device:", cuda.get_current_device().name.decode(), cuda.get_current_device().compute_capability)
PY
timeout 180 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit/kernels/test_kernels_cuda.py tests/unit/kernels/test_kernels_cpu.py \
  tests/unit/kernels/test_kernels_boundary.py tests/unit/restore/test_device_restore.py tests/unit/restore/test_device_park.py \
  tests/unit/test_gpu_bench.py tests/unit/restore/test_device_paged_layouts.py \
  tests/unit/adapters/test_vllm_device_pool.py tests/unit/test_gpu_connector_check.py
# the connector's worker side on torch CUDA tensors (the image's torch), both vLLM GPU layouts
timeout 120 "$VENV/bin/python" tools/gpu_connector_check.py
timeout 120 "$VENV/bin/python" tools/gpu_bench.py 1024
