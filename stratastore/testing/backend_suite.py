"""``BackendTests``: the shipped suite every segment backend passes (zarr's ``StoreTests``).

A backend (a level: :class:`~stratastore.levels.SegmentBackend`) subclasses it as ``Test...``
and implements two hooks: :meth:`BackendTests.make_backend` (a fresh backend on a directory it
may use) and :meth:`BackendTests.corrupt` (flip one stored byte behind the backend's back, the
raw hook that proves reads validate). A backend that keeps nothing across a close sets
``supports_persistence = False``; one that does may override :meth:`BackendTests.reopen`::

    class TestMyBackend(BackendTests):
        def make_backend(self, path, fingerprint, level):
            return MyBackend(path, fingerprint, level)

        def corrupt(self, backend, key, offset):
            backend.raw[key][offset] ^= 1

Every test covers one clause of the protocol's contract (``stratastore/levels/backend.py``):
round trips bit-exact, dedupe, listing, delete, ``used`` and ``oldest``, range reads (a reader
answers the key asked for), typed refusals of bad buffers and missing keys, validation of
damaged bytes, relocation between two backends of the class and to and from the directory
store, races, threads, persistence. It imports nothing outside the package and the standard
library (pytest only to skip a test).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from stratastore.format import (
    ChecksumMismatch,
    Codec,
    Kind,
    Level,
)
from stratastore.levels.backend import CatalogHost, SegmentBackend
from stratastore.levels.errors import SegmentNotFound, StoreError
from stratastore.levels.reader import OutOfRange, check_answer
from stratastore.testing.backend_harness import U8, raises
from stratastore.testing.backend_moves import MoveTests

__all__ = ["BackendTests"]


class BackendTests(MoveTests):
    """Subclass it (as ``Test...``) and implement :meth:`make_backend` and :meth:`corrupt`
    (:class:`~stratastore.testing.backend_harness.BackendHarness`)."""

    # -- the protocol -------------------------------------------------------------------------
    def test_is_a_segment_backend(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a", Level.COLD) as b:
            assert isinstance(b, SegmentBackend)
            assert b.level is Level.COLD and b.fingerprint == self.fingerprint()
            assert isinstance(b.path, str) and b.path
            assert b.keys() == [] and b.records() == [] and b.used() == 0

    def test_declares_its_capabilities(self, tmp_path: Path) -> None:
        """The flags the flow relies on are booleans, and each promise is kept: a level that
        hosts the catalog gives its tables (``CatalogHost``); a shared one is a
        ``SharedBackend``; ``persistent`` is what :attr:`supports_persistence` tests."""
        with self.opened(tmp_path / "a") as b:
            flags = {
                f: getattr(b, f) for f in ("persistent", "shared", "chain_index", "hosts_catalog")
            }
            assert all(isinstance(v, bool) for v in flags.values()), flags
            assert flags["persistent"] == self.supports_persistence
            if flags["hosts_catalog"]:
                assert isinstance(b, CatalogHost)
                assert callable(b.catalog_tables().write_txn)

    # -- round trips --------------------------------------------------------------------------
    def test_round_trip_one_short_page(self, tmp_path: Path) -> None:
        self._round_trip(tmp_path, 1)

    def test_round_trip_one_full_page(self, tmp_path: Path) -> None:
        self._round_trip(tmp_path, 4)

    def test_round_trip_partial_last_page(self, tmp_path: Path) -> None:
        self._round_trip(tmp_path, 5)

    def test_round_trip_many_pages(self, tmp_path: Path) -> None:
        self._round_trip(tmp_path, 37)

    def test_round_trip_compressed(self, tmp_path: Path) -> None:
        self._round_trip(tmp_path, 13, Codec.ZSTD)

    def test_state_round_trip(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            state = np.random.default_rng(7).integers(0, 256, (2 << 20) + 5, dtype=np.uint8)
            r = b.put_state(b"\x11" * 32, state, token_pos=24)
            sc = b.get_into(r.key, out := np.zeros_like(state))
            assert np.array_equal(out, state) and sc.kind is Kind.STATE
            assert sc.page_count == 3 and sc.last_page_bytes == 5
            assert b.record(r.key).token_start == 24
            assert b.get_bytes(r.key, max_bytes=state.size) == state.tobytes()
            with raises(StoreError):
                b.get_bytes(r.key, max_bytes=state.size - 1)

    def test_equal_puts_are_stored_once(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 6)
            used = b.used()
            again = b.put_kv(b.fingerprint.digest(), np.arange(6), data, token_start=0)
            assert (again.key, again.created, again.stored_bytes) == (key, False, 0)
            assert b.keys() == [key] and b.used() == used

    # -- listing and records ------------------------------------------------------------------
    def test_contains_record_keys_records(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a", Level.COLD) as b:
            keys = [self.put(b, 3 + i, seed=i)[0] for i in range(3)]
            assert all(k in b for k in keys) and b"\0" * 32 not in b
            assert sorted(b.keys()) == sorted(keys) and len(b) == 3
            assert sorted(k for k, _ in b.records()) == sorted(keys)
            rec = b.record(keys[1])
            assert (rec.kind, rec.level, rec.token_start, rec.token_end) == (
                Kind.KV,
                Level.COLD,
                0,
                4,
            )
            assert rec.parent_key == b.fingerprint.digest() and rec.page_count == 1
            assert dict(b.records())[keys[1]] == rec

    def test_delete(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, _ = self.put(b, 5)
            other, data = self.put(b, 5, seed=1)
            assert b.delete(key) is True and b.delete(key) is False
            assert key not in b and b.keys() == [other] and len(b) == 1
            with raises(SegmentNotFound):
                b.record(key)
            b.get_into(other, out := np.zeros_like(data))
            assert np.array_equal(out, data)

    def test_used_is_exact_and_tracks_puts_and_deletes(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            assert b.used() == 0
            key, _ = self.put(b, 9)
            one = b.record(key).total_bytes
            assert b.used() == one > 9 * b.fingerprint.token_bytes
            other, _ = self.put(b, 2, seed=1)
            assert b.used() == one + b.record(other).total_bytes
            assert b.used() == sum(r.total_bytes for _, r in b.records())
            b.delete(key)
            assert b.used() == b.record(other).total_bytes
            b.delete(other)
            assert b.used() == 0

    def test_oldest_is_oldest_sealed_first(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            for i in range(6):
                self.put(b, 2, seed=i)
            got = list(b.oldest())
            want = sorted(b.records(), key=lambda kr: (kr[1].sealed_at_ns, kr[0]))
            assert got == want

    def test_oldest_is_lazy_and_survives_deletes(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            keys = [self.put(b, 1, seed=i)[0] for i in range(80)]
            rows = b.oldest()
            assert not isinstance(rows, list | tuple) and iter(rows) is rows
            first, _ = next(rows)
            for k in keys:  # GC deletes while it walks
                b.delete(k)
            rest = [k for k, _ in rows]
            assert first in keys and set(rest) <= set(keys) - {first}
            assert list(b.oldest()) == []

    # -- range reads --------------------------------------------------------------------------
    def test_read_into_ranges(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 5)
            stored = data.size  # RAW: the stored bytes are the pages
            out = np.zeros(100, np.uint8)
            assert b.read_into(key, 10, out) == 100 and np.array_equal(out, data[10:110])
            assert b.read_into(key, stored - 30, out) == 30
            assert np.array_equal(out[:30], data[-30:])
            assert b.read_into(key, stored, out) == 0
            whole = bytearray(stored)
            assert b.read_into(key, 0, whole) == stored and bytes(whole) == data.tobytes()

    def test_read_into_out_of_range_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 3)
            for offset in (-1, data.size + 1):
                with raises(OutOfRange):
                    b.read_into(key, offset, np.zeros(8, np.uint8))
            with raises(StoreError):
                b.read_into(key, 0, bytes(8))  # read-only

    def test_reader_range_reads(self, tmp_path: Path) -> None:
        """A reader reads the stored payload of the key it was opened for; its sidecar passes
        the check every read above the seam makes of an answer (``check_answer``: that key,
        this model, its kind and tokens), or those reads take the segment for damage."""
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 9)
            state = b.put_state(b"\x22" * 32, b"a state", token_pos=9).key
            for k, kind, tokens in ((key, Kind.KV, (0, 9)), (state, Kind.STATE, (9, 9))):
                with b.open_reader(k) as seg:
                    check_answer(seg.sidecar, k, b.fingerprint, b.path, kind=kind, tokens=tokens)
            with b.open_reader(key) as seg:
                assert seg.sidecar.key == key and seg.sidecar.stored_bytes == data.size
                buf = np.zeros(256, np.uint8)
                seg.read_into(buf, 256)
                assert np.array_equal(buf, data[256:512])
                parts = [memoryview(bytearray(100)), memoryview(bytearray(50))]
                seg.readv_into(parts, 7)
                assert bytes(parts[0]) + bytes(parts[1]) == data[7:157].tobytes()
                assert np.array_equal(seg.pages(2), data[:512])
                assert np.array_equal(seg.stored(), data) and seg.first_bad_page() == -1
                with raises(OutOfRange):
                    seg.read_into(np.zeros(2, np.uint8), data.size - 1)
                for offset, nbytes in [(0, data.size), (-1, 4), (data.size, 4), (9, -3)]:
                    seg.advise(offset, nbytes)  # a hint, in range or not: never raises
                assert np.array_equal(seg.stored(), data)

    # -- bad buffers and arguments ------------------------------------------------------------
    def test_get_into_a_too_small_buffer_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 5)
            out = np.full(data.size - 1, 7, np.uint8)
            with raises(StoreError):
                b.get_into(key, out)
            assert (out == 7).all()

    def test_get_into_a_read_only_buffer_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 5)
            out = np.zeros_like(data)
            out.flags.writeable = False
            with raises(StoreError):
                b.get_into(key, out)
            with raises(StoreError):
                b.get_into(key, bytes(data.size))

    def test_non_contiguous_payload_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            strided = self.kv(8)[::2]
            with raises(StoreError):
                b.put_kv(b.fingerprint.digest(), np.arange(4), strided, token_start=0)
            with raises(StoreError):
                b.get_into(self.put(b, 2)[0], np.zeros(512, np.uint8)[::2])
            assert len(b.keys()) == 1

    def test_wrong_payload_length_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            with raises(StoreError):
                b.put_kv(b.fingerprint.digest(), np.arange(4), self.kv(3), token_start=0)
            with raises(StoreError):
                b.put_kv(b.fingerprint.digest(), [], self.kv(0), token_start=0)
            assert b.keys() == [] and b.used() == 0

    def test_put_with_page_hashes_carries_them(self, tmp_path: Path) -> None:
        """``put_kv(page_hashes=...)`` (a park hashed on the device): the sidecar carries the
        caller's digests as they are, either codec, and reads validate against them; digests of
        another shape are a ``StoreError`` and nothing is stored."""
        with self.opened(tmp_path / "a") as b:
            root = b.fingerprint.digest()
            key, data = self.put(b, 10)  # 3 pages, the last short: hashed by the backend
            with b.open_reader(key) as seg:
                hashes = np.frombuffer(seg.sidecar.page_hashes, np.uint8).reshape(-1, 32)
            for i, codec in enumerate((Codec.RAW, Codec.ZSTD)):
                k = b.put_kv(
                    root,
                    np.arange(10) + 100 * (i + 1),
                    data,
                    token_start=0,
                    codec=codec,
                    page_hashes=hashes.copy(),
                ).key
                out = np.zeros_like(data)
                assert b.get_into(k, out).page_hashes == hashes.tobytes()
                assert np.array_equal(out, data)
            wrong = hashes.copy()
            wrong[1, 0] ^= 1  # not recomputed: the sidecar says what the caller vouched for
            k = b.put_kv(root, np.arange(10) + 300, data, token_start=0, page_hashes=wrong).key
            with raises(ChecksumMismatch):
                b.get_into(k, np.zeros_like(data))
            held = len(b.keys())
            bads: list[U8] = [hashes[:2], hashes[:, :16], hashes.view(np.int8)]
            for bad in bads:
                with raises(StoreError):
                    b.put_kv(root, np.arange(10) + 400, data, token_start=0, page_hashes=bad)
            assert len(b.keys()) == held

    # -- damage -------------------------------------------------------------------------------
    def test_a_flipped_byte_is_refused_on_read(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 12)
            self.corrupt(b, key, 2 * 256 + 17)  # page 2 of 3
            try:
                b.get_into(key, out := np.zeros_like(data))
            except ChecksumMismatch as e:
                assert e.page == 2
            else:
                raise AssertionError("a damaged page was delivered")
            assert not out[512:].any()  # never the damaged page
            with raises(ChecksumMismatch):
                b.get_bytes(key, max_bytes=data.size)
            with b.open_reader(key) as seg:
                assert seg.first_bad_page() == 2

    def test_a_flipped_byte_of_a_compressed_segment_is_refused(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 9, codec=Codec.ZSTD)
            self.corrupt(b, key, 40)  # inside the first frame
            with raises(ChecksumMismatch):
                b.get_into(key, np.zeros_like(data))

    def test_a_missing_key_is_segment_not_found_on_every_read(self, tmp_path: Path) -> None:
        with self.opened(tmp_path / "a") as b:
            key, data = self.put(b, 3)
            b.delete(key)
            out = np.zeros_like(data)
            reads: list[Callable[[], object]] = [
                lambda: b.record(key),
                lambda: b.open_reader(key),
                lambda: b.read_into(key, 0, out),
                lambda: b.get_into(key, out),
                lambda: b.get_bytes(key, max_bytes=1 << 20),
            ]
            for read in reads:
                with raises(SegmentNotFound):
                    read()
            assert key not in b and b.delete(key) is False
            b.prefetch(key)  # a hint: never raises
