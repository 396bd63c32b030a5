"""Device destinations: a restore straight into GPU memory, validated on the GPU.

:meth:`Store.restore <stratastore.Store.restore>` takes device memory as it takes host memory:
a numba device array, or any object with ``__cuda_array_interface__`` (a torch CUDA tensor, a
CuPy array), as

* :class:`DeviceFlatKV`: one buffer in the stored layout (what a bare device array becomes);
* :class:`DeviceLayerKV`: per-layer K and V arrays ``[max_tokens, n_kv_heads, head_dim]``;
* :class:`DevicePagedKV`: per-layer pools addressed through a block table, ``[2, num_blocks,
  block_size, n_kv_heads, head_dim]`` (vLLM's FlashAttention backend, SGLang) or, with
  ``kv_first=False``, ``[num_blocks, 2, block_size, n_kv_heads, head_dim]`` (vLLM's
  FlashInfer backend).

The path of a disk chunk (:meth:`~stratastore.restore.two_pass.Job.chunks`): its pages are read
into pinned host staging (a pool that keeps a few chunks' worth for reuse), copied to device
staging asynchronously on a stream, hashed there by the ``page_hash`` kernel, compared with the
sidecar's digests by the ``first_bad`` kernel (one integer comes back to the host), and the
apply pass then copies the validated pages, and only those, from that same device staging into
the destination (one ``scatter_rows`` launch per layer, a device-to-device copy for the flat
layout). The host never hashes; no byte past the first bad page reaches the destination; the
contract, the ladder and the typed errors are the host path's (:mod:`.two_pass`). A RAM hit or a
park in flight is the engine's own bytes: copied to the device and scattered, with nothing to
validate.

The per-token destinations (:class:`DeviceLayerKV`, :class:`DevicePagedKV`) are also what
:meth:`Store.park <stratastore.Store.park>` takes from device memory in the engine's layout:
``gather_pages_device`` gathers the capture into the stored layout on the device (the
``gather_rows`` kernel, the inverse of ``scatter_rows``), where it is hashed and copied to the
host once (:func:`stratastore.tiers.device.device_snapshot`).

A keyed level's segments (spec F-KEYED: BLAKE3's keyed mode) are hashed on the host instead:
the kernels hash plain BLAKE3 only. A restore hashes the pinned staging before copying its
valid prefix to the device (:func:`stage_and_validate` with ``key``), and a keyed level drops
a park's digests from the device and hashes the pages it writes itself.

Nothing here imports ``numba.cuda`` until a device array is given: a host-only engine never
pays for it. Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``: CI, no GPU) the same code
runs on simulated device arrays, which is how it is tested bit-exact against the host path.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

import numba_kernels
from stratastore.format import ModelFingerprint
from stratastore.levels.staging import StagingPool
from stratastore.restore.capabilities import check_device_pages
from stratastore.restore.destinations import DestinationRefused
from stratastore.restore.device_arrays import address, as_device_array, device_bytes

__all__ = [
    "DeviceDestination",
    "DeviceFlatKV",
    "DeviceLayerKV",
    "DevicePagedKV",
    "device_staging",
    "stage_and_validate",
]

#: idle staging kept for reuse, on the host (pinned) and on the device: a few chunks
_KEEP_BYTES = 64 << 20
_pools: dict[str, StagingPool] = {}
_pools_lock = threading.Lock()


_CONTIGUOUS_FIX = (
    "a restore writes the stored layout in place: pass a contiguous tensor "
    "(.contiguous()) and use that"
)


def _device_bytes(a: object, what: str) -> Any:
    """``a`` (writable device memory, C-contiguous) as flat device bytes, or
    :class:`DestinationRefused`."""
    dev = as_device_array(a, what, DestinationRefused, writable=True)
    return device_bytes(dev, what, DestinationRefused, _CONTIGUOUS_FIX)


def device_staging(kind: str) -> StagingPool:
    """The process's bounded pool of ``"pinned"`` host or ``"device"`` staging buffers."""
    with _pools_lock:
        pool = _pools.get(kind)
        if pool is None:
            from numba import cuda

            alloc = cuda.pinned_array if kind == "pinned" else cuda.device_array
            pool = _pools[kind] = StagingPool(_KEEP_BYTES, alloc=lambda n: alloc(n, dtype=np.uint8))
        return pool


