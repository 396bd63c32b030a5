"""Page-level kernels: BLAKE3 page hashing, first-bad-page validation and the ladder copy.

Each function takes host numpy arrays (CPU paths: the ``blake3`` package on a thread pool, numpy
copies) or CUDA device arrays (the numba CUDA kernels of :mod:`numba_kernels.cuda`);
``device="auto"`` picks CUDA for device arrays and the CPU for host ones.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .checks import (
    KernelArgumentError,
    check_digests,
    check_ladder,
    check_rows,
    check_scatter,
    flat_bytes,
)
from .cpu import DIGEST_BYTES, hash_page, start_page_hashes, validated_copy
from .cpu import page_hashes as _cpu_page_hashes

__all__ = [
    "DIGEST_BYTES",
    "KernelArgumentError",
    "first_bad_page",
    "hash_page",
    "ladder_copy",
    "page_hashes",
    "scatter_rows",
    "start_page_hashes",
    "validated_copy",
    "zero_rows",
]

Device = Literal["auto", "cpu", "cuda"]


def _on_device(buf: Any, device: Device) -> bool:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    return device == "cuda" or (device == "auto" and hasattr(buf, "copy_to_host"))


def page_hashes(
    buf: Any, page_bytes: int, device: Device = "auto", key: bytes | None = None
) -> npt.NDArray[np.uint8]:
    """``(n_pages, 32)`` BLAKE3-256 digests of consecutive ``page_bytes`` pages of ``buf`` (the
    last may be short; an empty buffer has no pages). ``key``: BLAKE3 keyed by it (a keyed
    level, spec F-KEYED), on the CPU only: device memory with a key is refused."""
    if (
        isinstance(page_bytes, bool)
        or not isinstance(page_bytes, (int, np.integer))
        or page_bytes < 1
    ):
        raise KernelArgumentError(f"page_bytes must be a positive int, not {page_bytes!r}")
    if _on_device(buf, device):
        if key is not None:
            raise KernelArgumentError(
                "keyed BLAKE3 runs on the CPU path only; copy the pages to the host to hash them"
            )
        from .cuda import page_hashes_device

        flat = flat_bytes(buf, "buf")
        return page_hashes_device(flat, int(flat.shape[0]), int(page_bytes))
    return _cpu_page_hashes(buf, page_bytes, key)


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


def ladder_copy(
    src: Any, page_bytes: int, n_pages: int, pool: Any, block_table: Any, device: Device = "auto"
) -> None:
    """Copy the valid prefix (pages ``[0, n_pages)``) of ``src`` into the blocks of ``pool``
    named by ``block_table`` (a pool block holds one page; the pool any shape, C-contiguous,
    uint8). Every argument is checked first, on either path (:mod:`numba_kernels.checks`):
    nothing is launched or copied for arguments that do not fit."""
    if _on_device(src, device):
        from .cuda import ladder_copy_device

        host_table = (
            block_table.copy_to_host()
            if hasattr(block_table, "copy_to_host")
            else np.asarray(block_table)
        )
        s, p = check_ladder(src, page_bytes, n_pages, pool, host_table)
        table = block_table if hasattr(block_table, "copy_to_host") else _to_device(host_table)
        ladder_copy_device(s, int(page_bytes), int(n_pages), p, table)
        return
    s, p = check_ladder(
        np.asarray(src), page_bytes, n_pages, np.asarray(pool), np.asarray(block_table)
    )
    table = np.asarray(block_table)
    for i in range(n_pages):
        n = min(page_bytes, s.size - i * page_bytes)
        d = int(table[i]) * page_bytes
        p[d : d + n] = s[i * page_bytes : i * page_bytes + n]


def scatter_rows(
    src: Any,
    n_tokens: int,
    page_tokens: int,
    layers: int,
    row: int,
    layer: int,
    dst_k: Any,
    dst_v: Any,
    slots: Any,
    device: Device = "auto",
) -> None:
    """Copy layer ``layer``'s K and V rows of the ``n_tokens`` tokens that ``src`` holds as
    consecutive stored pages of ``page_tokens`` (spec F-SEG-4: per layer, K then V, each
    ``[p, row]``; the last page may be short) into rows ``slots[j]`` of ``dst_k`` and ``dst_v``
    (any shape, C-contiguous, uint8): a contiguous cache (``slots`` = token positions) or a
    paged pool (``slots`` = block id * block size + offset). Checked first on either path."""
    if _on_device(src, device):
        from .cuda import scatter_rows_device

        host = slots.copy_to_host() if hasattr(slots, "copy_to_host") else np.asarray(slots)
        s, k, v = check_scatter(src, n_tokens, page_tokens, layers, row, layer, dst_k, dst_v, host)
        table = slots if hasattr(slots, "copy_to_host") else _to_device(host.astype(np.int64))
        scatter_rows_device(
            s, int(n_tokens), int(page_tokens), int(layers), int(row), int(layer), k, v, table
        )
        return
    table = np.asarray(slots)
    s, k, v = check_scatter(
        np.asarray(src),
        n_tokens,
        page_tokens,
        layers,
        row,
        layer,
        np.asarray(dst_k),
        np.asarray(dst_v),
        table,
    )
    full, tb = n_tokens // page_tokens, layers * 2 * row
    rest = n_tokens - full * page_tokens
    for kind, d in ((0, k), (1, v)):
        parts = []
        if full:
            pages = s[: full * page_tokens * tb].reshape(full, layers, 2, page_tokens, row)
            parts.append(pages[:, layer, kind].reshape(-1, row))
        if rest:
            tail = s[full * page_tokens * tb : n_tokens * tb].reshape(1, layers, 2, rest, row)
            parts.append(tail[:, layer, kind].reshape(-1, row))
        if parts:
            d.reshape(-1, row)[table[:n_tokens].astype(np.int64)] = np.concatenate(parts)


def zero_rows(dst: Any, row: int, slots: Any, device: Device = "auto") -> None:
    """Zero rows ``slots`` (of ``row`` bytes) of ``dst`` (any shape, C-contiguous, uint8)."""
    if isinstance(row, bool) or not isinstance(row, (int, np.integer)) or row < 1:
        raise KernelArgumentError(f"row must be a positive int, not {row!r}")
    if _on_device(dst, device):
        from .cuda import zero_rows_device

        host = slots.copy_to_host() if hasattr(slots, "copy_to_host") else np.asarray(slots)
        d = check_rows(dst, int(row), host, "dst")
        table = slots if hasattr(slots, "copy_to_host") else _to_device(host.astype(np.int64))
        zero_rows_device(d, int(row), table)
        return
    table = np.asarray(slots)
    d = check_rows(np.asarray(dst), int(row), table, "dst")
    d.reshape(-1, row)[table.astype(np.int64)] = 0


def _to_device(a: npt.NDArray[Any]) -> Any:
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))
