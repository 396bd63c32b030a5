"""The backend suite's tests of moving segments between levels (``put_sealed``, relocation, in
both directions with the directory store) and of threads and persistence; part of
:class:`~stratastore.testing.BackendTests`."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from stratastore.errors import StrataError
from stratastore.format import (
    ChecksumMismatch,
    IncompatibleFingerprint,
    Level,
)
from stratastore.levels.directory import open_directory
from stratastore.levels.errors import SegmentNotFound
from stratastore.testing.backend_harness import BackendHarness, raises

__all__ = ["MoveTests"]


class MoveTests(BackendHarness):
    """Moves, threads and persistence (see the module)."""

    # -- put_sealed and relocation ------------------------------------------------------------
    def test_put_sealed_checks_every_page(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as a, self.opened(tmp_path / "b", Level.COLD) as b:
            key, data = self.put(a, 9)
            with a.open_reader(key) as seg:
                sc, stored = seg.sidecar, seg.stored()
            stored[300] ^= 1
            with raises(ChecksumMismatch):
                b.put_sealed(sc, stored)
            with raises(StrataError):
                b.put_sealed(sc, stored[:-1])
            assert key not in b and b.used() == 0
            stored[300] ^= 1
            assert b.put_sealed(sc, stored).created and b.record(key).level is Level.COLD
            b.get_into(key, out := np.zeros_like(data))
            assert np.array_equal(out, data)

    def test_relocate_between_two_backends(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as a, self.opened(tmp_path / "b", Level.COLD) as b:
            key, data = self.put(a, 11)
            keep, _ = self.put(a, 2, seed=1)
            assert b.relocate_from(a, key) in ("link", "copy")
            assert key not in a and key in b and a.keys() == [keep]
            assert b.record(key).level is Level.COLD
            b.get_into(key, out := np.zeros_like(data))
            assert np.array_equal(out, data)
            assert a.used() == a.record(keep).total_bytes
            assert b.used() == b.record(key).total_bytes

    def test_relocate_from_a_directory_store_and_back(self, tmp_path: Path) -> None:
        fp = self.fingerprint()
        with (
            open_directory(tmp_path / "dir", fp, level=Level.WARM) as local,
            self.opened(tmp_path / "b", Level.COLD) as b,
        ):
            key, data = self.put(local, 7)
            assert b.relocate_from(local, key) in ("link", "copy")
            assert key not in local and b.record(key).level is Level.COLD
            assert local.relocate_from(b, key) in ("link", "copy")
            assert key not in b and local.record(key).level is Level.WARM
            local.get_into(key, out := np.zeros_like(data))
            assert np.array_equal(out, data) and local.used() == local.record(key).total_bytes

    def test_relocate_of_a_key_the_source_lacks_is_segment_not_found(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as a, self.opened(tmp_path / "b", Level.COLD) as b:
            key, _ = self.put(a, 4)
            with raises(SegmentNotFound):
                b.relocate_from(a, b"\x42" * 32)
            b.relocate_from(a, key)
            with raises(SegmentNotFound):  # another process moved it down already
                b.relocate_from(a, key)
            assert key in b and b.keys() == [key]

    def test_relocate_of_a_key_already_here_is_present(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as a, self.opened(tmp_path / "b", Level.COLD) as b:
            key, data = self.put(a, 4)
            self.put(b, 4)
            used = b.used()
            assert b.relocate_from(a, key) == "present"
            assert key not in a and a.used() == 0 and b.used() == used
            b.get_into(key, out := np.zeros_like(data))
            assert np.array_equal(out, data)

    def test_relocate_from_another_model_is_refused(self, tmp_path: Path) -> None:
        other = self.other_fingerprint()
        with (
            self.opened(tmp_path / "a", fingerprint=other) as a,
            self.opened(tmp_path / "b", Level.COLD) as b,
        ):
            data = np.zeros(3 * other.token_bytes, np.uint8)
            key = a.put_kv(other.digest(), [1, 2, 3], data, token_start=0).key
            with raises(IncompatibleFingerprint):
                b.relocate_from(a, key)
            with a.open_reader(key) as seg:
                sc, stored = seg.sidecar, seg.stored()
            with raises(IncompatibleFingerprint):
                b.put_sealed(sc, stored)
            assert key in a and key not in b and b.used() == 0

    # -- threads and persistence --------------------------------------------------------------
    def test_threads_put_and_read(self, tmp_path: Path) -> None:
        errors: list[BaseException] = []
        with self.opened(tmp_path / "a") as b:

            def work(t: int) -> None:
                try:
                    for i in range(8):
                        key, data = self.put(b, 1 + i, seed=100 * t + i)
                        b.get_into(key, out := np.zeros_like(data))
                        assert np.array_equal(out, data)
                        b.put_kv(b.fingerprint.digest(), [9, 9], self.kv(2, 9), token_start=0)
                except BaseException as e:  # reported below, on the test's thread
                    errors.append(e)

            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert not errors, errors
            assert len(b.keys()) == 4 * 8 + 1
            assert b.used() == sum(r.total_bytes for _, r in b.records())

    def test_everything_survives_reopening(self, tmp_path: Path) -> None:
        if not self.supports_persistence:
            import pytest

            pytest.skip("this backend keeps nothing across a close")
        fp, path = self.fingerprint(), tmp_path / "a"
        with ExitStack() as stack:
            path.mkdir()
            b = self.make_backend(path, fp, Level.WARM)
            stack.callback(lambda: b.close())
            kept = [self.put(b, 3 + i, seed=i) for i in range(4)]
            b.delete(kept[0][0])
            used, oldest = b.used(), list(b.oldest())
            b = self.reopen(b, path, fp, Level.WARM)
            assert sorted(b.keys()) == sorted(k for k, _ in kept[1:])
            assert b.used() == used and list(b.oldest()) == oldest
            for key, data in kept[1:]:
                b.get_into(key, out := np.zeros_like(data))
                assert np.array_equal(out, data)
