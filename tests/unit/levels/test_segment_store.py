"""The segment store: put/get/view/delete, dedupe, reconcile and rebuild of the index, typed
refusals of bad input, and concurrent writers (F-DIR, F-IDX, F-DUR-2..7, F-SC-3)."""

from __future__ import annotations

import dataclasses
import errno
import multiprocessing as mp
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from stratastore import (
    ChecksumMismatch,
    FormatError,
    IncompatibleFingerprint,
    SegmentNotFound,
    StoreError,
    StrataIOError,
)
from stratastore.format import Codec, Kind, data_name, segment_key, sidecar_name, state_key
from stratastore.format.naming import INDEX_DIR
from stratastore.io import faults
from stratastore.io.faults import Fault
from stratastore.levels.local import STATE_PAGE_BYTES, SegmentStore
from tests.conftest import kv_bytes, tiny_fp


def put(
    store: SegmentStore,
    n: int = 10,
    seed: int = 0,
    parent: bytes | None = None,
    start: int = 0,
    codec: Codec = Codec.RAW,
) -> tuple[bytes, np.ndarray]:
    data = kv_bytes(store.fingerprint, n, seed)
    toks = np.arange(start, start + n) + 1000 * seed
    r = store.put_kv(parent or store.root_key, toks, data, token_start=start, codec=codec)
    return r.key, data


def segment_files(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith("strata-"))


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
@pytest.mark.parametrize("n", [1, 4, 5, 37])
def test_put_get_roundtrip(store: SegmentStore, codec: Codec, n: int) -> None:
    key, data = put(store, n, codec=codec)
    out = np.zeros_like(data)
    sc = store.get_into(key, out)
    assert np.array_equal(out, data)
    assert sc.kind is Kind.KV and sc.n_tokens == n and sc.codec is codec
    assert key in store and store.keys() == [key] and len(store) == 1
    rec = store.record(key)
    assert rec.token_end == n and rec.total_bytes > 4096
    if codec is Codec.RAW:
        view = store.view(key)
        assert not view.flags.writeable and np.array_equal(view, data)


def test_key_is_the_token_prefix_hash(store: SegmentStore) -> None:
    key, _ = put(store, 10)
    assert key == segment_key(store.root_key, np.arange(10))
    child, _ = put(store, 6, seed=0, parent=key, start=10)
    assert store.sidecar(child).parent_key == key
    assert store.sidecar(child).token_start == 10


def test_put_of_a_committed_key_writes_nothing(store: SegmentStore, tmp_path: Path) -> None:
    key, data = put(store, 10)
    before = {
        n: os.stat(tmp_path / "store" / n).st_mtime_ns for n in segment_files(tmp_path / "store")
    }
    r = store.put_kv(store.root_key, np.arange(10), data, token_start=0)
    assert not r.created and r.key == key
    after = {
        n: os.stat(tmp_path / "store" / n).st_mtime_ns for n in segment_files(tmp_path / "store")
    }
    assert before == after


def test_state_segments(store: SegmentStore) -> None:
    key, _ = put(store, 10)
    state = os.urandom(STATE_PAGE_BYTES * 2 + 5)
    r = store.put_state(key, state, token_pos=10)
    assert r.key == state_key(key)
    out = bytearray(len(state))
    sc = store.get_into(r.key, out)
    assert bytes(out) == state and sc.kind is Kind.STATE and sc.page_count == 3
    with pytest.raises(StoreError, match="at least one byte"):
        store.put_state(key, b"", token_pos=10)


def test_bad_put_arguments_are_typed(store: SegmentStore) -> None:
    fp = store.fingerprint
    with pytest.raises(StoreError, match="640 bytes"):
        store.put_kv(store.root_key, np.arange(10), b"\0" * 639, token_start=0)
    with pytest.raises(StoreError, match="at least one token"):
        store.put_kv(store.root_key, [], b"", token_start=0)
    with pytest.raises(StoreError, match="token 0"):
        store.put_kv(store.root_key, [1], b"\0" * fp.token_bytes, token_start=3)
    with pytest.raises(FormatError, match="token range"):
        store.put_kv(b"\1" * 32, [1], b"\0" * fp.token_bytes, token_start=-1)
    with pytest.raises(FormatError, match="token range"):
        store.put_state(b"\1" * 32, b"x", token_pos=-5)
    with pytest.raises(StoreError, match="contiguous"):
        store.put_kv(store.root_key, [1, 2], np.zeros((4, 64), np.uint8)[::2], token_start=0)
    assert len(store) == 0


