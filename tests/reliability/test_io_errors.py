"""Injected I/O errors: the Nth I/O operation of a workload fails once and persistently with EIO,
ENOSPC and EROFS, a write comes back short, an fsync fails with EIO. Every failure reaches the
caller as a typed StrataError (never another exception); after it the store reopens with the
invariants of harness.check: nothing acknowledged is lost, fsck has no errors. (A failed fsync is
never retried on the same descriptor: the durable write gives up, removes its temp file and reports;
see stratastore/io/durable.py.)"""

from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

import pytest

from stratastore import Store, StrataError
from stratastore.io import faults
from stratastore.io.faults import Fault
from tests.reliability import counts
from tests.reliability.harness import FP, VARIANTS, Workload, check, conversation, workloads


def run_faulted(w: Workload, root: Path, fault: Fault) -> set[int]:
    """Run the workload's parks under ``fault``; the conversations acknowledged (flush
    returned). Only StrataError may escape the store."""
    acked: set[int] = set()
    with faults.inject(fault):
        try:
            store = Store.open(FP, w.cfg(root), probe=lambda: 1 << 40)
        except StrataError:
            return acked
        try:
            for i in range(w.parks):
                conv, kv = conversation(i)
                try:
                    store.park(conv, kv)
                    store.flush()
                    if w.durable:
                        acked.add(i)
                except StrataError:
                    pass
        finally:
            with contextlib.suppress(StrataError):
                store.close()
    return acked


def cases(w: Workload, ops: dict[str, int], total: int) -> list[Fault]:
    out = [Fault(nth=k, errno=errno.EIO) for k in range(1, total + 1)]
    if w.name == "park":  # every kind at every step of the simplest workload
        out += [Fault(nth=k, errno=errno.ENOSPC, persistent=True) for k in range(1, total + 1)]
        out += [Fault(nth=k, errno=errno.EROFS, persistent=True) for k in range(1, total + 1)]
        out += [Fault(op="write", nth=k, short=True) for k in range(1, ops["write"] + 1)]
        out += [Fault(op="fsync", nth=k, errno=errno.EIO) for k in range(1, ops["fsync"] + 1)]
        out += [
            Fault(op="fsync_dir", nth=k, errno=errno.EIO) for k in range(1, ops["fsync_dir"] + 1)
        ]
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", ["park", "spill", "degrade", "gc"])
def test_injected_errors(name: str, variant: int, tmp_path: Path) -> None:
    w = workloads(variant)[name]
    root = tmp_path / "root"
    root.mkdir()
    with faults.inject(record=True) as rec:  # the workload's operations, unfaulted
        w.run(root, lambda i: None)
    ops: dict[str, int] = {}
    for op, _ in rec.log:
        ops[op] = ops.get(op, 0) + 1
    fired = 0
    for fault in cases(w, ops, rec.count):
        shutil.rmtree(root)
        root.mkdir()
        acked = run_faulted(w, root, fault)
        fired += fault.fired > 0
        check(w, root, acked)
        counts.add("injected errors")
    assert fired >= rec.count, f"{name}: only {fired} faults fired"
