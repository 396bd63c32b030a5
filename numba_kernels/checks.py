"""The kernels' boundary: every entry point checks its arguments before anything runs, so a wrong
dtype, a strided buffer, a pool of another shape or a block table that names a block outside the
pool is a typed :class:`KernelArgumentError` naming the argument and the fix, never an
``IndexError`` from inside a kernel, a wrong result or a write out of bounds.

The same checks serve host (numpy) and device arrays (numba device arrays, or anything with
``__cuda_array_interface__`` already wrapped by :func:`numba.cuda.as_cuda_array`): what they read
is the shape, the dtype and the strides, and for a device block table its values (copied to the
host: a table is a few bytes a page)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "KernelArgumentError",
    "check_digests",
    "check_ladder",
    "check_rows",
    "check_scatter",
    "flat_bytes",
]


class KernelArgumentError(ValueError):
    """A kernel's argument it cannot take (dtype, layout, shape, bounds); raised before any
    launch or copy, with the argument and the fix in the message."""


def _c_contiguous(a: Any) -> bool:
    flags = getattr(a, "flags", None)
    if flags is not None and "C_CONTIGUOUS" in getattr(flags, "keys", lambda: ())():
        return bool(flags["C_CONTIGUOUS"])
    is_c = getattr(a, "is_c_contiguous", None)
    return bool(is_c()) if callable(is_c) else bool(np.asarray(a).flags.c_contiguous)


def flat_bytes(a: Any, name: str) -> Any:
    """``a`` as a 1-D uint8 array of the same memory (any number of dimensions, C-contiguous):
    what the kernels index. A copy is never made: an array that cannot be viewed so is refused."""
    dtype = np.dtype(getattr(a, "dtype", np.uint8))
    if dtype != np.uint8:
        raise KernelArgumentError(
            f"{name} holds {dtype}; the kernels take raw bytes: pass a "
            f"uint8 view of it (.view(np.uint8))"
        )
    if not _c_contiguous(a):
        strides = getattr(a, "strides", "?")
        raise KernelArgumentError(
            f"{name} is not C-contiguous (strides {strides}); the "
            "kernels read and write it in place: pass a contiguous "
            "array"
        )
    return a if len(a.shape) == 1 else a.reshape(int(np.prod(a.shape)))


def check_digests(actual: Any, expected: Any) -> None:
    """Two ``(pages, 32)`` uint8 digest arrays of one shape."""
    for name, a in (("actual", actual), ("expected", expected)):
        shape = tuple(a.shape)
        if len(shape) != 2 or shape[1] != 32 or np.dtype(a.dtype) != np.uint8:
            raise KernelArgumentError(
                f"{name} digests are {np.dtype(a.dtype)} {shape}; pass "
                "(pages, 32) uint8 BLAKE3 digests"
            )
    if tuple(actual.shape) != tuple(expected.shape):
        raise KernelArgumentError(
            f"digest arrays differ in shape: {tuple(actual.shape)} and "
            f"{tuple(expected.shape)}; compare the same pages"
        )


def check_ladder(
    src: Any, page_bytes: int, n_pages: int, pool: Any, table: np.ndarray[Any, Any]
) -> tuple[Any, Any]:
    """The arguments of a ladder copy, checked: ``src`` and ``pool`` as flat bytes (the pool
    any shape, C-contiguous, whole blocks of ``page_bytes``), ``n_pages`` within ``src``, and
    the first ``n_pages`` entries of ``table`` (the block table, on the host) naming distinct
    blocks of the pool. Returns the flat ``src`` and ``pool``."""
    if (
        isinstance(page_bytes, bool)
        or not isinstance(page_bytes, (int, np.integer))
        or page_bytes < 1
    ):
        raise KernelArgumentError(f"page_bytes must be a positive int, not {page_bytes!r}")
    s, p = flat_bytes(src, "src"), flat_bytes(pool, "pool")
    pages_in_src = -(-int(s.shape[0]) // int(page_bytes))
    if (
        isinstance(n_pages, bool)
        or not isinstance(n_pages, (int, np.integer))
        or not 0 <= n_pages <= pages_in_src
    ):
        raise KernelArgumentError(
            f"n_pages={n_pages!r} is not within the {pages_in_src} "
            f"pages of src ({s.shape[0]:,} bytes, {page_bytes}-byte "
            "pages)"
        )
    if int(p.shape[0]) % int(page_bytes):
        raise KernelArgumentError(
            f"the pool holds {p.shape[0]:,} bytes, not whole blocks of "
            f"{page_bytes} (one page a block): pass the pool of this page "
            "size"
        )
    blocks = int(p.shape[0]) // int(page_bytes)
    if table.ndim != 1 or not np.issubdtype(table.dtype, np.integer):
        raise KernelArgumentError(
            f"the block table is {table.dtype} {table.shape}; pass one integer block id a page"
        )
    if table.shape[0] < n_pages:
        raise KernelArgumentError(
            f"the block table names {table.shape[0]} blocks for "
            f"{n_pages} pages; pass one block id a page"
        )
    _distinct_within(
        table[:n_pages],
        blocks,
        lambda b: (
            f"the block table names block {b}, outside the pool's {blocks} blocks (0..{blocks - 1})"
        ),
        "the block table names a block twice: two pages would land in one block; "
        "pass distinct block ids",
    )
    return s, p


def _distinct_within(
    ids: np.ndarray[Any, Any], limit: int, outside: Callable[[int], str], twice: str
) -> None:
    """Refuse ids outside ``[0, limit)`` (``outside(id)`` says so) or given twice."""
    used = ids.astype(np.int64)
    bad = used[(used < 0) | (used >= limit)]
    if bad.size:
        raise KernelArgumentError(outside(int(bad[0])))
    if np.unique(used).size != used.size:
        raise KernelArgumentError(twice)


def _count(x: object, name: str, lo: int = 0) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < lo:
        raise KernelArgumentError(f"{name} must be an int >= {lo}, not {x!r}")
    return int(x)


def check_rows(dst: Any, row: int, slots: np.ndarray[Any, Any], name: str) -> Any:
    """``dst`` as flat bytes holding whole rows of ``row`` bytes, and ``slots`` (on the host)
    naming distinct rows inside it. Returns the flat ``dst``."""
    d = flat_bytes(dst, name)
    if int(d.shape[0]) % row:
        raise KernelArgumentError(
            f"{name} holds {d.shape[0]:,} bytes, not whole rows of {row}: "
            "pass the K/V array of this model"
        )
    rows = int(d.shape[0]) // row
    if slots.ndim != 1 or not np.issubdtype(slots.dtype, np.integer):
        raise KernelArgumentError(
            f"the slots are {slots.dtype} {slots.shape}; pass one integer row a token"
        )
    _distinct_within(
        slots,
        rows,
        lambda r: f"slot {r} is outside {name}'s {rows} rows (0..{rows - 1})",
        "a slot is named twice: two tokens would land in one row; pass distinct slots",
    )
    return d


def check_scatter(
    src: Any,
    n_tokens: int,
    page_tokens: int,
    layers: int,
    row: int,
    layer: int,
    dst_k: Any,
    dst_v: Any,
    slots: np.ndarray[Any, Any],
) -> tuple[Any, Any, Any]:
    """The arguments of a row scatter (:func:`numba_kernels.scatter_rows`): ``src`` holds
    ``n_tokens`` tokens of ``layers * 2 * row`` bytes as stored pages, ``layer`` is one of
    them, the first ``n_tokens`` ``slots`` name distinct rows of ``dst_k`` and of ``dst_v``
    (distinct arrays). Returns the flat ``src``, ``dst_k``, ``dst_v``."""
    n = _count(n_tokens, "n_tokens")
    _count(page_tokens, "page_tokens", 1)
    _count(layers, "layers", 1)
    _count(row, "row", 1)
    if _count(layer, "layer") >= layers:
        raise KernelArgumentError(f"layer {layer} is not one of the {layers} layers")
    s = flat_bytes(src, "src")
    if int(s.shape[0]) < n * layers * 2 * row:
        raise KernelArgumentError(
            f"src holds {s.shape[0]:,} bytes; {n} tokens of {layers} "
            f"layers x K/V x {row}-byte rows are "
            f"{n * layers * 2 * row:,}"
        )
    if slots.shape[:1] != (n,):
        raise KernelArgumentError(f"{slots.shape} slots for {n} tokens: pass one slot a token")
    k = check_rows(dst_k, row, slots, "dst_k")
    v = check_rows(dst_v, row, slots, "dst_v")
    if dst_k is dst_v:
        raise KernelArgumentError(
            "dst_k and dst_v are one array: K and V would overwrite each "
            "other; pass the layer's K and V arrays"
        )
    return s, k, v