def test_bad_get_arguments_are_typed(store: SegmentStore) -> None:
    key, _ = put(store, 10)
    with pytest.raises(SegmentNotFound, match=r"not in .*store"):
        store.get_into(b"\0" * 32, bytearray(10))
    with pytest.raises(StoreError, match="needs 640"):
        store.get_into(key, bytearray(100))
    with pytest.raises(StoreError, match="read-only"):
        store.get_into(key, bytes(640))
    zkey, _ = put(store, 5, seed=3, codec=Codec.ZSTD)
    with pytest.raises(StoreError, match="get_into"):
        store.view(zkey)


@pytest.mark.parametrize("codec", [Codec.RAW, Codec.ZSTD])
def test_damaged_page_is_refused_and_never_copied(
    store: SegmentStore, tmp_path: Path, codec: Codec
) -> None:
    key, data = put(store, 12, codec=codec)  # 3 pages of 256 bytes
    path = tmp_path / "store" / data_name(key)
    raw = bytearray(path.read_bytes())
    if codec is Codec.RAW:
        raw[4096 + 256 + 9] ^= 0x01  # page 1
    else:
        sc = store.sidecar(key)
        raw[4096 + sc.stored_offsets()[1] + sc.stored_lengths[1] - 3] ^= 0x01
    path.write_bytes(bytes(raw))
    sentinel = 0xEE
    out = np.full(len(data), sentinel, dtype=np.uint8)
    with pytest.raises(ChecksumMismatch) as ei:
        store.get_into(key, out)
    assert ei.value.page == 1 and data_name(key) in str(ei.value)
    # nothing of page 1 reached the caller; whatever was copied is valid data
    assert (out[256:512] == sentinel).all()
    copied = out != sentinel
    assert np.array_equal(out[copied], data[copied])
    assert store.verify(key) == 1
    if codec is Codec.RAW:
        with pytest.raises(ChecksumMismatch):
            store.view(key)
        assert np.array_equal(store.view(key, verify=False)[:256], data[:256])


def test_damaged_header_or_size_is_refused(store: SegmentStore, tmp_path: Path) -> None:
    key, _ = put(store, 10)
    path = tmp_path / "store" / data_name(key)
    good = path.read_bytes()
    path.write_bytes(good + b"\0")
    with pytest.raises(Exception, match="truncated or padded"):
        store.get_into(key, bytearray(640))
    b = bytearray(good)
    b[30] ^= 1
    path.write_bytes(bytes(b))
    with pytest.raises(ChecksumMismatch, match="header"):
        store.get_into(key, bytearray(640))


def test_delete_order_and_result(store: SegmentStore, tmp_path: Path) -> None:
    key, _ = put(store, 10)
    with faults.inject(record=True) as inj:
        assert store.delete(key)
    ops = [(op, os.path.basename(p)) for op, p in inj.log if op in ("unlink", "fsync_dir")]
    assert ops == [
        ("unlink", sidecar_name(key)),
        ("fsync_dir", "store"),
        ("unlink", data_name(key)),
        ("fsync_dir", "store"),
    ]
    assert key not in store and segment_files(tmp_path / "store") == [INDEX_DIR]
    assert not store.delete(key)


def test_put_order_of_operations(store: SegmentStore) -> None:
    with faults.inject(record=True) as inj:
        key, _ = put(store, 10)
    named = [(op, os.path.basename(p)) for op, p in inj.log if op in ("rename", "fsync_dir")]
    assert named == [
        ("rename", data_name(key)),
        ("fsync_dir", "store"),
        ("rename", sidecar_name(key)),
        ("fsync_dir", "store"),
    ]


@pytest.mark.parametrize("op", ["open", "write", "fsync", "rename", "fsync_dir"])
@pytest.mark.parametrize("nth", [1, 2])
def test_failed_put_is_invisible_and_leaves_no_temp(tmp_path: Path, op: str, nth: int) -> None:
    fp = tiny_fp()
    d = tmp_path / "s"
    with SegmentStore.open(d, fp) as store:
        with faults.inject(Fault(op=op, nth=nth, errno=errno.EIO)), pytest.raises(StrataIOError):
            put(store, 10)
        leftovers = [n for n in os.listdir(d) if n.startswith("strata-tmp-")]
        assert leftovers == []
        assert store.keys() == []  # a put that raised is invisible (rolled back)
    with SegmentStore.open(d, fp) as store:
        assert store.keys() == []
        key, data = put(store, 10)  # the store still works
        out = np.zeros_like(data)
        store.get_into(key, out)
        assert np.array_equal(out, data)


