"""A conversation's K/V in the stored page layout (spec F-SEG-4), from the engine's layout and
back out of a capture: :func:`pack_pages` (per-layer K and V arrays into pages, one strided copy
per layer, K/V and segment), :func:`deliver_capture` (a capture this process holds into a
restore destination) and :func:`recut_pages` (a capture cut at more points, in place)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from numba_kernels.cpu import parallel_run
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.restore.destinations import (
    Destination,
    DestinationRefused,
    FlatKV,
    flat_bytes,
    page_runs,
)

__all__ = ["deliver_capture", "pack_pages", "recut_pages"]


def deliver_capture(
    dest: Destination,
    kv: npt.NDArray[np.uint8],
    boundaries: Sequence[tuple[int, int]],
    length: int,
    fp: ModelFingerprint,
) -> None:
    """Copy tokens ``[0, length)`` of a capture held in memory (``kv``: the stored page layout
    of spec F-SEG-4, segment by segment along ``boundaries``, the conversation's
    ``(start, end)`` cuts) into ``dest``. A capture in this process's memory (the RAM level, a
    park whose disk write is in flight) is the engine's own bytes: nothing to validate."""
    if isinstance(dest, FlatKV):
        dest.write_pages(0, length, kv, fp.page_tokens)
        return
    for start, end in boundaries:
        if start >= length:
            break
        end = min(end, length)
        dest.write_pages(
            start, end - start, kv[start * fp.token_bytes : end * fp.token_bytes], fp.page_tokens
        )


def pack_pages(
    fp: ModelFingerprint,
    k: Sequence[npt.NDArray[np.generic]],
    v: Sequence[npt.NDArray[np.generic]],
    n_tokens: int,
    cuts: Sequence[int] = (0,),
    *,
    out: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.uint8]:
    """A conversation's K/V in the stored layout (spec F-SEG-4), the inverse of
    :class:`LayerKV`: ``n_tokens`` tokens given per layer as K and V arrays
    ``[tokens, n_kv_heads, head_dim]`` (any dtype of ``fp``'s item size, or bytes). Each segment
    (from each of ``cuts`` to the next, the conversation's segment boundaries) is laid out in
    pages of ``page_tokens`` counted from its own start, the last one short.

    One strided copy per layer, K/V and segment, spread over the worker threads: each
    source byte is copied once, into ``out`` when given (a flat uint8 buffer of at least
    ``n_tokens * token_bytes`` bytes, C-contiguous and writable: reusing one spares a fresh
    buffer's page faults) or into a new array. Returns the packed bytes (a view of ``out``)."""
    if len(k) != fp.n_layers or len(v) != fp.n_layers:
        raise ConfigError(f"pack_pages needs {fp.n_layers} K and V arrays, got {len(k)}, {len(v)}")
    row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize
    parts = []
    for arr in (*k, *v):
        b = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)  # a view when contiguous
        if b.size < n_tokens * row:
            raise ConfigError(f"a K/V array holds {b.size // row} tokens, {n_tokens} are needed")
        parts.append(b[: n_tokens * row].reshape(n_tokens, row))
    n_layers, p, tb = fp.n_layers, fp.page_tokens, fp.token_bytes
    if out is None:
        out = np.empty(n_tokens * tb, np.uint8)
    else:
        out = flat_bytes(out, "pack_pages out")
        if out.size < n_tokens * tb:
            raise DestinationRefused(
                f"pack_pages out holds {out.size:,} bytes; {n_tokens:,} "
                f"tokens need {n_tokens * tb:,}"
            )
        out = out[: n_tokens * tb]
    bounds = sorted({0, *(c for c in cuts if 0 < c < n_tokens), n_tokens})
    runs = [
        run
        for lo, hi in itertools.pairwise(bounds)
        for run in page_runs(fp, lo, hi - lo, out[lo * tb : hi * tb], p)
    ]

    def task(layer: int, kind: int) -> Callable[[], None]:
        src = parts[kind * n_layers + layer]

        def run() -> None:
            for t0, view in runs:
                n, q = view.shape[0], view.shape[3]
                view[:, layer, kind] = src[t0 : t0 + n * q].reshape(n, q, row)

        return run

    parallel_run([task(i, kind) for i in range(n_layers) for kind in (0, 1)], n_tokens * tb)
    return out


def recut_pages(
    fp: ModelFingerprint,
    kv: npt.NDArray[np.uint8],
    bounds: Sequence[int],
    cuts: Sequence[int],
) -> list[tuple[int, int]]:
    """Lay ``kv`` (a capture in the stored layout, spec F-SEG-4 and F-SEG-7, its segments
    between consecutive ``bounds``: 0, the cuts, the end) out again, in place, as segments cut
    at every point of ``cuts`` as well, so that each of them starts a segment and its pages.

    A segment ``[s, e)`` with new cuts inside changes from the page holding its first new cut
    to its end; the pages before that page are already where the new layout wants them. The
    new pages are written in token order, each over the bytes of the old pages it takes its
    tokens from; an old page is copied aside just before the first new page that overlaps it is
    written (a new page of at most ``page_tokens`` tokens overlaps at most two old ones), so a
    recut holds at most two pages aside, whatever the capture's size, and copies each byte of
    the changed region twice. Returns the ``(start, end)`` of the segments that changed (digests
    of their pages no longer hold)."""
    p, tb = fp.page_tokens, fp.token_bytes
    changed = []
    for s, e in itertools.pairwise(bounds):
        inner = sorted({c for c in cuts if s < c < e})
        if not inner:
            continue
        lo = s + (inner[0] - s) // p * p  # the first page whose layout changes
        aside: dict[int, npt.NDArray[np.uint8]] = {}  #: an old page's first token -> its copy
        ahead = lo  # the first token of the next old page to copy aside
        for a, b in itertools.pairwise([lo, *inner, e]):
            for t0, run in page_runs(fp, a, b - a, kv[a * tb : b * tb], p):
                q = run.shape[3]
                for k in range(run.shape[0]):
                    first, end = t0 + k * q, t0 + (k + 1) * q
                    while ahead < min(end, e):  # the old pages it overlaps, before it is written
                        n = min(p, e - ahead)
                        page_bytes = kv[ahead * tb : (ahead + n) * tb]
                        aside[ahead] = page_bytes.reshape(fp.n_layers, 2, n, -1).copy()
                        ahead += n
                    page = run[k]
                    for o0, saved in list(aside.items()):
                        o1 = o0 + saved.shape[2]
                        x0, x1 = max(first, o0), min(end, o1)
                        if x0 < x1:
                            page[:, :, x0 - first : x1 - first] = saved[:, :, x0 - o0 : x1 - o0]
                        if o1 <= end:
                            del aside[o0]  # every token of it is written
        changed.append((s, e))
    return changed