def stage_and_validate(
    host: npt.NDArray[np.uint8],
    dev: Any,
    expected: npt.NDArray[np.uint8],
    page_bytes: int,
    key: bytes | None = None,
) -> int:
    """Copy ``host`` (pages read from a segment, pinned when it can be) into ``dev`` (device
    staging of the same size) on a stream of its own, hash its pages there (``page_hash``) and
    compare them with ``expected`` (the sidecar's ``(pages, 32)`` digests, ``first_bad``).
    Returns the first page whose digest differs, or -1; the host hashes nothing.

    ``key``: a keyed level's segment (spec F-KEYED). The kernels hash plain BLAKE3 only, so its
    pages are hashed on the host, in ``host`` (memory the restore owns), before the copy: the
    bytes hashed are the bytes copied, and only the valid prefix is copied."""
    from numba import cuda

    if key is not None:
        actual = numba_kernels.page_hashes(host, page_bytes, key=key)
        bad = numba_kernels.first_bad_page(actual, expected[: actual.shape[0]])
        good = host.size if bad < 0 else bad * page_bytes
        if good:
            dev[:good].copy_to_device(host[:good])
        return bad

    from numba_kernels.cuda import first_bad_device, page_hash_words

    stream = cuda.stream()
    n = int(host.size)
    dev.copy_to_device(host, stream=stream)
    words = page_hash_words(dev, n, page_bytes, stream=stream)
    want = cuda.to_device(np.ascontiguousarray(expected).view("<u4").reshape(-1, 8), stream=stream)
    return first_bad_device(words, want, stream=stream)


class DeviceDestination:
    """What the device destinations of this module share (an implementation, not a type the
    restore asks for): the model's geometry, ``write_pages`` and ``zero`` on the device. The
    read pass takes its device path (:func:`stage_and_validate`) for ``on_device = True``, the
    :class:`~.capabilities.OnDevice` capability, whatever the class."""

    on_device = True
    read_direct = False

    def __init__(self, fp: ModelFingerprint) -> None:
        check_device_pages(self, fp)
        self.fp = fp
        self._stream: Any = None
        self.layers = fp.n_layers
        self.row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize  # bytes of one token's K
        self.tb = fp.token_bytes

    def capacity(self) -> int:
        raise NotImplementedError

    @property
    def stream(self) -> Any:
        """The stream this destination's copies and zeroing run on (made on first use)."""
        if self._stream is None:
            from numba import cuda

            self._stream = cuda.stream()
        return self._stream

    def _on_device(self, data: Any, nbytes: int) -> tuple[Any, Any]:
        """``data`` on the device: as given, or (host bytes: a RAM hit, a park in flight)
        copied into device staging, which the caller gives back (the second item)."""
        if hasattr(data, "copy_to_host"):
            return data, None
        pool = device_staging("device")
        staging: Any = pool.take(nbytes)
        staging[:nbytes].copy_to_device(np.ascontiguousarray(data[:nbytes]), stream=self.stream)
        return staging[:nbytes], staging

    def write_pages(self, token_start: int, n_tokens: int, data: Any, page_tokens: int) -> None:
        """Write ``n_tokens`` tokens from ``token_start``, given as consecutive stored pages of
        ``page_tokens`` in device memory (validated staging) or host memory (a capture). The
        copies have ended when this returns (its stream is synchronized, not the device): the
        staging they read can be reused and the engine reads whole bytes on any stream."""
        if n_tokens <= 0:
            return
        src, staging = self._on_device(data, n_tokens * self.tb)
        try:
            self._write(token_start, n_tokens, src, page_tokens)
        finally:
            self.stream.synchronize()
            if staging is not None:
                device_staging("device").give(staging)

    def _write(self, token_start: int, n_tokens: int, src: Any, page_tokens: int) -> None:
        raise NotImplementedError

    def zero(self, token_start: int, n_tokens: int) -> None:
        raise NotImplementedError