def test_reopen_reconciles_and_rebuilds(tmp_path: Path) -> None:
    fp = tiny_fp()
    d = tmp_path / "s"
    with SegmentStore.open(d, fp) as store:
        keys = [put(store, 5 + i, seed=i)[0] for i in range(6)]
    names_before = {n: (d / n).read_bytes() for n in segment_files(d) if n != INDEX_DIR}
    shutil.rmtree(d / INDEX_DIR)
    with SegmentStore.open(d, fp) as store:
        assert sorted(store.keys()) == sorted(keys)
        assert store.skipped == []
    # a sidecar removed behind the index's back: its record is dropped on open
    (d / sidecar_name(keys[0])).unlink()
    with SegmentStore.open(d, fp) as store:
        assert keys[0] not in store and len(store) == 5
    # opening rewrote no segment file (F-DIR-5)
    for n, content in names_before.items():
        if n != sidecar_name(keys[0]):
            assert (d / n).read_bytes() == content


def test_open_adopts_valid_and_skips_damaged_sidecars(tmp_path: Path) -> None:
    fp = tiny_fp()
    d = tmp_path / "s"
    with SegmentStore.open(d, fp) as store:
        good, _ = put(store, 10)
        bad, _ = put(store, 8, seed=2)
        trunc, _ = put(store, 6, seed=3)
    shutil.rmtree(d / INDEX_DIR)
    side = d / sidecar_name(bad)
    raw = side.read_bytes()
    side.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))  # (a last byte of 0 stayed the same)
    data = d / data_name(trunc)
    data.write_bytes(data.read_bytes()[:-5])
    (d / "strata-tmp-0123-whatever").write_bytes(b"junk")
    (d / "notes.txt").write_text("not ours")
    with SegmentStore.open(d, fp) as store:
        assert store.keys() == [good]
        reasons = {s.name: s.error for s in store.skipped}
        assert reasons == {
            sidecar_name(bad): "ChecksumMismatch",
            sidecar_name(trunc): "FormatError",
        }
    assert (d / "notes.txt").exists() and (d / "strata-tmp-0123-whatever").exists()


def test_wrong_model_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, tiny_fp("a")) as store:
        put(store, 10)
    with pytest.raises(IncompatibleFingerprint, match="use another directory"):
        SegmentStore.open(d, tiny_fp("b"))
    shutil.rmtree(d / INDEX_DIR)  # also when only the sidecars say so
    with pytest.raises(IncompatibleFingerprint, match=r"strata-conv-.*\.side"):
        SegmentStore.open(d, tiny_fp("b"))
    with SegmentStore.open(d, tiny_fp("a")) as store:
        assert len(store) == 1


def test_empty_directory_takes_any_model(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, tiny_fp("a")) as store:
        key, _ = put(store, 3)
        store.delete(key)
    with SegmentStore.open(d, tiny_fp("b")) as store:
        put(store, 3)
    with SegmentStore.open(d, tiny_fp("b")) as store:
        assert len(store) == 1


def test_open_refusals(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        SegmentStore.open(tmp_path / "nope", tiny_fp(), create=False)
    mi = tmp_path / "mountinfo"
    mi.write_text(f"40 22 0:40 / {tmp_path} rw - nfs4 server:/x rw\n")
    with pytest.raises(StoreError, match="network filesystem"):
        SegmentStore.open(tmp_path / "s", tiny_fp(), mountinfo=str(mi))


def test_corrupt_lmdb_is_a_typed_error_with_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, tiny_fp()) as store:
        put(store, 3)
    (d / INDEX_DIR / "data.mdb").write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError, match="delete that directory"):
        SegmentStore.open(d, tiny_fp())
    shutil.rmtree(d / INDEX_DIR)
    with SegmentStore.open(d, tiny_fp()) as store:
        assert len(store) == 1


def test_stats_account_disk_bytes(store: SegmentStore, tmp_path: Path) -> None:
    for i in range(3):
        put(store, 7, seed=i)
    d = tmp_path / "store"
    on_disk = sum(os.path.getsize(d / n) for n in os.listdir(d) if n.startswith("strata-conv-"))
    st = store.stats()
    assert st.entries == 3 and st.disk_bytes == on_disk


