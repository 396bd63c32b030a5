"""The numba CUDA kernels, run in the CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set by conftest):
page hashes bit-exact against the blake3 package, the first-bad-page kernel and the ladder copy
on corrupted pages; and every kernel compiled to PTX for compute capability 9.0 (no GPU needed,
only NVVM: the nvcc wheel of the dev extra). tools/gpu_check.sh runs them on a real device."""

from __future__ import annotations

import os
import subprocess
import sys

import blake3
import numpy as np
import numpy.typing as npt
import pytest
from numba import cuda

from numba_kernels import first_bad_page, ladder_copy, page_hashes, scatter_rows
from numba_kernels.cuda import gather_rows_device, page_hashes_device

SIZES = [
    0,
    1,
    1023,
    1024,
    1025,
    2048,
    2049,
    3072,
    3073,
    4096,
    4097,
    5120,
    5121,
    6144,
    6145,
    7168,
    7169,
    8192,
    8193,
    16384,
    31744,
    102400,
]


def pattern(n: int) -> npt.NDArray[np.uint8]:
    """The official BLAKE3 test-vector input: byte i = i % 251."""
    return (np.arange(n) % 251).astype(np.uint8)


@pytest.mark.parametrize("size", SIZES)
def test_whole_input_as_one_page_is_bit_exact(size: int) -> None:
    data = pattern(size)
    dev = cuda.to_device(data if size else np.zeros(1, np.uint8))
    got = page_hashes_device(dev, size, max(size, 1), pages=1)
    assert bytes(got[0]) == blake3.blake3(data.tobytes()).digest()


@pytest.mark.parametrize(
    ("size", "page_bytes"), [(5121, 1024), (8193, 2048), (16384, 4096), (31744, 7168)]
)
def test_pages_of_several_sizes(size: int, page_bytes: int) -> None:
    data = pattern(size)
    got = page_hashes(cuda.to_device(data), page_bytes)  # device="auto" picks CUDA
    assert np.array_equal(got, page_hashes(data, page_bytes))  # the CPU path, the package
    assert got.shape == (-(-size // page_bytes), 32)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_merging_runs_of_chunks(threads: int) -> None:
    """Fewer threads than chunks: each merges a whole subtree before the shared tree."""
    data = pattern(13 * 1024 + 77)
    got = page_hashes_device(cuda.to_device(data), data.size, data.size, threads=threads)
    assert bytes(got[0]) == blake3.blake3(data.tobytes()).digest()


@pytest.mark.parametrize("bad", [None, 0, 3, 7])  # none, the first, a middle, the last page
def test_first_bad_and_ladder_copy_on_the_device(bad: int | None) -> None:
    pb, n = 1024, 8
    src = pattern(n * pb - 100)
    expected = page_hashes(src, pb)
    damaged = src.copy()
    if bad is not None:
        damaged[bad * pb + 11] ^= 0x01
    d_src = cuda.to_device(damaged)
    actual = page_hashes(d_src, pb)
    first = first_bad_page(cuda.to_device(actual), cuda.to_device(expected))
    assert first == (-1 if bad is None else bad)
    assert first_bad_page(actual, expected) == first  # the CPU path agrees
    valid = n if first < 0 else first
    table = np.array([5, 2, 7, 0, 9, 1, 3, 8], dtype=np.int64)
    pool = cuda.to_device(np.zeros(10 * pb, np.uint8))
    ladder_copy(d_src, pb, valid, pool, cuda.to_device(table))
    host_pool = np.zeros(10 * pb, np.uint8)
    ladder_copy(damaged, pb, valid, host_pool, table, device="cpu")
    got = pool.copy_to_host()
    assert np.array_equal(got, host_pool)
    for i in range(n):
        block = got[table[i] * pb : (table[i] + 1) * pb]
        page = src[i * pb : (i + 1) * pb]
        if i < valid:
            assert np.array_equal(block[: page.size], page)
        else:
            assert not block.any(), "a page at or past the damage reached the destination"


# (tokens, row bytes) in pages of 3: whole pages, short rows; a short last page, rows longer
# than a block's 256 threads
@pytest.mark.parametrize(("n_tokens", "row"), [(9, 16), (7, 260)])
def test_gather_rows_is_the_inverse_of_scatter_rows(n_tokens: int, row: int) -> None:
    """Stored pages scattered into K/V rows at shuffled slots (the host path, the reference),
    then gathered back on the device, layer by layer: the same bytes, the short last page and
    rows longer than a block's threads included."""
    layers, pt, rows = 2, 3, 2 * n_tokens + 5
    rng = np.random.default_rng(n_tokens)
    src = rng.integers(0, 256, n_tokens * layers * 2 * row, dtype=np.uint8)
    slots = rng.permutation(rows)[:n_tokens].astype(np.int64)
    k = [np.zeros(rows * row, np.uint8) for _ in range(layers)]
    v = [np.zeros(rows * row, np.uint8) for _ in range(layers)]
    for layer in range(layers):
        scatter_rows(src, n_tokens, pt, layers, row, layer, k[layer], v[layer], slots, "cpu")
    out = cuda.to_device(np.full(src.size, 0xEE, np.uint8))
    d_slots = cuda.to_device(slots)
    for layer in range(layers):
        dk, dv = cuda.to_device(k[layer]), cuda.to_device(v[layer])
        gather_rows_device(out, n_tokens, pt, layers, row, layer, dk, dv, d_slots)
    assert np.array_equal(out.copy_to_host(), src)


def test_device_choice_is_validated() -> None:
    with pytest.raises(ValueError):
        page_hashes(pattern(10), 4, device="gpu")  # type: ignore[arg-type]


def test_every_kernel_compiles_to_ptx_for_sm_90() -> None:
    """The simulator runs kernels as Python, so only a real compile shows that numba can type and
    lower them (it caught the built-in ``min``, which does not compile for CUDA in numba 0.68).
    The uint32-cast style must give the 32-bit funnel-shift rotates (FACTS.md)."""
    from numba_kernels.ptx import KERNELS, nvcc_wheel_home

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    home = nvcc_wheel_home()
    if home is not None:
        env["CUDA_HOME"] = home
    done = subprocess.run(
        [sys.executable, "-m", "numba_kernels.ptx", "9.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if "NvvmSupportError" in done.stdout:
        pytest.skip(f"no NVVM to compile with (pip install nvidia-cuda-nvcc-cu12): {done.stdout}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(lines) == set(KERNELS)
    assert all("target=sm_90 " in rest for rest in lines.values()), lines
    assert "funnel_shifts=0" not in lines["page_hash"], lines["page_hash"]
