"""A keyed level (spec F-KEYED-7) in device memory, in numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1, set by tests/conftest.py): the kernels hash plain BLAKE3, so a park
from the device has its device digests dropped and its pages hashed keyed on the host, and a
restore into device memory hashes its host staging keyed before the copy: it restores whole,
and pages a writer without the key planted never reach the device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import cuda

from stratastore.format import decode_sidecar, sidecar_name
from stratastore.format.level_key import derive_key, key_id_of
from tests.conftest import conversation_kv
from tests.unit.levels.test_keyed_directory_level import (
    FP,
    SECRET1,
    TB,
    key_file,
    open_store,
    park_and_flush,
    plant_unkeyed,
)


def test_a_device_park_into_a_keyed_level_is_keyed_and_restores_into_the_device(
    tmp_path: Path,
) -> None:
    kf = key_file(tmp_path, SECRET1)
    conv, kv = conversation_kv("g", 48, 300)
    with open_store(tmp_path, kf) as store:
        store.park(conv, cuda.to_device(kv))
        store.flush()
        dout = cuda.to_device(np.full(48 * TB, 0xEE, np.uint8))
        assert store.restore(conv.tokens, dout).tokens == 48
        assert np.array_equal(dout.copy_to_host(), kv)
    for _, _, key in conv.segments(FP.digest()):
        raw = (tmp_path / "shared" / sidecar_name(key)).read_bytes()
        assert decode_sidecar(raw, unchecked=True).key_id == key_id_of(derive_key(SECRET1))


def test_planted_pages_never_reach_the_device(tmp_path: Path) -> None:
    kf = key_file(tmp_path, SECRET1)
    with open_store(tmp_path, kf) as store:
        conv, kv = park_and_flush(store, "c", 48, 100)
    plant_unkeyed(tmp_path / "shared", conv, kv, 1)
    with open_store(tmp_path, kf) as store:
        dout = cuda.to_device(np.full(48 * TB, 0xEE, np.uint8))
        assert store.restore(conv.tokens, dout).tokens == 16
        got = dout.copy_to_host()
        assert np.array_equal(got[: 16 * TB], kv[: 16 * TB])
        assert not (got[16 * TB :] == 0x5A).any()  # not one planted byte