def test_concurrent_puts_of_one_key_threads(store: SegmentStore) -> None:
    data = kv_bytes(store.fingerprint, 40)
    results = []

    def worker() -> None:
        results.append(store.put_kv(store.root_key, np.arange(40), data, token_start=0))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.created for r in results) == 1 and len({r.key for r in results}) == 1
    assert len(store) == 1 and store.verify(results[0].key) == -1
    assert [n for n in os.listdir(store.path) if n.startswith("strata-tmp-")] == []


def _proc_put(path: str, seed: int, barrier: object) -> None:
    fp = tiny_fp()
    with SegmentStore.open(path, fp) as store:
        barrier.wait()  # type: ignore[attr-defined]
        data = kv_bytes(fp, 40)
        store.put_kv(store.root_key, np.arange(40), data, token_start=0)
        d2 = kv_bytes(fp, 9, seed + 1)
        store.put_kv(store.root_key, np.arange(9) + 100 * (seed + 1), d2, token_start=0)


def test_concurrent_writers_across_processes(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    with SegmentStore.open(d, tiny_fp()):
        pass
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_proc_put, args=(d, i, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with SegmentStore.open(d, tiny_fp()) as store:
        assert len(store) == 5
        for key in store.keys():
            assert store.verify(key) == -1


def test_segment_deleted_by_another_handle_reads_as_not_found(tmp_path: Path) -> None:
    fp = tiny_fp()
    with SegmentStore.open(tmp_path, fp) as a, SegmentStore.open(tmp_path, fp) as b:
        key, data = put(a, 10)
        view = b.view(key)
        assert a.delete(key)
        with pytest.raises(SegmentNotFound):
            b.get_into(key, bytearray(len(data)))
        assert np.array_equal(view, data)  # a mapping taken before the delete stays readable


def test_get_bytes_is_validated_and_bounded(store: SegmentStore, tmp_path: Path) -> None:
    key, _ = put(store, 10)
    st = store.put_state(key, b"state" * 100, token_pos=10)
    assert store.get_bytes(st.key, max_bytes=500) == b"state" * 100
    with pytest.raises(StoreError, match="over the 499"):
        store.get_bytes(st.key, max_bytes=499)
    path = tmp_path / "store" / data_name(st.key)
    raw = bytearray(path.read_bytes())
    raw[4096] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ChecksumMismatch):
        store.get_bytes(st.key, max_bytes=500)


# -- the level protocol's costs and races -------------------------------------------------------
def _index_tables(d: Path) -> dict[bytes, dict[bytes, bytes]]:
    import lmdb

    env = lmdb.open(str(d / INDEX_DIR), subdir=True, readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin() as txn:
            return {
                name: {
                    bytes(k): bytes(v)
                    for k, v in txn.cursor(db=env.open_db(name, txn=txn, create=False))
                }
                for name in (b"segments", b"meta", b"ages", b"totals")
            }
    finally:
        env.close()


def test_used_is_a_counter_kept_with_every_record_write(tmp_path: Path) -> None:
    fp = tiny_fp()
    d = tmp_path / "s"
    with SegmentStore.open(d, fp) as store:
        keys = [put(store, 3 + i, seed=i)[0] for i in range(4)]
        store.delete(keys[0])
        on_disk = sum(os.path.getsize(d / n) for n in os.listdir(d) if n.startswith("strata-conv-"))
        assert store.used() == store.stats().disk_bytes == on_disk
        # a put over an existing record replaces its bytes (read inside the same transaction)
        rec = store.record(keys[1])
        bigger = dataclasses.replace(rec, file_bytes=rec.file_bytes + 1000)
        store.index.put(keys[1], bigger)
        assert store.used() == on_disk + 1000
        store.index.apply({keys[1]: rec}, [keys[2]])
        assert store.used() == sum(r.total_bytes for _, r in store.records())
    tables = _index_tables(d)
    assert set(tables[b"segments"]) == {k[8:] for k in tables[b"ages"]}
    assert tables[b"meta"].keys() == {b"schema", b"fingerprint"}  # F-IDX-5 unchanged


def test_an_index_without_the_derived_tables_is_rebuilt_on_open(tmp_path: Path) -> None:
    import lmdb

    fp = tiny_fp()
    d = tmp_path / "s"
    with SegmentStore.open(d, fp) as store:
        keys = [put(store, 2, seed=i)[0] for i in range(5)]
        used, oldest = store.used(), list(store.oldest())
    env = lmdb.open(str(d / INDEX_DIR), subdir=True, max_dbs=16)  # as an index of 0.1 is
    with env.begin(write=True) as txn:
        for name in (b"ages", b"totals"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
    env.close()
    with SegmentStore.open(d, fp) as store:
        assert store.used() == used and list(store.oldest()) == oldest
        assert sorted(store.keys()) == sorted(keys)
    # a record written by a writer that keeps no ages (0.1) is noticed and rebuilt too
    env = lmdb.open(str(d / INDEX_DIR), subdir=True, max_dbs=16)
    with env.begin(write=True) as txn:
        txn.delete(
            min(k for k in txn.cursor(db=env.open_db(b"ages", txn=txn)).iternext(values=False)),
            db=env.open_db(b"ages", txn=txn),
        )
    env.close()
    with SegmentStore.open(d, fp) as store:
        assert list(store.oldest()) == oldest and store.used() == used


def test_oldest_walks_the_age_table_in_batches(store: SegmentStore) -> None:
    for i in range(150):  # more than one batch of the cursor walk
        put(store, 1, seed=i)
    got = list(store.oldest())
    assert got == sorted(store.records(), key=lambda kr: (kr[1].sealed_at_ns, kr[0]))
    assert len(got) == 150


class _DeletedBeforeDataOpen(faults.FaultInjector):
    """Another process deletes segment ``key`` (sidecar, then data file) between a reader's
    sidecar read and its open of the data file (the io seam's hook: every open goes through
    it)."""

    def __init__(self, store: SegmentStore, key: bytes) -> None:
        super().__init__()
        self.sidecar = os.path.join(store.path, sidecar_name(key))
        self.data = os.path.join(store.path, data_name(key))
        self.deleted = False

    def check(self, op: str, path: str) -> Fault | None:
        if op == "open" and path == self.data and not self.deleted:
            os.unlink(self.sidecar)
            os.unlink(self.data)
            self.deleted = True
        return super().check(op, path)


def test_reads_of_a_segment_deleted_meanwhile_are_not_found(
    store: SegmentStore, tmp_path: Path
) -> None:
    key, _ = put(store, 5)
    # a move's check of its source's segment (the sidecar, then the data file's header)
    race = _DeletedBeforeDataOpen(store, key)
    with SegmentStore.open(tmp_path / "other", store.fingerprint) as other:
        with faults.use(race), pytest.raises(SegmentNotFound):
            other.relocate_from(store, key)
        assert race.deleted and key not in other
    assert put(store, 5)[0] == key  # put again, then race the reader's data-file open
    race = _DeletedBeforeDataOpen(store, key)
    with faults.use(race), pytest.raises(SegmentNotFound):
        store.open_reader(key)
    assert race.deleted
    # the index still names it until the next open; every read says not found
    with pytest.raises(SegmentNotFound):
        store.open_reader(key)
    # a committed sidecar whose data file is gone is damage, not "not found"
    key2, _ = put(store, 6, seed=3)
    os.unlink(os.path.join(store.path, data_name(key2)))
    with pytest.raises(StrataIOError):
        store.open_reader(key2)


def test_relocate_races_are_typed(tmp_path: Path) -> None:
    from stratastore.format import Level

    fp = tiny_fp()
    with (
        SegmentStore.open(tmp_path / "w", fp, level=Level.WARM) as warm,
        SegmentStore.open(tmp_path / "w", fp, level=Level.WARM) as other,
        SegmentStore.open(tmp_path / "c", fp, level=Level.COLD) as cold,
    ):
        key, data = put(warm, 9)
        assert cold.relocate_from(other, key) == "link"  # another process moved it down
        with pytest.raises(SegmentNotFound):
            cold.relocate_from(warm, key)
        key2, _ = put(warm, 4, seed=1)
        os.unlink(os.path.join(warm.path, sidecar_name(key2)))  # behind this handle's index
        with pytest.raises(SegmentNotFound):
            cold.relocate_from(warm, key2)
        assert key2 not in cold and cold.keys() == [key]
        assert SegmentStore.adopt is SegmentStore.relocate_from
        cold.get_into(key, out := np.zeros_like(data))
        assert np.array_equal(out, data)
