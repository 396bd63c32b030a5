"""Kill at every I/O step: each canonical workload (park, spill of what RAM evicts, degrade across
volumes, GC, repair, index rebuild) runs in a forked child that exits at its I/O operation k, for
every k until it completes; after each, the invariants of harness.check hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import counts
from tests.reliability.harness import VARIANTS, WORKLOADS, check, crash_at, evidence, workloads


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_crash_at_every_io_step(name: str, variant: int, tmp_path: Path) -> None:
    w = workloads(variant)[name]
    k, done = 0, False
    while not done:
        k += 1
        assert k < 2000, f"{name}: the crash loop does not terminate"
        done, acked = crash_at(w, tmp_path / "root", k)
        check(w, tmp_path / "root", acked)
        counts.add("kill points")
    assert k > 5, f"{name}: only {k} I/O steps: the workload did not run"
    evidence(w, tmp_path / "root")
