"""stratastore's own segment store runs the shipped abstract suite, and the conformance check
tells a conforming directory from a violating one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stratastore import ModelFingerprint
from stratastore.cli import main
from stratastore.format import data_name
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from stratastore.testing import CLAUSES, StoreTests, check_conformance


class TestSegmentStore(StoreTests):
    def open_store(self, path: Path, fingerprint: ModelFingerprint) -> Any:
        return SegmentStore.open(path, fingerprint)


def test_every_fsck_id_has_a_clause_mapping() -> None:
    from tests.unit.ops.test_findings_table import fsck_ids

    assert fsck_ids() == set(CLAUSES)


def test_violations_name_their_clause(tmp_path: Path) -> None:
    suite = TestSegmentStore()
    fp = suite.fingerprint()
    with SegmentStore.open(tmp_path, fp) as s:
        key = s.put_kv(s.root_key, np.arange(8), suite.kv(8), token_start=0).key
    (tmp_path / "strata-tmp-00-x").write_bytes(b"interrupted")  # allowed after a crash
    (tmp_path / "strata-tmp-00-x").chmod(0o600)  # as the store makes it (F-DIR-9)
    report = check_conformance([str(tmp_path)])
    assert report.conforms and [f.id for f in report.allowed] == ["ORPHAN_TEMP"]
    path = tmp_path / data_name(key)
    path.write_bytes(path.read_bytes()[:-3])
    report = check_conformance([str(tmp_path)])
    assert not report.conforms and "F-SEG-3" in report.violations
    assert main(["conformance", str(tmp_path)]) == 1
    assert any(f.id == "SEGMENT_SIZE_MISMATCH" for f in fsck([str(tmp_path)]))
