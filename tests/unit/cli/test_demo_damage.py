"""``strata demo`` shows its point for any request count: the byte it damages is in a segment the
restore reads, so the restore stops there and fsck finds exactly it.

With 120 requests the old demo damaged a segment behind a hole capacity GC had left, and printed
"DAMAGE NOT DETECTED"; with one request nothing reached disk and it damaged nothing. The four
runs take about 25 s together. After each, fsck finds no segment a chain does not reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_harness import demo
from stratastore.ops.fsck import fsck


@pytest.mark.parametrize("requests", [1, 20, 60, 120])
def test_the_demo_damages_a_segment_its_restore_reads(
    tmp_path: Path,
    requests: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(demo, "_real_model_phase", lambda path: True)  # the store's part only
    rc = demo.run_demo(str(tmp_path), requests, kept=False)
    out = capsys.readouterr().out
    assert "DAMAGE NOT DETECTED" not in out
    assert "stopping at the damaged segment" in out
    assert "fsck                              only the flipped byte: " in out
    assert rc == 0, out[-2000:]
    # GC leaves no hole, so every segment on disk is reached by some chain (once, GC did:
    # 120 requests left 54 SEGMENT_UNREACHABLE and 6 CHAIN_BROKEN)
    ids = [f.id for f in fsck([str(tmp_path)])]
    assert "SEGMENT_UNREACHABLE" not in ids and "CHAIN_BROKEN" not in ids, ids
