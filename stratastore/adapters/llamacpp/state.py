"""llama.cpp's per-sequence K/V state (``llama_state_seq_get_data`` / ``_set_data``), read into
per-token rows and written back for a prefix.

The layout is the one llama-cpp-python 0.3.36 vendors (llama.cpp's ``llama_context::
state_seq_get_data`` and ``llama_kv_cache::state_write``), little endian::

    u32 magic 0xaf143cd8, i32 seq_id
    u32 n_stream (1 here)
    u32 cell_count; when 0 nothing else, else
      per cell:  i32 pos, u32 n_seq_id, n_seq_id x i32 seq id
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes
      v_trans=0, per layer: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes
      v_trans=1, per layer: i32 v_type, u32 v_el_bytes, u32 n_embd_v_gqa,
                 n_embd_v_gqa x (cell_count x v_el_bytes)   (element j of every cell, then j+1)

A whole-context state (``llama_state_get_data``, what ``Llama.save_state`` keeps) is ``u32``
length and the model's architecture name, then the same from ``n_stream`` on.

A state is read only when every field is the one this context's :class:`Layout` says (the
magic, one stream, cells at positions ``0..n-1`` of one sequence, the layers, the K/V types and
row sizes, V transposed or not) and the bytes end where the layout does: anything else, a
state of another llama.cpp version included, is :class:`StateLayoutError`, never misread. The
rows stored are each token's K row then its V row (V untransposed), per layer: the same bytes
for a context that keeps V transposed or not.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError
from stratastore.io.system import process_cpus

__all__ = [
    "SEQ_MAGIC",
    "Layout",
    "StateLayoutError",
    "build_context_state",
    "build_state",
    "read_context_state",
    "read_state",
    "fill_v",
    "per_layer",
    "state_buffer",
    "state_of_rows",
    "transpose_v_rows",
]

SEQ_MAGIC = 0xAF143CD8  #: llama.cpp's LLAMA_STATE_SEQ_MAGIC
#: what this adapter reads: the layout of llama-cpp-python 0.3.36 (llama.cpp 0c1e57098)
KNOWN_VERSION = "0.3.36"
KNOWN_LAYOUT = f"llama.cpp's sequence state as llama-cpp-python {KNOWN_VERSION} writes it"

_COUNTS = struct.Struct("<II")  # n_stream, cell_count
_CELL = struct.Struct("<iI")  # pos, n_seq_id
_V_HEAD = struct.Struct("<II")  # v_trans, n_layer
_TYPE_ROW = struct.Struct("<iQ")  # type, row bytes
_TYPE_EL = struct.Struct("<iII")  # type, element bytes, n_embd_v_gqa


class StateLayoutError(StrataError):
    """A llama.cpp sequence state whose layout is not the one this adapter reads for this
    context (another llama.cpp version, another K/V type or geometry, a truncated buffer):
    refused, never misread."""


@dataclass(frozen=True)
class Layout:
    """What a context's sequence state holds per layer: ``n_layer`` layers of K rows of
    ``k_row`` bytes (ggml type ``k_type``) and V rows of ``v_row`` bytes (``v_type``, whose
    element is ``v_el`` bytes when V is transposed: ``n_embd_v`` elements a row)."""

    n_layer: int
    k_type: int
    k_row: int
    v_type: int
    v_row: int
    v_trans: bool
    v_el: int
    n_embd_v: int
    version: str = "?"  #: the llama-cpp-python that made the context, for messages

    @property
    def token_bytes(self) -> int:
        """The bytes a token's rows take, every layer's K then V."""
        return self.n_layer * (self.k_row + self.v_row)

    def __post_init__(self) -> None:
        if min(self.n_layer, self.k_row, self.v_row) <= 0 or (
            self.v_trans and self.v_el * self.n_embd_v != self.v_row
        ):
            raise StrataError(f"{self} is not a layout: rows of no bytes, or V's do not add up")

    def state_bytes(self, n: int, head: int) -> int:
        """The length of a state of ``n`` cells in this layout after a ``head``-byte header."""
        size = head + _COUNTS.size
        if n:
            v_head = _TYPE_EL.size if self.v_trans else _TYPE_ROW.size
            size += 12 * n + _V_HEAD.size + self.n_layer * (_TYPE_ROW.size + n * self.k_row)
            size += self.n_layer * (v_head + n * self.v_row)
        return size

    def _refuse(self, what: str) -> StateLayoutError:
        fix = (
            "this model's or context's memory is not one the adapter reads (docs/engine.md, "
            "llama.cpp)"
            if self.version == KNOWN_VERSION
            else "use that version (the extra 'stratastore[llamacpp]' pins it), or a "
            "stratastore that reads this one"
        )
        return StateLayoutError(
            f"llama.cpp sequence state: {what}; this adapter reads {KNOWN_LAYOUT} and this "
            f"context runs llama-cpp-python {self.version}: {fix}"
        )


def read_state(buf: bytes | bytearray | memoryview, layout: Layout) -> npt.NDArray[np.uint8]:
    """The rows of a sequence state: ``[layers, cells, k_row + v_row]`` bytes, a token's K row
    then its V row (untransposed), for cells at positions ``0..n-1`` of one sequence.
    :class:`StateLayoutError` for any field that is not ``layout``'s or bytes past its end."""
    mv = memoryview(buf).cast("B")
    if len(mv) < 8:
        raise layout._refuse(f"{len(mv)} bytes, shorter than its header")
    magic, _seq = struct.unpack_from("<Ii", mv, 0)
    if magic != SEQ_MAGIC:
        raise layout._refuse(f"magic {magic:#x} (expected {SEQ_MAGIC:#x})")
    return _read_body(mv, 8, layout)


