"""Reader clauses of format-spec/SPEC.md that are about behaviour rather than a single file's
bytes (the golden vectors cover the rest)."""

from __future__ import annotations

from pathlib import Path

import lmdb
import numpy as np

from stratastore.format import IndexRecord
from stratastore.format.naming import INDEX_DIR
from stratastore.levels.local import SegmentStore
from tests.conftest import tiny_fp

FP = tiny_fp()


def test_lmdb_key_encoding(tmp_path: Path) -> None:
    """F-IDX-5: ``segments`` maps the raw 32-byte key to the 84-byte record; ``meta`` maps the
    ASCII names ``schema`` (u32 little-endian) and ``fingerprint`` (the 84-byte record)."""
    with SegmentStore.open(tmp_path, FP) as store:
        put = store.put_kv(
            FP.digest(), [1, 2, 3], np.zeros(3 * FP.token_bytes, np.uint8), token_start=0
        )
        sc = store.sidecar(put.key)
    env = lmdb.open(str(tmp_path / INDEX_DIR), subdir=True, readonly=True, lock=False, max_dbs=4)
    try:
        with env.begin() as txn:
            rows = dict(txn.cursor(db=env.open_db(b"segments", txn=txn, create=False)))
            meta = dict(txn.cursor(db=env.open_db(b"meta", txn=txn, create=False)))
    finally:
        env.close()
    assert list(rows) == [put.key] and len(put.key) == 32
    rec = IndexRecord.unpack(rows[put.key])
    assert (rec.kind, rec.token_start, rec.token_end, rec.parent_key) == (
        sc.kind,
        0,
        3,
        FP.digest(),
    )
    assert meta == {b"schema": (1).to_bytes(4, "little"), b"fingerprint": FP.pack()}
