"""``Store.restore`` / ``restore_many`` take device memory by asking ``hasattr(out,
"__cuda_array_interface__")`` (``as_destination``). ``hasattr`` swallows only ``AttributeError``,
and a torch CUDA tensor's interface property raises others: ``TypeError`` or ``KeyError`` for
bfloat16 on torch versions whose interface has no typestr for it, and ``RuntimeError`` for a tensor
that requires grad. Those escape the Store as bare exceptions, where ``Store.park`` (which goes
through ``is_device_array``/``as_device_array``) turns the same objects into a typed error naming
the object and the fix. The contract: bad input gets a typed StrataError subclass raised by the call
that caused it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Store
from stratastore.errors import StrataError
from stratastore.restore import DestinationRefused
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


class _Bfloat16Tensor:
    """What a torch bfloat16 CUDA tensor shows: an interface property that raises TypeError."""

    @property
    def __cuda_array_interface__(self) -> Any:
        raise TypeError("Got unsupported ScalarType BFloat16")


class _OldTorchBfloat16Tensor:
    """torch before ``_dtype_to_typestr``: a dict lookup of the dtype, a KeyError for bfloat16."""

    @property
    def __cuda_array_interface__(self) -> Any:
        raise KeyError("torch.bfloat16")


class _GradTensor:
    """What a torch CUDA tensor that requires grad shows: the property raises RuntimeError."""

    @property
    def __cuda_array_interface__(self) -> Any:
        raise RuntimeError(
            "Can't get __cuda_array_interface__ on Variable that requires grad. "
            "If gradients aren't required, use var.detach() to get Variable "
            "that doesn't require grad."
        )


def _store(tmp_path: Path) -> Store:
    store = Store.open(
        FP, {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    )
    conv, kv = conversation_kv("a", 16, 0)
    store.park(conv, kv.copy())
    store.flush()
    return store


@pytest.mark.parametrize("tensor", [_Bfloat16Tensor, _OldTorchBfloat16Tensor, _GradTensor])
def test_restore_into_a_tensor_whose_interface_raises_is_refused_typed(
    tmp_path: Path, tensor: type
) -> None:
    with _store(tmp_path) as store:
        prompt = np.arange(16)
        with pytest.raises(DestinationRefused, match="__cuda_array_interface__"):
            store.restore(prompt, tensor())
        with pytest.raises(StrataError):
            store.restore_many(
                [(prompt, np.zeros(16 * FP.token_bytes, np.uint8)), (prompt, tensor())]
            )
        assert store.lookup(prompt) == ("disk", 16)  # nothing was taken or damaged