def read_context_state(
    buf: bytes | bytearray | memoryview, layout: Layout, arch: str
) -> npt.NDArray[np.uint8]:
    """The rows of a whole-context state (``llama_state_get_data``: ``u32`` length and the
    model's architecture name, then the sequence state's body from ``n_stream`` on) of a
    context whose one sequence holds positions ``0..n-1``: as :func:`read_state`."""
    mv = memoryview(buf).cast("B")
    name = arch.encode()
    head = struct.pack("<I", len(name)) + name
    if bytes(mv[: len(head)]) != head:
        raise layout._refuse(f"a whole-context state that does not start with {arch!r}")
    return _read_body(mv, len(head), layout)


def _read_body(mv: memoryview, off: int, layout: Layout) -> npt.NDArray[np.uint8]:
    """The rows of a state's body at ``off``: ``n_stream`` on (see the module)."""
    n_stream, n = _unpack(_COUNTS, mv, off, layout)
    if n_stream != 1:
        raise layout._refuse(f"{n_stream} streams (expected 1)")
    if layout.state_bytes(n, off) != len(mv):  # before anything is allocated for n cells
        raise layout._refuse(
            f"{len(mv):,} bytes, where {n:,} cells of this context's layout take "
            f"{layout.state_bytes(n, off):,}"
        )
    off += _COUNTS.size
    rows = np.empty((layout.n_layer, n, layout.k_row + layout.v_row), np.uint8)
    if n == 0:
        _end(mv, off, layout)
        return rows
    cells = 4 * 3 * n  # each: pos, n_seq_id = 1, its seq id
    if off + cells > len(mv):
        raise layout._refuse(f"{n} cells and only {len(mv) - off} bytes after the header")
    meta = np.frombuffer(mv[off : off + cells], "<i4").reshape(n, 3)
    if not (meta[:, 0] == np.arange(n)).all() or not (meta[:, 1] == 1).all():
        raise layout._refuse("cells that are not positions 0..n-1 of one sequence each")
    off += cells
    v_trans, n_layer = _unpack(_V_HEAD, mv, off, layout)
    off += _V_HEAD.size
    if n_layer != layout.n_layer or bool(v_trans) != layout.v_trans or v_trans > 1:
        raise layout._refuse(
            f"{n_layer} layers, v_trans {v_trans} (this context: {layout.n_layer}, "
            f"{int(layout.v_trans)})"
        )
    kr = layout.k_row
    for i in range(n_layer):
        t, row = _unpack(_TYPE_ROW, mv, off, layout)
        if (t, row) != (layout.k_type, kr):
            raise layout._refuse(
                f"layer {i} K: type {t}, {row}-byte rows (this context: {layout.k_type}, {kr})"
            )
        off += _TYPE_ROW.size
        rows[i, :, :kr] = _take(mv, off, n * kr, layout).reshape(n, kr)
        off += n * kr
    for i in range(n_layer):
        if layout.v_trans:
            t, el, n_embd = _unpack(_TYPE_EL, mv, off, layout)
            if (t, el, n_embd) != (layout.v_type, layout.v_el, layout.n_embd_v):
                raise layout._refuse(f"layer {i} V: type {t}, {el}-byte elements x {n_embd}")
            off += _TYPE_EL.size
            v = _take(mv, off, n_embd * n * el, layout).reshape(n_embd, n * el)
            _transpose(rows[i, :, kr:], v, el)
            off += n_embd * n * el
        else:
            t, row = _unpack(_TYPE_ROW, mv, off, layout)
            if (t, row) != (layout.v_type, layout.v_row):
                raise layout._refuse(f"layer {i} V: type {t}, {row}-byte rows")
            off += _TYPE_ROW.size
            rows[i, :, kr:] = _take(mv, off, n * row, layout).reshape(n, row)
            off += n * row
    _end(mv, off, layout)
    return rows