class DeviceFlatKV(DeviceDestination):
    """The stored layout in one device buffer (any dtype, C-contiguous): a segment's pages at
    ``start * token_bytes``, as :class:`~stratastore.restore.FlatKV` on the host."""

    def __init__(
        self, fp: ModelFingerprint, buf: object, what: str = "the device K/V buffer"
    ) -> None:
        super().__init__(fp)
        self.buf = _device_bytes(buf, what)

    def capacity(self) -> int:
        return int(self.buf.shape[0]) // self.tb

    def _write(self, token_start: int, n_tokens: int, src: Any, page_tokens: int) -> None:
        a, n = token_start * self.tb, n_tokens * self.tb
        self.buf[a : a + n].copy_to_device(src[:n], stream=self.stream)

    def zero(self, token_start: int, n_tokens: int) -> None:
        from numba_kernels.cuda import zero_rows_device

        if n_tokens > 0:
            rows = self.buf[: self.capacity() * self.tb]
            tokens = _rows_on_device(np.arange(token_start, token_start + n_tokens), self.stream)
            zero_rows_device(rows, self.tb, tokens, stream=self.stream)
            self.stream.synchronize()


class _DevicePerToken(DeviceDestination):
    """Destinations addressed a row (one token's K or V of one layer) at a time."""

    def _arrays(self, a: object, what: str, lead: tuple[int, ...]) -> Any:
        """``a`` as flat device bytes after checking it is ``[*lead, tokens, n_kv_heads,
        head_dim]`` of the model's item size."""
        arr = as_device_array(a, what, DestinationRefused, writable=True)
        fp, k = self.fp, len(lead)
        shape = tuple(int(x) for x in arr.shape)
        model = (fp.n_kv_heads, fp.head_dim)
        item = np.dtype(arr.dtype).itemsize
        fits = len(shape) == k + 3 and shape[k + 1 :] == model and item == fp.dtype.itemsize
        fits = fits or (not lead and len(shape) == 2 and shape[1] == self.row and item == 1)
        if not fits or shape[:k] != lead:
            want = ", ".join(map(str, [*lead, "tokens", *model]))
            alt = "" if lead else f" (or [tokens, {self.row}] of bytes)"
            raise DestinationRefused(
                f"{what} is {shape} of {np.dtype(arr.dtype)}; {fp.describe()} needs [{want}] of "
                f"{fp.dtype.itemsize}-byte items{alt}: every token would land at a wrong offset"
            )
        return _device_bytes(arr, what)

    def _pairs(self) -> list[tuple[Any, Any]]:
        """Each layer's (K rows, V rows), as flat device bytes."""
        raise NotImplementedError

    def _slots(self, token_start: int, n_tokens: int) -> npt.NDArray[np.int64]:
        """The rows of tokens ``[token_start, token_start + n_tokens)``."""
        raise NotImplementedError

    def _write(self, token_start: int, n_tokens: int, src: Any, page_tokens: int) -> None:
        from numba_kernels.cuda import scatter_rows_device

        slots = _rows_on_device(self._slots(token_start, n_tokens), self.stream)
        for layer, (k, v) in enumerate(self._pairs()):
            scatter_rows_device(
                src,
                n_tokens,
                page_tokens,
                self.layers,
                self.row,
                layer,
                k,
                v,
                slots,
                stream=self.stream,
            )

    def gather_pages_device(self, bounds: Sequence[tuple[int, int]]) -> Any:
        """A new device ``uint8`` array of tokens ``[0, end)`` (``end``: the last segment's)
        in the stored layout of a capture cut into the segments ``bounds`` (the
        conversation's ``(start, end)`` :meth:`~stratastore.chain.Conversation.boundaries`,
        ascending from 0 without gaps): segment ``(start, end)`` at ``[start * token_bytes,
        end * token_bytes)``, its pages of ``page_tokens`` counted from ``start``, its last
        page possibly short (spec F-SEG-4). The inverse of ``write_pages``, on the device:
        one ``gather_rows`` launch per segment and layer; done (its stream synchronized) when
        this returns. Device memory: the returned copy of the capture, ``end *
        token_bytes`` bytes, and its slot ids (8 bytes a token). Bounds that are not such
        segments, or that reach past :meth:`capacity`, are refused with
        :class:`DestinationRefused` before anything runs."""
        from numba import cuda

        from numba_kernels.cuda import gather_rows_device

        spans = [(int(a), int(b)) for a, b in bounds]
        starts, ends = [a for a, _ in spans], [b for _, b in spans]
        n = ends[-1] if ends else 0
        if spans and (starts != [0, *ends[:-1]] or any(a >= b for a, b in spans)):
            raise DestinationRefused(
                f"{type(self).__name__}.gather_pages_device: segments {spans[:8]} must ascend "
                "from token 0, each ending where the next starts (a conversation's "
                "boundaries())"
            )
        if n > self.capacity():
            raise DestinationRefused(
                f"{type(self).__name__} holds {self.capacity():,} tokens; a gather of {n:,} "
                "reads past it: pass the block table (or arrays) of all of them"
            )
        out = cuda.device_array(n * self.tb, dtype=np.uint8, stream=self.stream)
        if not n:
            return out
        slots = _rows_on_device(self._slots(0, n), self.stream)
        pt = self.fp.page_tokens
        for a, b in spans:
            for layer, (k, v) in enumerate(self._pairs()):
                gather_rows_device(
                    out[a * self.tb : b * self.tb],
                    b - a,
                    pt,
                    self.layers,
                    self.row,
                    layer,
                    k,
                    v,
                    slots[a:b],
                    stream=self.stream,
                )
        self.stream.synchronize()
        return out

    def zero(self, token_start: int, n_tokens: int) -> None:
        from numba_kernels.cuda import zero_rows_device

        if n_tokens <= 0:
            return
        slots = _rows_on_device(self._slots(token_start, n_tokens), self.stream)
        for k, v in self._pairs():
            zero_rows_device(k, self.row, slots, stream=self.stream)
            zero_rows_device(v, self.row, slots, stream=self.stream)
        self.stream.synchronize()


