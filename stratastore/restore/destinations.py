"""Where a restore writes: the engine's K/V buffers.

Stored pages use the layout of spec F-SEG-4: a page of ``p`` tokens holds, for each layer, K
then V, each ``[p, n_kv_heads, head_dim]``. A destination receives runs of whole pages of one
segment (``write_pages(token_start, n_tokens, page_bytes)``) and lays them out its own way:

* :class:`FlatKV`: one buffer in the stored layout, a segment's pages at ``start * token_bytes``
  (what :meth:`Store.restore` takes);
* :class:`LayerKV`: per-layer K and V arrays ``[max_tokens, n_kv_heads, head_dim]``, the layout
  of a contiguous cache (transformers' ``DynamicCache``);
* :class:`PagedKV`: per-layer pools ``[2, num_blocks, block_size, n_kv_heads, head_dim]``
  (vLLM's FlashAttention backend, SGLang) or, with ``kv_first=False``, ``[num_blocks, 2,
  block_size, n_kv_heads, head_dim]`` (vLLM's FlashInfer backend), addressed through a block
  table.

Each is a :class:`~.capabilities.Destination` with the capabilities of
:mod:`.capabilities` by its members, not by a base class the fast paths know: ``zero``, page
views (``page_views``: the read pass scatters a page into them, a park streams from them) and,
for :class:`FlatKV`, a stored ``region``. A destination written elsewhere with the same members
gets the same paths.

Arrays may be of any dtype of the right item size (bfloat16 travels as uint16); they are
written in place through uint8 views, never through a copy. A torch tensor in host memory is
taken as the numpy view of its own memory (bfloat16 and the other dtypes numpy lacks through an
integer view of their item size); one in device memory is refused, naming the device twin.
A destination that cannot be written in place (not C-contiguous, Fortran-ordered, read-only,
object dtype) or whose geometry does not match the model fingerprint is refused with
:class:`DestinationRefused` when the destination is made, before a restore touches anything.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from numba_kernels.cpu import parallel_copy, parallel_run
from stratastore.format import ModelFingerprint
from stratastore.restore.capabilities import Destination, check_device_pages, lives_on_device
from stratastore.restore.device_arrays import is_device_array
from stratastore.restore.in_place import DestinationRefused, flat_bytes, host_array, is_torch_tensor

__all__ = [
    "Destination",
    "DestinationRefused",
    "FlatKV",
    "LayerKV",
    "PagedKV",
    "as_destination",
    "checked_block_table",
    "flat_bytes",
    "host_array",
    "is_torch_tensor",
    "page_runs",
    "paged_layout",
]


class FlatKV:
    """The stored layout, one buffer for the whole conversation.

    ``read_direct`` (the default): the restore's read pass ``pread``s straight into ``buf``
    (its :meth:`region`, a :class:`~.capabilities.StoredRegion`) and hashes the bytes there,
    one copy; with ``read_direct=False`` it reads through bounded
    staging buffers and copies the validated pages in. Either way, past the prefix a restore
    reports ``buf`` holds its old bytes, or zeros where the restore wrote bytes it does not
    deliver (damage, a ladder stop, an error, the ladder off); never a byte that failed
    validation."""

    def __init__(
        self, fp: ModelFingerprint, buf: npt.NDArray[np.generic], *, read_direct: bool = True
    ) -> None:
        self.fp = fp
        self.tb = fp.token_bytes
        self.buf = flat_bytes(buf, "the K/V buffer")
        self.read_direct = read_direct

    def capacity(self) -> int:
        return self.buf.size // self.tb

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        a = token_start * self.tb
        parallel_copy(self.buf[a : a + n_tokens * self.tb], data[: n_tokens * self.tb])

    def region(self, token_start: int, n_tokens: int) -> npt.NDArray[np.uint8]:
        """The bytes of tokens ``[token_start, token_start + n_tokens)`` (a direct read's
        target)."""
        return self.buf[token_start * self.tb : (token_start + n_tokens) * self.tb]

    def page_views(self, token_start: int, n_tokens: int) -> list[memoryview]:
        """The stored page of tokens ``[token_start, token_start + n_tokens)``: one view of
        :meth:`region` (the buffer is the stored layout already)."""
        return [self.region(token_start, n_tokens).data]

    def zero(self, token_start: int, n_tokens: int) -> None:
        """Zero tokens ``[token_start, token_start + n_tokens)`` (what a direct read placed and
        the restore does not deliver)."""
        self.region(token_start, n_tokens)[:] = 0


class _PerToken:
    """Shared page walking: each page is [layers, 2, p, heads, dim*itemsize] bytes.

    ``read_direct`` (the default, as for :class:`FlatKV`): the read pass scatters each stored
    page straight into the arrays (:meth:`page_views`, one ``preadv``: the
    :class:`~.capabilities.ScatterReads` capability) and hashes it there;
    ``read_direct=False`` reads through staging and copies (one strided copy per layer and
    K/V). Past the prefix a restore reports they hold their old bytes or zeros, never a byte
    that failed validation."""

    read_direct = True

    def __init__(self, fp: ModelFingerprint) -> None:
        self._views: list[memoryview] | None = None  #: each layer's K then V rows, as bytes
        self.fp = fp
        self.layers = fp.n_layers
        self.row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize  # bytes of one token's K
        self.tb = fp.token_bytes

    def _checked(self, a: object, what: str, lead: tuple[int, ...]) -> npt.NDArray[np.uint8]:
        """``a`` as bytes ``[*lead, tokens, row]`` after checking it is writable in place and
        ``[*lead, tokens, n_kv_heads, head_dim]`` of the model's item size (or, for
        :class:`LayerKV`, ``[tokens, row bytes]`` of bytes)."""
        a = host_array(a, what)
        flat = flat_bytes(a, what)
        assert isinstance(a, np.ndarray)
        fp, k = self.fp, len(lead)
        model = (fp.n_kv_heads, fp.head_dim)
        fits = a.ndim == k + 3 and a.shape[k + 1 :] == model and a.itemsize == fp.dtype.itemsize
        fits = fits or (not lead and a.ndim == 2 and a.shape[1] == self.row and a.itemsize == 1)
        if not fits or a.shape[:k] != lead:
            want = ", ".join(map(str, [*lead, "tokens", *model]))
            alt = "" if lead else f" (or [tokens, {self.row}] of bytes)"
            raise DestinationRefused(
                f"{what} is {a.shape} of {a.dtype}; {fp.describe()} needs [{want}] of "
                f"{fp.dtype.itemsize}-byte items{alt}: every token would land at a wrong offset"
            )
        return flat.reshape(*lead, -1, self.row)

    def capacity(self) -> int:
        """Tokens it holds from position 0."""
        raise NotImplementedError

    def _array(self, layer: int, kind: int) -> npt.NDArray[np.uint8]:
        """The K (``kind`` 0) or V rows of a layer: ``[slots, row]`` bytes."""
        raise NotImplementedError

    def _runs(self, t0: int, p: int) -> list[tuple[int, int]]:
        """Where tokens ``[t0, t0 + p)`` lie in every layer's K and V rows: ``(first slot,
        tokens)`` of each contiguous run, in token order (the same for every layer and K/V)."""
        return [(t0, p)]

    def _rows(self, layer: int, kind: int, t0: int, p: int) -> list[npt.NDArray[np.uint8]]:
        """The memory of the K (``kind`` 0) or V rows of tokens ``[t0, t0 + p)`` of a layer:
        contiguous runs, in token order."""
        a = self._array(layer, kind)
        return [a[s : s + n].reshape(-1) for s, n in self._runs(t0, p)]

    def page_views(self, t0: int, p: int) -> list[memoryview]:
        """Where the bytes of a stored page of tokens ``[t0, t0 + p)`` go, in their stored order
        (spec F-SEG-4: per layer, K then V, each ``[p, row]``): a scatter read's targets. The
        runs are found once a page and cut from each row array's memoryview (slicing a
        memoryview costs a fraction of a numpy view: a page has ``2 x layers`` of them)."""
        if self._views is None:
            self._views = [
                self._array(layer, kind).reshape(-1).data
                for layer in range(self.layers)
                for kind in (0, 1)
            ]
        row = self.row
        spans = [(s * row, (s + n) * row) for s, n in self._runs(t0, p)]
        return [v[a:b] for v in self._views for a, b in spans]

    def zero(self, token_start: int, n_tokens: int) -> None:
        """Zero the K and V rows of tokens ``[token_start, token_start + n_tokens)``."""
        for layer, kind in itertools.product(range(self.layers), (0, 1)):
            for r in self._rows(layer, kind, token_start, n_tokens):
                r[:] = 0

    def page_runs(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> list[tuple[int, npt.NDArray[np.uint8]]]:
        """See :func:`page_runs`."""
        return page_runs(self.fp, token_start, n_tokens, data, page_tokens)


class LayerKV(_PerToken):
    """``k[layer]`` and ``v[layer]``: arrays ``[max_tokens, n_kv_heads, head_dim]``."""

    def __init__(
        self,
        fp: ModelFingerprint,
        k: Sequence[npt.NDArray[np.generic]],
        v: Sequence[npt.NDArray[np.generic]],
        *,
        read_direct: bool = True,
    ) -> None:
        super().__init__(fp)
        self.read_direct = read_direct
        k, v = _per_layer(k, "LayerKV K"), _per_layer(v, "LayerKV V")
        if len(k) != fp.n_layers or len(v) != fp.n_layers:
            raise DestinationRefused(
                f"LayerKV needs {fp.n_layers} K and V arrays, got {len(k)}, {len(v)}"
            )
        self.k = [self._checked(a, f"LayerKV K[{i}]", ()) for i, a in enumerate(k)]
        self.v = [self._checked(a, f"LayerKV V[{i}]", ()) for i, a in enumerate(v)]
        _refuse_overlaps(
            [
                *((f"LayerKV K[{i}]", a) for i, a in enumerate(self.k)),
                *((f"LayerKV V[{i}]", a) for i, a in enumerate(self.v)),
            ]
        )
        self.max_tokens = int(min(a.shape[0] for a in [*self.k, *self.v]))

    def capacity(self) -> int:
        return self.max_tokens

    def _array(self, layer: int, kind: int) -> npt.NDArray[np.uint8]:
        return (self.v if kind else self.k)[layer]

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        """One strided copy per layer and K/V for all the pages (and one for the short last
        page), spread over the worker threads: never a copy per page."""
        runs = self.page_runs(token_start, n_tokens, data, page_tokens)

        def task(layer: int, kind: int) -> Callable[[], None]:
            dst = (self.v if kind else self.k)[layer]

            def run() -> None:
                for t0, pages in runs:  # [n_pages, p, row] views of this layer's K or V
                    n, p = pages.shape[0], pages.shape[3]
                    dst[t0 : t0 + n * p].reshape(n, p, self.row)[...] = pages[:, layer, kind]

            return run

        parallel_run(
            [task(i, kind) for i in range(self.layers) for kind in (0, 1)], n_tokens * self.tb
        )


class PagedKV(_PerToken):
    """``pools[layer]``: one layer's block pool; token ``t`` lives in block
    ``block_table[t // block_size]`` at slot ``t % block_size``. Two layouts, as vLLM's GPU
    attention backends keep a layer's cache:

    * ``kv_first=True`` (the default): ``[2, num_blocks, block_size, n_kv_heads, head_dim]``,
      the K pool then the V pool (vLLM's FlashAttention backend, SGLang);
    * ``kv_first=False``: ``[num_blocks, 2, block_size, n_kv_heads, head_dim]``, each block
      its K then its V (vLLM's FlashInfer backend).

    A pool of another shape, or whose item size is not the model's, is refused
    (:class:`DestinationRefused`, naming the layout expected); the block table is checked as
    :func:`checked_block_table` says. Either way a token's K and V are rows of the layer's
    flat bytes (:meth:`_slots`), so page views, ``zero`` and ``write_pages`` serve both."""

    def __init__(
        self,
        fp: ModelFingerprint,
        pools: Sequence[npt.NDArray[np.generic]],
        block_table: Sequence[int] | npt.NDArray[np.integer],
        *,
        read_direct: bool = True,
        kv_first: bool = True,
    ) -> None:
        super().__init__(fp)
        self.read_direct = read_direct
        self.kv_first = bool(kv_first)
        pools = _per_layer(pools, "PagedKV pools")
        if len(pools) != fp.n_layers:
            raise DestinationRefused(
                f"PagedKV needs {fp.n_layers} per-layer pools, got {len(pools)}"
            )
        shape: tuple[int, ...] = tuple(getattr(pools[0], "shape", ()))
        pair = 0 if self.kv_first else 1  # the axis of K/V
        if len(shape) != 5 or shape[pair] != 2 or any(p.shape != shape for p in pools):
            raise DestinationRefused(
                f"each PagedKV pool must be {paged_layout(fp, self.kv_first)}, all of one "
                f"shape; pool[0] is {shape}"
            )
        self.num_blocks, self.block_size = shape[1 - pair], shape[2]
        lead = (2, self.num_blocks) if self.kv_first else (self.num_blocks, 2)
        flat = [self._checked(p, f"PagedKV pool[{i}]", lead) for i, p in enumerate(pools)]
        rows = [f.reshape(-1, self.row) for f in flat]  # each layer's rows, K and V alike
        # K rows then V rows of each layer, indexed by the same slot (:meth:`_slots`)
        self.pools = [self._kv_rows(r) for r in rows]
        self.table = checked_block_table(block_table, self.num_blocks, self.block_size)
        self._blocks: list[int] = self.table.tolist()
        _refuse_overlaps([(f"PagedKV pool[{i}]", r) for i, r in enumerate(rows)])

    def _kv_rows(
        self, rows: npt.NDArray[np.uint8]
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        """A layer's ``[rows, row]`` bytes as its K rows and its V rows, both indexed by
        :meth:`_slots`: the two halves (``kv_first``), or the rows and the rows one block on
        (each block its K then its V)."""
        if self.kv_first:
            half = self.num_blocks * self.block_size
            return rows[:half], rows[half:]
        return rows, rows[self.block_size :]

    def capacity(self) -> int:
        return int(self.table.size) * int(self.block_size)

    def _stride(self) -> int:
        """Rows from one block's K rows to the next block's."""
        return self.block_size if self.kv_first else 2 * self.block_size

    def _slots(self, t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The K (and V) row of each token of ``t``."""
        bs = self.block_size
        slots: npt.NDArray[np.int64] = self.table[t // bs] * self._stride() + t % bs
        return slots

    def _array(self, layer: int, kind: int) -> npt.NDArray[np.uint8]:
        return self.pools[layer][kind]

    def _runs(self, t0: int, p: int) -> list[tuple[int, int]]:
        bs, stride, runs = self.block_size, self._stride(), list[tuple[int, int]]()
        t, end = t0, t0 + p
        while t < end:
            n = min(bs - t % bs, end - t)
            slot = self._blocks[t // bs] * stride + t % bs
            if runs and runs[-1][0] + runs[-1][1] == slot:  # the next block follows in memory
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((slot, n))
            t += n
        return runs

    def write_pages(
        self, token_start: int, n_tokens: int, data: npt.NDArray[np.uint8], page_tokens: int
    ) -> None:
        """One scatter (a fancy-indexed assignment over the block table's slots) per layer and
        K/V for all the pages, spread over the worker threads: never a copy per page."""
        runs = []
        for t0, pages in self.page_runs(token_start, n_tokens, data, page_tokens):
            n, p = pages.shape[0], pages.shape[3]
            t = np.arange(t0, t0 + n * p, dtype=np.int64).reshape(n, p)
            runs.append((self._slots(t), pages))

        def task(layer: int, kind: int) -> Callable[[], None]:
            def run() -> None:
                for slots, pages in runs:
                    self.pools[layer][kind][slots] = pages[:, layer, kind]

            return run

        parallel_run(
            [task(i, kind) for i in range(self.layers) for kind in (0, 1)], n_tokens * self.tb
        )


def paged_layout(fp: ModelFingerprint, kv_first: bool) -> str:
    """The shape a block pool of ``fp`` must have, in words (a refusal names it)."""
    dims = f"block_size, {fp.n_kv_heads}, {fp.head_dim}"
    if kv_first:
        return f"[2, num_blocks, {dims}] (kv_first=True: vLLM FlashAttention's, K pool then V)"
    return f"[num_blocks, 2, {dims}] (kv_first=False: vLLM FlashInfer's, each block K then V)"


def _per_layer(arrays: object, what: str) -> list[npt.NDArray[np.generic]]:
    """``arrays`` (a list or tuple of per-layer arrays, or one array or tensor stacked over the
    layers) as a list, one entry a layer; anything else refused by name."""
    seq = cast("Sequence[npt.NDArray[np.generic]]", arrays)
    if not isinstance(arrays, (str, bytes, Mapping)):
        with contextlib.suppress(TypeError, KeyError, IndexError):  # no len, or no seq[i]
            return [seq[i] for i in range(len(seq))]
    raise DestinationRefused(
        f"{what} must be a list of per-layer arrays (or one array stacked over the layers), "
        f"not {type(arrays).__name__}"
    )


def checked_block_table(
    table: object, num_blocks: int, block_size: int, what: str = "the PagedKV block table"
) -> npt.NDArray[np.int64]:
    """``table`` as block ids of a pool of ``num_blocks`` blocks of ``block_size`` tokens,
    refusing (:class:`DestinationRefused`, the message naming ``what``) what would put a token
    at a wrong offset or two tokens in one slot: not a one-dimensional sequence of integers, an
    id outside the pool (a negative one included: numpy would count it from the end), or an id
    given twice (the later token's bytes would overwrite the earlier's: a restore reporting
    success over wrong bytes). Every destination on a block pool checks its table here, when
    it is made."""
    try:
        arr = np.asarray(table)
    except (TypeError, ValueError, RuntimeError) as e:
        raise DestinationRefused(
            f"{what} cannot be read as block ids ({e}); pass a list or 1-D integer array"
        ) from None
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise DestinationRefused(
            f"{what} must be a one-dimensional sequence of integer block ids; "
            f"got shape {arr.shape} of {arr.dtype}"
        )
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= num_blocks):
        bad = next(int(b) for b in arr.tolist() if not 0 <= b < num_blocks)
        raise DestinationRefused(
            f"{what} holds block {bad}; the pool's block ids are 0..{num_blocks - 1}: "
            "pass only blocks of this pool"
        )
    ids, counts = np.unique(arr, return_counts=True)
    if (counts > 1).any():
        j = int(np.flatnonzero(counts > 1)[0])
        at = np.flatnonzero(arr == ids[j])[:2].tolist()
        raise DestinationRefused(
            f"{what} gives block {int(ids[j])} twice (entries {at[0]} and "
            f"{at[1]}): each token needs a slot of its own, or a later token's K/V overwrites "
            f"an earlier one's; pass only this request's distinct blocks, one per {block_size} "
            "tokens"
        )
    return arr.astype(np.int64)


def _refuse_overlaps(arrays: list[tuple[str, npt.NDArray[np.uint8]]]) -> None:
    """Refuse destination arrays that share memory (one array given for two layers, or K and
    V): a restore would write both into one place and report success over wrong bytes."""
    spans = sorted(
        (a.ctypes.data, a.ctypes.data + a.nbytes, name) for name, a in arrays if a.nbytes
    )
    reach, widest = 0, ""  # the furthest end so far, and whose it is
    for start, end, name in spans:
        if start < reach:
            raise DestinationRefused(
                f"{name} overlaps {widest} in memory: a restore would write "
                "both into one place; pass distinct arrays"
            )
        if end > reach:
            reach, widest = end, name


def as_destination(fp: ModelFingerprint, out: object, what: str = "out") -> Destination:
    """Where a restore of ``fp``'s K/V writes: a :class:`Destination` as given (anything with
    ``capacity`` and ``write_pages``, whatever its class; one that says it is made for another
    fingerprint (``fp``), or lives on a device whose page-hash kernel cannot take ``fp``'s
    pages, is refused), a numpy array as a ``read_direct`` :class:`FlatKV` (the stored layout,
    written in place), or device memory (a numba device array, anything with
    ``__cuda_array_interface__``) as a :class:`~.device.DeviceFlatKV`. Anything else, or an
    array that cannot be written in place, raises :class:`DestinationRefused`. A torch tensor
    in host memory is its numpy view (:func:`host_array`)."""
    out = host_array(out, what)
    if isinstance(out, np.ndarray):
        return FlatKV(fp, out, read_direct=True)
    if is_device_array(out):
        from stratastore.restore.device import (
            DeviceFlatKV,  # device memory: validated on the device
        )

        return DeviceFlatKV(fp, out, what)
    if callable(getattr(out, "capacity", None)) and callable(getattr(out, "write_pages", None)):
        made_for = getattr(out, "fp", None)
        if isinstance(made_for, ModelFingerprint) and made_for != fp:
            raise DestinationRefused(
                f"{what} was made for {made_for.describe()}; this store holds "
                f"{fp.describe()}: every token would land at a wrong offset; make the "
                "destination with the store's fingerprint"
            )
        if lives_on_device(out):
            check_device_pages(out, fp)
        return cast(Destination, out)
    raise DestinationRefused(
        f"{what} must be a numpy array, device memory or a restore "
        "Destination (FlatKV, LayerKV, PagedKV, DeviceLayerKV, "
        "DevicePagedKV, or any object with capacity() and write_pages(): "
        f"stratastore.Destination), not {type(out).__name__}"
    )


def page_runs(
    fp: ModelFingerprint,
    token_start: int,
    n_tokens: int,
    data: npt.NDArray[np.uint8],
    page_tokens: int,
) -> list[tuple[int, npt.NDArray[np.uint8]]]:
    """``data`` (the consecutive stored pages of one segment, spec F-SEG-4) as at most two runs
    of equal pages: ``(first token, [n_pages, layers, 2, p, row] view)``, the whole pages and
    then the short last one. Views, never copies: what one strided copy per layer and K/V
    walks, both ways."""
    tb, row = fp.token_bytes, fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize
    full = n_tokens // page_tokens
    runs = []
    if full:
        head = data[: full * page_tokens * tb]
        runs.append((token_start, head.reshape(full, fp.n_layers, 2, page_tokens, row)))
    rest = n_tokens - full * page_tokens
    if rest:
        tail = data[full * page_tokens * tb : n_tokens * tb]
        runs.append((token_start + full * page_tokens, tail.reshape(1, fp.n_layers, 2, rest, row)))
    return runs