def build_state(rows: npt.NDArray[np.uint8], n: int, layout: Layout, seq_id: int = 0) -> bytes:
    """The sequence state of the first ``n`` tokens of ``rows`` (``[layers, >= n, k_row +
    v_row]``, as :func:`read_state` gives them) in ``layout``, for ``llama_state_seq_set_data``."""
    _check_rows(rows, n, layout)
    kr = layout.k_row
    k, v = (lambda i: rows[i, :n, :kr]), (lambda i: rows[i, :n, kr:])
    return state_of_rows(k, v, n, layout, seq_id=seq_id).tobytes()


def build_context_state(rows: npt.NDArray[np.uint8], n: int, layout: Layout, arch: str) -> bytes:
    """The whole-context state (``llama_state_set_data``, ``Llama.load_state``) of a context
    whose sequence 0 holds the first ``n`` tokens of ``rows``; ``arch``: the model's
    architecture name (``general.architecture``)."""
    _check_rows(rows, n, layout)
    kr = layout.k_row
    k, v = (lambda i: rows[i, :n, :kr]), (lambda i: rows[i, :n, kr:])
    return state_of_rows(k, v, n, layout, arch=arch).tobytes()


def state_buffer(
    n: int, layout: Layout, *, seq_id: int = 0, arch: str | None = None
) -> tuple[npt.NDArray[np.uint8], list[npt.NDArray[np.uint8]], list[npt.NDArray[np.uint8]]]:
    """A new state of ``n`` cells (a sequence state, or with ``arch`` a whole-context state)
    with its headers and cells written, and per layer its K region (``[n, k_row]`` bytes) and
    its V region (``[n, v_row]``, or ``[n_embd_v, n * v_el]`` when V is transposed) for the
    caller to fill: ``(state, k regions, v regions)``, each region a view of the state."""
    kr, vr, layers = layout.k_row, layout.v_row, layout.n_layer
    head = (
        struct.pack("<Ii", SEQ_MAGIC, seq_id)
        if arch is None
        else struct.pack("<I", len(arch.encode())) + arch.encode()
    )
    size = layout.state_bytes(n, len(head))
    out = np.empty(size, np.uint8)
    off = _put(out, 0, head)
    off = _put(out, off, _COUNTS.pack(1, n))
    ks: list[npt.NDArray[np.uint8]] = []
    vs: list[npt.NDArray[np.uint8]] = []
    if n == 0:
        return out, ks, vs
    meta = out[off : off + 12 * n].view("<i4").reshape(n, 3)
    meta[:, 0], meta[:, 1], meta[:, 2] = np.arange(n), 1, seq_id
    off = _put(out, off + 12 * n, _V_HEAD.pack(int(layout.v_trans), layers))
    for _ in range(layers):
        off = _put(out, off, _TYPE_ROW.pack(layout.k_type, kr))
        ks.append(out[off : off + n * kr].reshape(n, kr))
        off += n * kr
    for _ in range(layers):
        if layout.v_trans:
            off = _put(out, off, _TYPE_EL.pack(layout.v_type, layout.v_el, layout.n_embd_v))
            vs.append(out[off : off + n * vr].reshape(layout.n_embd_v, n * layout.v_el))
        else:
            off = _put(out, off, _TYPE_ROW.pack(layout.v_type, vr))
            vs.append(out[off : off + n * vr].reshape(n, vr))
        off += n * vr
    assert off == size
    return out, ks, vs


def fill_v(region: npt.NDArray[np.uint8], rows: npt.NDArray[np.uint8], layout: Layout) -> None:
    """Write a layer's V ``rows`` (``[n, v_row]``, untransposed) into its V ``region`` of a
    :func:`state_buffer` (transposed there when the layout keeps V so)."""
    if layout.v_trans:
        _transpose(region, rows, layout.v_el)
    else:
        region[:] = rows


def transpose_v_rows(regions: list[npt.NDArray[np.uint8]], layout: Layout) -> None:
    """Each of ``regions`` (a :func:`state_buffer`'s V regions, V transposed in ``layout``)
    holds its layer's V as rows, ``[n, v_row]`` (what a restore wrote there): leave each
    transposed, through a copy of one layer's rows a thread (:func:`per_layer`), so that a
    restore of a model with more layers than the process has CPUs needs no second buffer as
    large as V (a fresh buffer's first writes cost as much as the transpose here).
    ``StrataError`` for a layout that keeps V untransposed."""
    if not layout.v_trans:
        raise StrataError(f"transpose_v_rows of {layout}: this layout keeps V untransposed")
    local = threading.local()

    def transpose(i: int) -> None:
        region = regions[i]
        rows = getattr(local, "rows", None)
        if rows is None or rows.size < region.size:
            rows = local.rows = np.empty(region.size, np.uint8)
        src = rows[: region.size].reshape(-1, layout.v_row)
        src[:] = region.reshape(-1, layout.v_row)
        _transpose(region, src, layout.v_el)

    per_layer(transpose, len(regions))


