"""Page-level kernels: BLAKE3 page hashing, first-bad-page validation and the ladder copy.

Each function takes host numpy arrays (CPU paths: the ``blake3`` package on a thread pool, numpy
copies) or CUDA device arrays (the numba CUDA kernels of :mod:`numba_kernels.cuda`);
``device="auto"`` picks CUDA for device arrays and the CPU for host ones.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .checks import KernelArgumentError, check_digests, check_ladder, flat_bytes
from .cpu import DIGEST_BYTES, hash_page, start_page_hashes, validated_copy
from .cpu import page_hashes as _cpu_page_hashes

__all__ = [
    "DIGEST_BYTES",
    "KernelArgumentError",
    "first_bad_page",
    "hash_page",
    "ladder_copy",
    "page_hashes",
    "start_page_hashes",
    "validated_copy",
]

Device = Literal["auto", "cpu", "cuda"]


def _on_device(buf: Any, device: Device) -> bool:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    return device == "cuda" or (device == "auto" and hasattr(buf, "copy_to_host"))


def page_hashes(buf: Any, page_bytes: int, device: Device = "auto") -> npt.NDArray[np.uint8]:
    """``(n_pages, 32)`` BLAKE3-256 digests of consecutive ``page_bytes`` pages of ``buf`` (the
    last may be short; an empty buffer has no pages)."""
    if isinstance(page_bytes, bool) or not isinstance(page_bytes, (int, np.integer)) \
            or page_bytes < 1:  # fmt: skip
        raise KernelArgumentError(f"page_bytes must be a positive int, not {page_bytes!r}")
    if _on_device(buf, device):
        from .cuda import page_hashes_device

        flat = flat_bytes(buf, "buf")
        return page_hashes_device(flat, int(flat.shape[0]), int(page_bytes))
    return _cpu_page_hashes(buf, page_bytes)


def first_bad_page(actual: Any, expected: Any, device: Device = "auto") -> int:
    """The first page whose digest differs, or -1 when all match."""
    if _on_device(actual, device):
        from .cuda import first_bad_device

        check_digests(actual, expected)
        return first_bad_device(actual, expected)
    a, e = np.asarray(actual), np.asarray(expected)
    check_digests(a, e)
    bad = np.flatnonzero((a != e).reshape(a.shape[0], -1).any(axis=1))
    return int(bad[0]) if bad.size else -1


def ladder_copy(src: Any, page_bytes: int, n_pages: int, pool: Any, block_table: Any,
                device: Device = "auto") -> None:  # fmt: skip
    """Copy the valid prefix (pages ``[0, n_pages)``) of ``src`` into the blocks of ``pool``
    named by ``block_table`` (a pool block holds one page; the pool any shape, C-contiguous,
    uint8). Every argument is checked first, on either path (:mod:`numba_kernels.checks`):
    nothing is launched or copied for arguments that do not fit."""
    if _on_device(src, device):
        from .cuda import ladder_copy_device

        host_table = block_table.copy_to_host() if hasattr(block_table, "copy_to_host") \
            else np.asarray(block_table)  # fmt: skip
        s, p = check_ladder(src, page_bytes, n_pages, pool, host_table)
        table = block_table if hasattr(block_table, "copy_to_host") else _to_device(host_table)
        ladder_copy_device(s, int(page_bytes), int(n_pages), p, table)
        return
    s, p = check_ladder(np.asarray(src), page_bytes, n_pages, np.asarray(pool),
                        np.asarray(block_table))  # fmt: skip
    table = np.asarray(block_table)
    for i in range(n_pages):
        n = min(page_bytes, s.size - i * page_bytes)
        d = int(table[i]) * page_bytes
        p[d : d + n] = s[i * page_bytes : i * page_bytes + n]


def _to_device(a: npt.NDArray[Any]) -> Any:
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))