class DeviceLayerKV(_DevicePerToken):
    """``k[layer]`` and ``v[layer]``: device arrays ``[max_tokens, n_kv_heads, head_dim]`` (a
    contiguous cache on the GPU), as :class:`~stratastore.restore.LayerKV` on the host."""

    def __init__(self, fp: ModelFingerprint, k: Sequence[object], v: Sequence[object]) -> None:
        super().__init__(fp)
        if len(k) != fp.n_layers or len(v) != fp.n_layers:
            raise DestinationRefused(
                f"DeviceLayerKV needs {fp.n_layers} K and V arrays, got {len(k)}, {len(v)}"
            )
        self.k = [self._arrays(a, f"DeviceLayerKV K[{i}]", ()) for i, a in enumerate(k)]
        self.v = [self._arrays(a, f"DeviceLayerKV V[{i}]", ()) for i, a in enumerate(v)]
        _refuse_overlaps(
            [
                (f"DeviceLayerKV {kind}[{i}]", a)
                for kind, arrays in (("K", self.k), ("V", self.v))
                for i, a in enumerate(arrays)
            ]
        )
        self.max_tokens = min(int(a.shape[0]) // self.row for a in [*self.k, *self.v])

    def capacity(self) -> int:
        return self.max_tokens

    def _pairs(self) -> list[tuple[Any, Any]]:
        return list(zip(self.k, self.v, strict=True))

    def _slots(self, token_start: int, n_tokens: int) -> npt.NDArray[np.int64]:
        return np.arange(token_start, token_start + n_tokens, dtype=np.int64)


class DevicePagedKV(_DevicePerToken):
    """``pools[layer]``: one layer's block pool on the device; token ``t`` lives in block
    ``block_table[t // block_size]`` at slot ``t % block_size``, as
    :class:`~stratastore.restore.PagedKV` on the host (the same layouts, the same shape and
    block-table checks, the same typed refusals). Two layouts, as vLLM's GPU attention
    backends keep a layer's cache (one CUDA tensor a layer):

    * ``kv_first=True`` (the default): ``[2, num_blocks, block_size, n_kv_heads, head_dim]``,
      the K pool then the V pool (vLLM's FlashAttention backend, SGLang);
    * ``kv_first=False``: ``[num_blocks, 2, block_size, n_kv_heads, head_dim]``, each block
      its K then its V (vLLM's FlashInfer backend).

    Either way a token's K and its V are rows of the layer's flat bytes: with ``kv_first``,
    row ``slot`` of the K half and of the V half (``slot = block * block_size + t %
    block_size``); without, rows ``block * 2 * block_size + t % block_size`` and that plus
    ``block_size``, so K is the flat bytes and V the same bytes from row ``block_size`` on,
    both indexed by one slot: the ``scatter_rows``, ``gather_rows`` and ``zero_rows`` kernels
    serve both layouts unchanged (distinct layers are checked not to overlap; K and V of one
    layer share memory by design).

    A restore writes into it (``write_pages``, ``zero``); a park reads from it:
    ``Store.park(conv, DevicePagedKV(fp, pools, block_table, kv_first=...))`` gathers the
    conversation's tokens into the stored layout on the device
    (:meth:`gather_pages_device`, each segment's pages counted from its start), hashes them
    there and copies them to the host once; the device holds one gathered copy of the capture
    meanwhile, freed when the park returns."""

    def __init__(
        self,
        fp: ModelFingerprint,
        pools: Sequence[object],
        block_table: Sequence[int] | npt.NDArray[np.integer],
        *,
        kv_first: bool = True,
    ) -> None:
        from stratastore.restore.destinations import checked_block_table, paged_layout

        super().__init__(fp)
        self.kv_first = bool(kv_first)
        if len(pools) != fp.n_layers:
            raise DestinationRefused(
                f"DevicePagedKV needs {fp.n_layers} per-layer pools, got {len(pools)}"
            )
        arrays = [
            as_device_array(p, f"DevicePagedKV pool[{i}]", DestinationRefused, writable=True)
            for i, p in enumerate(pools)
        ]
        shape = tuple(int(x) for x in arrays[0].shape) if arrays else ()
        pair = 0 if self.kv_first else 1  # the axis of K/V
        if len(shape) != 5 or shape[pair] != 2 or any(tuple(a.shape) != shape for a in arrays):
            raise DestinationRefused(
                f"each DevicePagedKV pool must be {paged_layout(fp, self.kv_first)}, all of "
                f"one shape; pool[0] is {shape}"
            )
        self.num_blocks, self.block_size = shape[1 - pair], shape[2]
        lead = (2, self.num_blocks) if self.kv_first else (self.num_blocks, 2)
        flat = [self._arrays(a, f"DevicePagedKV pool[{i}]", lead) for i, a in enumerate(arrays)]
        if self.kv_first:
            half = self.num_blocks * self.block_size * self.row
            self.pools = [(f[:half], f[half:]) for f in flat]  # K and V of each layer
        else:  # V rows are K's rows one block on: both indexed by :meth:`_slots`
            self.pools = [(f, f[self.block_size * self.row :]) for f in flat]
        self.table = checked_block_table(
            block_table, self.num_blocks, self.block_size, "the DevicePagedKV block table"
        )
        _refuse_overlaps([(f"DevicePagedKV pool[{i}]", f) for i, f in enumerate(flat)])

    def capacity(self) -> int:
        return int(self.table.size) * int(self.block_size)

    def _pairs(self) -> list[tuple[Any, Any]]:
        return self.pools

    def _slots(self, token_start: int, n_tokens: int) -> npt.NDArray[np.int64]:
        bs = self.block_size
        stride = bs if self.kv_first else 2 * bs
        t = np.arange(token_start, token_start + n_tokens, dtype=np.int64)
        slots: npt.NDArray[np.int64] = self.table[t // bs] * stride + t % bs
        return slots


def _rows_on_device(rows: npt.NDArray[np.int64], stream: Any) -> Any:
    """Row ids (a few bytes a token) on the device, copied on ``stream``."""
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(rows, dtype=np.int64), stream=stream)


def _refuse_overlaps(arrays: list[tuple[str, Any]]) -> None:
    """Refuse device arrays that share memory (one tensor given for two layers, or K and V)."""
    spans = sorted(
        (address(a), address(a) + int(a.shape[0]), name) for name, a in arrays if int(a.shape[0])
    )
    reach, widest = 0, ""
    for start, end, name in spans:
        if start < reach:
            raise DestinationRefused(
                f"{name} overlaps {widest} in device memory: a restore "
                "would write both into one place; pass distinct "
                "tensors"
            )
        if end > reach:
            reach, widest = end, name
