"""What a restore can write in place: the caller's memory as a flat uint8 view, never a copy.
A numpy array is taken as it is; a torch tensor in host memory as the numpy array over its own
memory; anything that cannot be written in place is refused with
:class:`DestinationRefused` before a restore touches anything."""

from __future__ import annotations

import sys
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from stratastore.errors import ConfigError

__all__ = ["DestinationRefused", "flat_bytes", "host_array", "is_torch_tensor"]


class DestinationRefused(ConfigError):
    """A restore destination that cannot be written in place, or whose geometry does not match
    the model: refused before anything is read, written, taken or released."""


_UINT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def is_torch_tensor(a: object) -> bool:
    """Whether ``a`` is a torch tensor (a subclass too: ``nn.Parameter``), torch not imported
    for the question."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor)


def host_array(a: object, what: str) -> object:
    """``a`` itself, or for a torch tensor in host memory the numpy array over its own memory
    (``Tensor.numpy()``, which shares it; a dtype numpy lacks, bfloat16 or a float8, through
    ``Tensor.view`` as the integer of its item size: a restore writes bytes, whatever they
    mean). A tensor on a device is refused: its memory is the device twins' to write; so is one
    whose memory numpy cannot view as it is (sparse, nested, a lazy conjugate or negation)."""
    if not is_torch_tensor(a):
        return a
    t = cast("Any", a)
    if t.device.type != "cpu":
        raise DestinationRefused(
            f"{what} is a torch tensor on {t.device}; restore into device memory with "
            "DeviceLayerKV/DevicePagedKV or a bare device array (stratastore.restore.device)"
        )
    t = t.detach()
    try:
        try:
            out: object = t.numpy()
        except TypeError:  # a dtype numpy has no name for
            kind = _UINT_OF_SIZE.get(t.element_size())
            if kind is None:
                raise DestinationRefused(
                    f"{what} is a torch tensor of {t.dtype}; pass one of 1, 2, 4 or 8-byte items"
                ) from None
            out = t.view(getattr(sys.modules["torch"], kind)).numpy()
    except (RuntimeError, NotImplementedError, TypeError) as e:
        raise DestinationRefused(
            f"{what} is a torch tensor ({t.dtype}, layout {t.layout}) whose memory cannot be "
            f"viewed as it is ({str(e).splitlines()[0]}); pass a plain strided tensor "
            "(t.resolve_conj().resolve_neg(), t.to_dense()) the engine keeps"
        ) from None
    return out


def flat_bytes(a: object, what: str) -> npt.NDArray[np.uint8]:
    """The bytes of ``a`` as a flat uint8 *view* (never a copy: a restore writes the caller's
    memory or refuses). Raises :class:`DestinationRefused` for anything but a writable,
    C-contiguous numpy array of plain (non-object) items, or a torch tensor in host memory
    (:func:`host_array`); ``what`` names it in the message."""
    a = host_array(a, what)
    if not isinstance(a, np.ndarray):
        raise DestinationRefused(
            f"{what} must be a numpy array or a restore Destination, not {type(a).__name__}"
        )
    if a.dtype.hasobject:
        raise DestinationRefused(
            f"{what} has dtype {a.dtype}, which holds references, not "
            "bytes; pass a uint8 (or the model's dtype) array"
        )
    if not a.flags.writeable:
        raise DestinationRefused(
            f"{what} is read-only; pass a writable array (a restore writes into it in place)"
        )
    if not a.flags.c_contiguous:
        order = "Fortran-ordered" if a.flags.f_contiguous else "not contiguous"
        raise DestinationRefused(
            f"{what} is {order} (shape {a.shape}, strides {a.strides}): a restore writes the "
            "stored layout in place, so it needs a C-contiguous array; restore into "
            "np.empty(shape, dtype) and copy it, or pass np.ascontiguousarray(x) and use that"
        )
    flat = a.reshape(-1)  # C-contiguous: a view of the same memory
    assert flat.size == 0 or np.shares_memory(flat[:1], a), "reshape copied a contiguous array"
    return flat.view(np.uint8)
