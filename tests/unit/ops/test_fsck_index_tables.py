"""The index's derived ``ages`` and ``totals`` tables (spec F-IDX-7) checked by fsck row by
row, end to end on a store a ``Store`` wrote: a table whose rows disagree with the index's
records while their count is right (``totals`` written big-endian, an ``ages`` key
little-endian) is ``INDEX_TABLES_STALE``, an error, and ``strata fsck --repair`` rebuilds the
tables; what was parked restores whole after it."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from stratastore import Store
from stratastore.cli import main
from stratastore.format.naming import INDEX_DIR
from stratastore.levels.findings import FINDINGS
from stratastore.ops.fsck import fsck
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


def park_some(cold: Path) -> dict[str, tuple[Any, np.ndarray]]:
    """Two conversations parked to disk by a Store; closed, so the store is at rest."""
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64}
    convs = {name: conversation_kv(name, 40, 1000 * i) for i, name in enumerate(("a", "b"))}
    with Store.open(FP, cfg) as store:
        for conv, kv in convs.values():
            store.park(conv, kv.copy())
        store.flush()
    return convs


def edit_table(
    cold: Path, name: bytes, edit: Callable[[dict[bytes, bytes]], dict[bytes, bytes]]
) -> None:
    """Replace every row of the index's table ``name`` by ``edit(rows)``, as a faulty writer
    would leave it (one transaction, nothing else touched)."""
    env = lmdb.open(str(cold / INDEX_DIR), subdir=True, max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(name, txn=txn, create=False)
            rows = {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
            txn.drop(db, delete=False)
            for k, v in edit(rows).items():
                txn.put(k, v, db=db)
    finally:
        env.close()


def totals_big_endian(rows: dict[bytes, bytes]) -> dict[bytes, bytes]:
    (n,) = struct.unpack("<Q", rows[b"bytes"])
    assert n > 0 and struct.pack(">Q", n) != rows[b"bytes"]
    return {b"bytes": struct.pack(">Q", n)}


def ages_little_endian(rows: dict[bytes, bytes]) -> dict[bytes, bytes]:
    first = min(rows)
    (ns,) = struct.unpack(">Q", first[:8])
    out = {k: v for k, v in rows.items() if k != first}
    out[struct.pack("<Q", ns) + first[8:]] = b""  # as many rows as before: only one is wrong
    return out


def restores_whole(cold: Path, convs: dict[str, tuple[Any, np.ndarray]]) -> None:
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        for conv, kv in convs.values():
            out = np.zeros_like(kv)
            r = store.restore(conv.tokens, out)
            assert r.tokens == len(conv.tokens) and np.array_equal(out, kv)


def test_the_finding_is_an_error_of_f_idx_7_that_repair_rebuilds() -> None:
    kind = FINDINGS["INDEX_TABLES_STALE"]
    assert (kind.severity, kind.spec, kind.violates) == ("error", "F-IDX-7", ("F-IDX-7",))
    assert kind.repair.name == "REBUILD_INDEX"


@pytest.mark.parametrize(
    ("table", "edit"),
    [(b"totals", totals_big_endian), (b"ages", ages_little_endian)],
    ids=["totals_big_endian", "ages_little_endian"],
)
def test_a_derived_table_with_the_right_count_and_wrong_rows_is_found_and_rebuilt(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: bytes,
    edit: Callable[[dict[bytes, bytes]], dict[bytes, bytes]],
) -> None:
    cold = tmp_path / "cold"
    convs = park_some(cold)
    assert main(["fsck", str(cold), "--deep"]) == 0
    capsys.readouterr()

    edit_table(cold, table, edit)
    for deep in (False, True):  # names and rows only: every fsck checks it
        found = [f for f in fsck([str(cold)], deep=deep) if f.id == "INDEX_TABLES_STALE"]
        assert [f.object for f in found] == [str(cold / INDEX_DIR / table.decode())], found
    assert main(["fsck", str(cold), "--deep", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in report["findings"] if f["id"] == "INDEX_TABLES_STALE"]
    assert finding["severity"] == "error" and "F-IDX-7" in finding["detail"]

    assert main(["fsck", str(cold), "--repair", "--yes"]) == 0
    capsys.readouterr()
    assert main(["fsck", str(cold), "--deep"]) == 0
    assert [f.id for f in fsck([str(cold)], deep=True)] == []
    restores_whole(cold, convs)


def test_an_index_without_the_derived_tables_has_nothing_to_compare(tmp_path: Path) -> None:
    """An index a 1.0 or 1.1 writer last wrote has no ``ages``/``totals``: not a finding (the
    next open of a writer of 1.2 builds them, F-IDX-7)."""
    cold = tmp_path / "cold"
    park_some(cold)
    env = lmdb.open(str(cold / INDEX_DIR), subdir=True, max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            for name in (b"ages", b"totals"):
                txn.drop(env.open_db(name, txn=txn, create=False), delete=True)
    finally:
        env.close()
    assert [f.id for f in fsck([str(cold)], deep=True)] == []
