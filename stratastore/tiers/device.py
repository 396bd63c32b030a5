"""Parks from device memory: the K/V of a conversation still on the GPU.

:func:`device_snapshot` takes a numba device array, or any object with
``__cuda_array_interface__`` (a torch CUDA tensor, a CuPy array: wrapped, never copied, by
:func:`numba.cuda.as_cuda_array`), checks it and the conversation as a host park is checked
(:func:`~stratastore.tiers.checks.check_snapshot`) before the device does anything, hashes
each segment's pages on the device (:func:`numba_kernels.cuda.page_hashes_device`: BLAKE3,
bit-exact with the host's), then copies the whole K/V to the host once, into the buffer the
capture keeps. The snapshot carries the digests (:attr:`Snapshot.page_hashes`): the disk
writer puts them in the sidecars as they are, so the capture is never hashed on the host.

A device array the store cannot copy whole and as is (not C-contiguous, an interface numba
cannot read) is refused with :class:`InvalidConversation` naming it and the fix: a copy made
here to make it contiguous would hide the caller's layout and double the device memory.

Nothing here imports ``numba.cuda`` until a device array is parked (it costs seconds on a
CPU-only path).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from stratastore.chain import Conversation
from stratastore.format import ModelFingerprint
from stratastore.restore.device_arrays import as_device_array, device_bytes, is_device_array
from stratastore.restore.in_place import DestinationRefused, host_array, is_torch_tensor
from stratastore.tiers.checks import check_snapshot
from stratastore.tiers.records import InvalidConversation, Snapshot

__all__ = ["device_snapshot", "device_to_host", "kv_bytes"]


_CONTIGUOUS_FIX = (
    "the store copies a capture to the host whole, once: pass a contiguous array "
    "(torch: kv.contiguous(); CuPy: cupy.ascontiguousarray(kv))"
)


def _flat(kv: object, what: str) -> Any:
    """``kv`` (device memory) as flat device bytes, or :class:`InvalidConversation`."""
    dev = as_device_array(kv, f"{what}: kv", InvalidConversation)
    return device_bytes(dev, f"{what}: kv", InvalidConversation, _CONTIGUOUS_FIX)


def device_to_host(kv: object, what: str) -> npt.NDArray[np.uint8]:
    """The bytes of a device array, copied to the host once (checked as
    :func:`device_bytes` says); not hashed."""
    flat = _flat(kv, what)
    host = np.empty(int(flat.shape[0]), dtype=np.uint8)
    if host.size:
        flat.copy_to_host(host)
    return host


def device_snapshot(
    conv: Conversation,
    kv: object,
    states: Mapping[int, bytes],
    fp: ModelFingerprint,
    call: str = "park",
) -> Snapshot:
    """The snapshot of a park from device memory: ``kv`` checked (layout, then with ``conv``
    as every park is: :func:`check_snapshot`, its size among them) before the device does
    anything; each segment of ``conv`` (:meth:`~stratastore.chain.Conversation.boundaries`,
    the segments the disk writer cuts, pages counted from each one's start) hashed on the
    device; then the whole K/V copied to the host once, into the snapshot's own buffer.
    ``page_hashes`` holds the digests by segment: a disk write of these bytes (now, or of the
    RAM level's copy later) puts them in the sidecars and hashes nothing."""
    from numba_kernels.cuda import MAX_PAGE_BYTES, page_hashes_device

    if fp.page_bytes > MAX_PAGE_BYTES:
        raise InvalidConversation(
            f"{call}: {fp.describe()} has pages of {fp.page_bytes:,} bytes; the device's "
            f"page-hash kernel takes at most {MAX_PAGE_BYTES:,}: park from host memory, or use "
            "a model fingerprint with fewer page_tokens"
        )
    flat = _flat(kv, call)
    host = np.empty(int(flat.shape[0]), dtype=np.uint8)  # the capture's buffer, filled below
    snap = Snapshot(conv, host, dict(states))
    check_snapshot(snap, fp, call)
    tb = fp.token_bytes
    snap.page_hashes = {
        (s, e): page_hashes_device(flat[s * tb : e * tb], (e - s) * tb, fp.page_bytes)
        for s, e in conv.boundaries()
    }
    if host.size:
        flat.copy_to_host(host)
    return snap


def kv_bytes(kv: object, what: str) -> npt.NDArray[np.uint8]:
    """The bytes of a capture to park or save (a copy where ``kv`` is not contiguous). A
    device array (a session saved from the GPU) is copied to the host once, unhashed: its
    pages are hashed as they are written (a park hashes on the device instead:
    :func:`~stratastore.tiers.device.device_snapshot`)."""
    if is_device_array(kv):
        return device_to_host(kv, what)
    if is_torch_tensor(kv) and cast("Any", kv).device.type == "cpu":
        try:  # the tensor's own memory, as a numpy array's
            kv = host_array(kv, f"{what}: kv")
        except DestinationRefused as e:
            raise InvalidConversation(str(e)) from None
    if not isinstance(kv, np.ndarray):
        raise InvalidConversation(
            f"{what}: kv must be a numpy array, a device array (a numba device array, or one "
            "with __cuda_array_interface__: a torch CUDA tensor, CuPy), or for a park the "
            f"engine's layout (LayerKV, PagedKV); got {type(kv).__name__}"
        )
    if kv.dtype.hasobject:
        raise InvalidConversation(
            f"{what}: kv has dtype {kv.dtype}, which holds references, not K/V bytes; pass "
            "the cache's own (numeric) array"
        )
    return kv.reshape(-1).view(np.uint8)
