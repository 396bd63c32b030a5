"""``StoreTests``: the shipped abstract test suite (the zarr ``StoreTests`` pattern).

An engine's adapter, or another implementation of the format, subclasses it and implements
:meth:`StoreTests.open_store`; pytest then runs every ``test_*`` method against that store.
The object returned needs the segment-store calls used here: ``root_key``, ``put_kv``,
``get_into``, ``delete``, ``keys``, ``__contains__``, ``close``, and the directory it wrote
must pass :func:`check_conformance`::

    class TestMyStore(StoreTests):
        def open_store(self, path, fingerprint):
            return MyStore.open(path, fingerprint)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stratastore.format import ChecksumMismatch, ModelFingerprint, data_name
from stratastore.testing.conformance import check_conformance

__all__ = ["StoreTests"]


class StoreTests:
    """Subclass it (as ``Test...``) and implement :meth:`open_store`."""

    def open_store(self, path: Path, fingerprint: ModelFingerprint) -> Any:
        raise NotImplementedError("return your store opened on `path` for `fingerprint`")

    def fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint.create(
            "conformance/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4
        )

    def kv(self, n: int, seed: int = 0) -> np.ndarray[Any, Any]:
        fp = self.fingerprint()
        return np.random.default_rng(seed).integers(0, 256, n * fp.token_bytes, dtype=np.uint8)

    def test_put_get_roundtrip(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path, self.fingerprint())
        try:
            data = self.kv(10)
            key = store.put_kv(store.root_key, np.arange(10), data, token_start=0).key
            out = np.zeros_like(data)
            store.get_into(key, out)
            assert np.array_equal(out, data) and key in store
        finally:
            store.close()

    def test_equal_prefixes_are_stored_once(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path, self.fingerprint())
        try:
            a = store.put_kv(store.root_key, [1, 2, 3], self.kv(3), token_start=0)
            b = store.put_kv(store.root_key, [1, 2, 3], self.kv(3), token_start=0)
            assert a.key == b.key and a.created and not b.created and len(store.keys()) == 1
        finally:
            store.close()

    def test_everything_survives_reopening(self, tmp_path: Path) -> None:
        fp = self.fingerprint()
        store = self.open_store(tmp_path, fp)
        keys = [
            store.put_kv(store.root_key, np.arange(5) + 10 * i, self.kv(5, i), token_start=0).key
            for i in range(4)
        ]
        store.delete(keys[0])
        store.close()
        store = self.open_store(tmp_path, fp)
        try:
            assert sorted(store.keys()) == sorted(keys[1:])
        finally:
            store.close()

    def test_a_damaged_page_is_refused(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path, self.fingerprint())
        try:
            key = store.put_kv(store.root_key, np.arange(12), self.kv(12), token_start=0).key
            path = tmp_path / data_name(key)
            raw = bytearray(path.read_bytes())
            raw[-1] ^= 1
            path.write_bytes(bytes(raw))
            try:
                store.get_into(key, np.zeros(12 * self.fingerprint().token_bytes, np.uint8))
            except ChecksumMismatch as e:
                assert e.page == 2
            else:
                raise AssertionError("a damaged page was returned")
        finally:
            store.close()

    def test_what_it_writes_conforms(self, tmp_path: Path) -> None:
        store = self.open_store(tmp_path, self.fingerprint())
        try:
            parent = store.root_key
            for i in range(3):
                parent = store.put_kv(
                    parent, np.arange(7) + 7 * i, self.kv(7, i), token_start=7 * i
                ).key
        finally:
            store.close()
        report = check_conformance([str(tmp_path)])
        assert report.conforms, report.violations
