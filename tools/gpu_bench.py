"""Throughput of the CUDA kernels on a real device, next to a device-to-device memcpy.

Run by tools/gpu_check.sh (NUMBA_ENABLE_CUDASIM=0). Prints GB/s of: page hashing (BLAKE3, one
block per page), the first-bad-page kernel, the ladder copy into a paged pool, and a plain
device-to-device copy of the same bytes. Medians of 5 runs after a warmup.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from numba import cuda

from numba_kernels import first_bad_page, ladder_copy, page_hashes

MIB = 1 << 20


def timed(fn, runs: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    cuda.synchronize()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(total_mib: int = 512, page_kib: int = 64) -> None:
    n = total_mib * MIB
    pb = page_kib * 1024
    host = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    src = cuda.to_device(host)
    dst = cuda.device_array(n, dtype=np.uint8)
    expected = page_hashes(host, pb)  # the reference (CPU, the blake3 package)
    got = page_hashes(src, pb)
    assert np.array_equal(got, expected), "device digests differ from the blake3 package"
    d_exp = cuda.to_device(expected)
    d_got = cuda.to_device(got)
    pages = n // pb
    table = cuda.to_device(np.random.default_rng(1).permutation(pages).astype(np.int64))
    pool = cuda.device_array(n, dtype=np.uint8)
    print(f"device: {cuda.get_current_device().name.decode()}, {total_mib} MiB, "
          f"{page_kib} KiB pages")  # fmt: skip
    rows = [
        ("page hashing (BLAKE3)", timed(lambda: page_hashes(src, pb))),
        ("first-bad-page check", timed(lambda: first_bad_page(d_got, d_exp))),
        ("ladder copy via block table", timed(lambda: ladder_copy(src, pb, pages, pool, table))),
        ("device-to-device memcpy", timed(lambda: dst.copy_to_device(src))),
    ]
    for name, s in rows:
        print(f"  {name:<30} {n / s / 1e9:8.2f} GB/s")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
