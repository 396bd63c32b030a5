"""Device memory as the store takes it: a numba device array, or any object with
``__cuda_array_interface__`` (a torch CUDA tensor, a CuPy array), wrapped, never copied.

The restore's device destinations (:mod:`stratastore.restore.device`) and the park from device
memory (:mod:`stratastore.tiers.device`) both read device arrays through here, each raising its
own typed error (:class:`~stratastore.restore.DestinationRefused`, :class:`InvalidConversation`)
with the argument and the fix in the message.

Nothing here imports ``numba.cuda`` until a device array is given (it costs seconds on a
CPU-only path). numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, where CI runs the device
path) has no ``as_cuda_array``: there an interface's memory is host memory, which is read in
place as the device would read it.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from stratastore.errors import StrataError

__all__ = ["address", "as_device_array", "device_bytes", "is_device_array"]


def is_device_array(obj: object) -> bool:
    """Whether ``obj`` is device memory: a numba device array (the simulator's too), or an
    object with ``__cuda_array_interface__``. An interface that fails to describe itself (a
    torch bfloat16 tensor raises ``TypeError``) still counts: :func:`as_device_array` refuses
    it with the reason."""
    if isinstance(obj, np.ndarray):
        return False
    if hasattr(obj, "copy_to_host") and hasattr(obj, "is_c_contiguous"):
        return True
    try:
        getattr(obj, "__cuda_array_interface__")  # noqa: B009 - a property that may raise
    except AttributeError:  # a host object (a torch CPU tensor raises AttributeError too)
        return False
    except Exception:
        return True
    return True


def _name(obj: object) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def as_device_array(
    obj: object, what: str, error: type[StrataError], *, writable: bool = False
) -> Any:
    """``obj`` as a numba device array over the same memory (no copy): itself when it is one,
    else through its ``__cuda_array_interface__``. ``error`` (naming ``what``) when numba
    cannot read the interface, or, with ``writable``, when it says the memory is read-only."""
    if hasattr(obj, "copy_to_host") and hasattr(obj, "is_c_contiguous"):
        return obj
    if not is_device_array(obj):
        raise error(
            f"{what} is {_name(obj)}, not device memory (a numba device array, or an "
            "object with __cuda_array_interface__: a torch CUDA tensor, CuPy)"
        )
    from numba import config, cuda

    try:
        readonly = bool(obj.__cuda_array_interface__["data"][1])  # type: ignore[attr-defined]
        if not (writable and readonly):
            wrap: Any = getattr(cuda, "as_cuda_array", None)
            if wrap is not None:
                return wrap(obj)
            if getattr(config, "ENABLE_CUDASIM", False):  # the simulator has no as_cuda_array:
                return _simulated(obj)  # its device memory is host memory
            raise TypeError("numba.cuda has no as_cuda_array")  # pragma: no cover
    except Exception as e:
        raise error(
            f"{what} ({_name(obj)}) has a __cuda_array_interface__ numba cannot read "
            f"({type(e).__name__}: {e}); pass a numba device array, or a view of the same "
            "memory numba reads (torch bfloat16: t.view(torch.int16))"
        ) from None
    raise error(
        f"{what} is read-only device memory; pass a writable tensor (a restore writes "
        "into it in place)"
    )


def _simulated(obj: Any) -> Any:
    """Under numba's CUDA simulator (where device memory is host memory), what
    ``cuda.as_cuda_array`` is on a device: a device array over the memory the interface
    names, not a copy."""
    from numba.cuda.simulator.cudadrv import devicearray

    fake: Any = devicearray.FakeCUDAArray

    iface = obj.__cuda_array_interface__
    if iface.get("mask") is not None:
        raise NotImplementedError("masked arrays are not supported")
    shape, dtype = tuple(int(n) for n in iface["shape"]), np.dtype(iface["typestr"])
    strides = iface.get("strides")
    if strides is not None and any(s < 0 for s in strides):
        raise NotImplementedError(f"negative strides {tuple(strides)}")
    size = int(np.prod(shape))
    if size == 0 or strides is None:
        extent = size * dtype.itemsize
    else:
        extent = dtype.itemsize + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    ptr = int(iface["data"][0])
    buf: Any = (ctypes.c_char * extent).from_address(ptr) if extent else b""
    return fake(np.ndarray(shape, dtype, buffer=buf, strides=strides))


def device_bytes(dev: Any, what: str, error: type[StrataError], fix: str) -> Any:
    """A device array as flat uint8 over the same memory. A non-C-contiguous one, or one of
    object items, is refused with ``error`` (``fix`` says what to pass): the store reads and
    writes device memory in place, never through a gather made behind the caller's back."""
    if not dev.is_c_contiguous():
        raise error(
            f"{what} (a device array {tuple(dev.shape)} of {np.dtype(dev.dtype)}, "
            f"strides {tuple(dev.strides)}) is not C-contiguous; {fix}"
        )
    dtype = np.dtype(dev.dtype)
    if dtype.hasobject or dtype.itemsize == 0:
        raise error(
            f"{what} has dtype {dtype}, which holds no K/V bytes; pass the cache's own "
            "(numeric) array"
        )
    size = int(np.prod(dev.shape))
    if size == 0:
        from numba import cuda

        return cuda.device_array(0, dtype=np.uint8)
    flat = dev.reshape(size) if len(dev.shape) != 1 else dev
    return flat if dtype == np.uint8 else flat.view(np.uint8)


def address(a: Any) -> int:
    """The device address of ``a``'s first byte (a simulated array: its host address)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    # numba's simulated device array wraps numpy memory and answers every ndarray attribute
    # it lacks from that array, ``ctypes`` included
    return int(a.ctypes.data)