def state_of_rows(
    k_rows: Callable[[int], npt.NDArray[np.uint8]],
    v_rows: Callable[[int], npt.NDArray[np.uint8]],
    n: int,
    layout: Layout,
    *,
    seq_id: int = 0,
    arch: str | None = None,
) -> npt.NDArray[np.uint8]:
    """The state of ``n`` tokens whose K and V rows of layer ``i`` are ``k_rows(i)`` and
    ``v_rows(i)`` (``[n, k_row]`` and ``[n, v_row]`` bytes, V untransposed, any strides),
    written once into one new buffer (:func:`state_buffer`), the layers spread over the
    process's CPUs (:func:`per_layer`)."""
    out, ks, vs = state_buffer(n, layout, seq_id=seq_id, arch=arch)

    def fill(i: int) -> None:
        ks[i][:] = k_rows(i)
        fill_v(vs[i], v_rows(i), layout)

    per_layer(fill, len(ks))
    return out


def per_layer(fill: Callable[[int], None], layers: int) -> None:
    """``fill(i)`` for every layer ``i``, on as many threads as the process may use CPUs (at
    most one a layer): numpy's copies release the GIL, and a state is a fresh buffer, so the
    page faults of its first writes spread too (two cores build a 4K-token state of 8B's K/V
    geometry, V transposed, in 0.14-0.28 s where one takes 0.55-0.77). Every layer runs; then
    the error of the lowest layer that failed is raised."""
    workers = min(len(process_cpus()), layers)
    if workers < 2:
        errors = []
        for i in range(layers):
            try:
                fill(i)
            except Exception as e:  # raised below, once every layer has run
                errors.append(e)
        if errors:
            raise errors[0]
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="strata-llama-state") as pool:
        futures = [pool.submit(fill, i) for i in range(layers)]
    for done in futures:  # the pool has run every layer
        done.result()


#: rows a block of the V transpose reads at a time (they stay in the CPU's caches)
_TRANSPOSE_BLOCK = 256
_ELEMENT = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _transpose(dst: npt.NDArray[np.uint8], src: npt.NDArray[np.uint8], el: int) -> None:
    """``dst`` (``[a, b * el]`` bytes) = ``src`` (``[b, a * el]`` bytes) transposed as a matrix
    of ``el``-byte elements, :data:`_TRANSPOSE_BLOCK` rows of ``src`` at a time (a plain
    strided copy of 2-byte elements runs at a tenth of the speed here)."""
    kind = _ELEMENT.get(el)
    if kind is None or dst.strides[-1] != 1 or src.strides[-1] != 1:
        a, b = dst.shape[0], src.shape[0]
        dst.reshape(a, b, el)[:] = src.reshape(b, a, el).transpose(1, 0, 2)
        return
    d, t = dst.view(kind), src.view(kind)
    for lo in range(0, t.shape[0], _TRANSPOSE_BLOCK):  # a block of rows of src at a time
        d[:, lo : lo + _TRANSPOSE_BLOCK] = t[lo : lo + _TRANSPOSE_BLOCK].T


def _put(out: npt.NDArray[np.uint8], off: int, data: bytes) -> int:
    out[off : off + len(data)] = np.frombuffer(data, np.uint8)
    return off + len(data)


def _check_rows(rows: npt.NDArray[np.uint8], n: int, layout: Layout) -> None:
    if (
        rows.ndim != 3
        or rows.shape[0] != layout.n_layer
        or rows.shape[1] < n
        or rows.shape[2] != layout.k_row + layout.v_row
    ):
        raise StrataError(f"rows of shape {rows.shape} hold no {n} tokens of {layout}")


def _unpack(s: struct.Struct, mv: memoryview, off: int, layout: Layout) -> tuple[int, ...]:
    if off + s.size > len(mv):
        raise layout._refuse(f"it ends at byte {len(mv)}, inside a field at {off}")
    return s.unpack_from(mv, off)


def _take(mv: memoryview, off: int, nbytes: int, layout: Layout) -> npt.NDArray[np.uint8]:
    if off + nbytes > len(mv):
        raise layout._refuse(f"it ends at byte {len(mv)}, {off + nbytes} needed")
    return np.frombuffer(mv[off : off + nbytes], np.uint8)


def _end(mv: memoryview, off: int, layout: Layout) -> None:
    if off != len(mv):
        raise layout._refuse(f"{len(mv) - off} bytes past the end of the layout")
