"""The shared catalog (spec F-CAT): its layout, its build and reconcile from the manifests, its
reference counts, and finishing what a killed process left in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import numpy as np

from stratastore import Checkpoint, Conversation, Store
from stratastore.catalog import Catalog
from stratastore.catalog.gc import Collector
from stratastore.format.manifest import decode_manifest, encode_manifest
from stratastore.format.naming import chain_name, data_name
from stratastore.levels.local import SegmentStore
from tests.conftest import on_disk, tiny_fp

FP = tiny_fp()
TB = FP.token_bytes
ROOT = Path(__file__).resolve().parents[3]


def cfg(tmp_path: Path) -> dict[str, object]:
    return {"ram_mib": 0, "park": "disk", "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}


def conv(cid: str, first: int, n: int = 16, shared: int = 8) -> tuple[Conversation, np.ndarray]:
    """``shared`` tokens every conversation has (0..shared), then ``n - shared`` of its own."""
    toks = np.concatenate([np.arange(shared), np.arange(first, first + n - shared)])
    toks = toks.astype(np.uint32)
    mixed = toks.astype(np.int64)[:, None] * 31 + np.arange(TB, dtype=np.int64)[None, :]
    kv = (mixed & 0xFF).astype(np.uint8).reshape(-1)
    return Conversation(cid, toks, [Checkpoint(shared), Checkpoint(n)], cuts=[0, shared]), kv


def restored(store: Store, c: Conversation) -> int:
    out = np.zeros(len(c.tokens) * TB, np.uint8)
    return store.restore(c.tokens, out).tokens


def test_the_catalog_tables_are_laid_out_as_the_spec_says(tmp_path: Path) -> None:
    """F-CAT-1: named databases in the last level's environment; a conversation's key is the
    BLAKE3 of its id; its row holds flags, sealed_at, the file's stamp and the manifest bytes;
    every key its manifest names has a member row owned by it; the age row; the schema."""
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40) as store:
        a, kv = conv("a", 100)
        store.park(a, kv)
        store.flush()
    with SegmentStore.open(tmp_path / "cold", FP, create=False) as level:
        env = level.index.env  # the last level's environment holds the tables
        c = blake3.blake3(b"a").digest()
        path = tmp_path / "cold" / chain_name("a")
        with env.begin() as txn:
            row = bytes(txn.get(c, db=env.open_db(b"cat.convs", txn=txn)))
            m = decode_manifest(row[33:])
            assert row[0] == 0 and int.from_bytes(row[1:9], "big") == m.sealed_at_ns
            st = os.lstat(path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            assert (
                tuple(int.from_bytes(row[9 + 8 * i : 17 + 8 * i], "big") for i in range(3)) == stamp
            )
            assert row[33:] == path.read_bytes()
            members = env.open_db(b"cat.members", txn=txn)
            for _, _, key in m.segments:
                assert txn.get(key + c, db=members) is not None
            ages = env.open_db(b"cat.ages", txn=txn)
            assert bytes(txn.get(m.sealed_at_ns.to_bytes(8, "big") + c, db=ages)) == b"a"
            meta = env.open_db(b"cat.meta", txn=txn)
            assert int.from_bytes(bytes(txn.get(b"schema", db=meta)), "big") == 1
            assert int.from_bytes(bytes(txn.get(b"gen", db=meta)), "big") >= 1


def test_a_store_without_a_catalog_has_it_built_and_a_changed_file_is_read_again(
    tmp_path: Path,
) -> None:
    """F-CAT-2: a store whose catalog is gone (a 1.1 store) has it built from the manifests on
    open; a manifest replaced behind the store's back (another valid version) is read again; a
    refused one is not served and is left in place for fsck."""
    a, kva = conv("a", 100)
    b, kvb = conv("b", 200)
    c_b = conv("b", 200)[0]  # park may trim checkpoints: keep a copy for the keys
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40) as store:
        store.park(a, kva)
        store.park(b, kvb)
        store.flush()
    with SegmentStore.open(tmp_path / "cold", FP, create=False) as level:
        Catalog(level.index).reset()  # as a store written before the catalog
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40) as store:
        assert restored(store, a) == 16 and restored(store, b) == 16
    cold = tmp_path / "cold"
    m = decode_manifest((cold / chain_name("a")).read_bytes())
    shorter = encode_manifest(
        m.__class__(
            m.conv_id,
            m.model,
            m.tokens[:8],
            m.checkpoints[:1],
            m.media,
            m.segments[:1],
            m.sealed_at_ns,
            m.session,
        )
    )
    (cold / chain_name("a")).write_bytes(shorter)  # a valid older version, behind its back
    (cold / chain_name("b")).write_bytes(b"not a manifest")
    warned: list[str] = []
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40, warn=warned.append) as store:
        assert restored(store, a) == 8  # the file's version, not the catalog's
        assert restored(store, b) == 8  # b's own manifest refused: only the prefix a shares
        assert store.describe().unreadable_manifests == (chain_name("b"),)
    assert (cold / chain_name("b")).read_bytes() == b"not a manifest"  # left for fsck
    own = c_b.segment_keys(FP.digest())[1].key  # b's own segment: not deleted by the open
    assert (cold / data_name(own)).exists()


def test_a_shared_segment_goes_with_the_last_conversation_that_names_it(tmp_path: Path) -> None:
    """F-CAT-3: the shared prefix segment has one owner per conversation; removing all but one
    keeps it, removing the last deletes it (and only then)."""
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40) as store:
        convs = [conv(f"c{i}", 1000 * (i + 1)) for i in range(3)]
        for c, kv in convs:
            store.park(c, kv)
        store.flush()
    cold = tmp_path / "cold"
    with SegmentStore.open(cold, FP, create=False) as level:
        cat = Catalog(level.index)
        gc = Collector(cat, lambda: [level], str(cold), 0o600)
        shared = decode_manifest((cold / chain_name("c0")).read_bytes()).segments[0][2]
        assert cat.owners(shared) == 3
        for i, (c, _) in enumerate(convs):
            r = cat.shorten(c.conv_id, lambda m: 0)
            assert r is not None
            gc.carry_out(r)
            alive = (cold / data_name(shared)).exists()
            assert cat.owners(shared) == 2 - i and alive == (i < 2)
        assert cat.in_flight() == []


def test_a_killed_park_is_finished_by_the_next_open(tmp_path: Path) -> None:
    """F-CAT-7: a process SIGKILLed with a park registered (its segment written, its manifest
    not) leaves work in flight; the next open withdraws it and deletes the segment only it
    named, and a park of that conversation then goes through at once."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        sys.path.insert(0, {str(ROOT)!r})
        from stratastore import Store
        from stratastore.catalog import Catalog
        from stratastore.levels.local import SegmentStore
        from tests.unit.catalog.test_catalog import FP, cfg, conv
        from pathlib import Path
        tmp = Path({str(tmp_path)!r})
        Store.open(FP, cfg(tmp), probe=lambda: 1 << 40).close()  # the catalog made
        level = SegmentStore.open(tmp / "cold", FP, create=False)
        c, kv = conv("k", 100)
        specs = c.segment_keys(FP.digest())
        Catalog(level.index).begin("k", {{s.key for s in specs}}, session=False)  # a park's steps
        s = specs[0]
        level.put_kv(s.parent, c.tokens[:8], kv[: 8 * {TB}], token_start=0)
        print("registered", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == -signal.SIGKILL and "registered" in p.stdout, p.stderr
    c, kv = conv("k", 100)
    first = c.segment_keys(FP.digest())[0].key
    assert (tmp_path / "cold" / data_name(first)).exists()
    Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40).close()
    with SegmentStore.open(tmp_path / "cold", FP, create=False) as level:
        assert Catalog(level.index).in_flight() == []
    assert not (tmp_path / "cold" / data_name(first)).exists()  # only the dead park named it
    with Store.open(FP, cfg(tmp_path), probe=lambda: 1 << 40) as store:
        store.park(c, kv)
        store.flush()
        assert restored(store, c) == 16


def test_a_segment_moved_down_after_the_lookup_is_read_where_it_is_now(tmp_path: Path) -> None:
    """A restore job names the level each segment was in when it was built; a segment another
    process moved down meanwhile is found where it is now, not taken for damage (no ladder, no
    "damaged segment" for fsck)."""
    from stratastore.restore import FlatKV, restore_batch

    config = {**cfg(tmp_path), "warm_dir": str(tmp_path / "warm"), "warm_mib": 64}
    with Store.open(FP, config, probe=lambda: 1 << 40) as store:
        a, kv = conv("a", 100)
        store.park(a, kv)
        store.flush()
        t = store._tiers
        warm, cold = t.levels[0].store, t.levels[1].store
        dc = on_disk(t, "a")
        assert all(k in warm for _, _, k in dc.segments)
        out = np.zeros(len(a.tokens) * TB, np.uint8)
        job = t.reader.job(dc, len(a.tokens), FlatKV(FP, out))
        for _, _, key in dc.segments:  # what another process's cascade does meanwhile
            cold.relocate_from(warm, key)
        got = restore_batch([job])[0]
        assert not isinstance(got, Exception)
        assert got.tokens == 16 and not got.laddered and not got.damaged
        assert np.array_equal(out, kv)
