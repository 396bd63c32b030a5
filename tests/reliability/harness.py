"""The reliability suite's machinery: canonical workloads over a real Store, a fork-based loop
that crashes a workload at every I/O step k, and the invariant check run after every fault.

"Nothing lost": after the fault, reopen; fsck reports zero errors; every acknowledged
park restores byte-identical; an in-flight one is whole or invisible (a restore returns 0 tokens
or a checkpoint's worth, never a byte that differs); the ladder never returns bytes that fail
validation (every restore below compares the bytes it got).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store
from stratastore.chain import as_tokens
from stratastore.format import data_name
from stratastore.format.manifest import decode_manifest
from stratastore.format.naming import TEMP_PREFIX, chain_name
from stratastore.io import faults
from stratastore.io.faults import CRASH_EXIT, Fault
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from stratastore.ops.repair import repair
from tests.reliability.counts import SCALE

#: 2 layers x 4 kv heads x 64 dims fp16: 2 KiB a token, 32 KiB pages of 16 tokens
FP = ModelFingerprint.create(
    "test/reliability", n_layers=2, n_kv_heads=4, head_dim=64, page_tokens=16
)
TB = FP.token_bytes
N_TOKENS = 96  # 192 KiB a conversation, checkpoints every 32 tokens


def conversation(i: int) -> tuple[Conversation, np.ndarray]:
    toks = np.arange(N_TOKENS) + 1000 * (i + 1)
    lengths = [32, 64, N_TOKENS]
    conv = Conversation(
        f"conv{i}", as_tokens(toks), [Checkpoint(x) for x in lengths], cuts=[0, 32, 64]
    )
    kv = np.random.default_rng(i).integers(0, 256, N_TOKENS * TB, dtype=np.uint8)
    return conv, kv


@dataclass
class Workload:
    """A canonical workload: ``prepare`` (not faulted) builds its starting store, ``run`` is the
    faulted part and calls ``ack(i)`` once conversation ``i`` is durable; ``config`` opens the
    Store that checks it; ``may_evict``: capacity GC may legitimately remove acknowledged parks
    (then only the newest must survive); ``parks``: conversations it may have written."""

    name: str
    config: dict[str, Any]
    parks: int
    run: Callable[[Path, Callable[[int], None]], None]
    prepare: Callable[[Path], None] | None = None
    may_evict: bool = False
    faults: list[Fault] = field(default_factory=list)  #: installed with the crash point
    durable: bool = True  #: a flushed park is durable (not for RAM parks), so it is acknowledged

    def cfg(self, root: Path) -> dict[str, Any]:
        return {k: (str(root / v) if k.endswith("_dir") else v) for k, v in self.config.items()}

    def dirs(self, root: Path) -> list[str]:
        return [str(root / v) for k, v in self.config.items() if k.endswith("_dir")]


def _park_all(w: Workload) -> Callable[[Path, Callable[[int], None]], None]:
    def run(root: Path, ack: Callable[[int], None]) -> None:
        with Store.open(FP, w.cfg(root), probe=lambda: 1 << 40) as store:
            for i in range(w.parks):
                conv, kv = conversation(i)
                store.park(conv, kv)
                store.flush()
                if w.durable:
                    ack(i)

    return run


def _damage(park: Workload) -> Callable[[Path], None]:
    """The park workload, then by hand: a flipped page byte in conv0's last segment, an orphan
    temp file, a deleted index (what fsck --repair must fix)."""
    return lambda root: _damage_after(park, root)


def _damage_after(park: Workload, root: Path) -> None:
    park.run(root, lambda i: None)
    cold = root / "cold"
    m = decode_manifest((cold / chain_name("conv0")).read_bytes())
    seg = cold / data_name(next(k for s, _, k in m.segments if s == 64))
    raw = bytearray(seg.read_bytes())
    raw[4096 + 100] ^= 0x01
    seg.write_bytes(bytes(raw))
    (cold / f"{TEMP_PREFIX}orphan").write_bytes(b"x" * 100)
    shutil.rmtree(cold / "strata-index", ignore_errors=True)


def _repair(root: Path, ack: Callable[[int], None]) -> None:
    repair([str(root / "cold")])


def _rebuild(root: Path, ack: Callable[[int], None]) -> None:
    with SegmentStore.open(root / "cold", FP):
        pass


def _drop_index(park: Workload) -> Callable[[Path], None]:
    def prepare(root: Path) -> None:
        park.run(root, lambda i: None)
        shutil.rmtree(root / "cold" / "strata-index")

    return prepare


def workloads(variant: int = 0) -> dict[str, Workload]:
    """The canonical workloads; ``variant`` v parks v more conversations in each (``make soak``
    runs variants 0..9: longer histories, more degradation and GC)."""
    ws = {
        "park": Workload(
            "park",
            {"ram_mib": 0, "cold_dir": "cold", "cold_mib": 64},
            3 + variant,
            run=lambda r, a: None,
        ),
        # warm holds about five conversations: the later parks degrade the oldest to cold, by
        # copy (link fails with EXDEV, as across volumes)
        "degrade": Workload(
            "degrade",
            {"ram_mib": 0, "warm_dir": "warm", "warm_mib": 1, "cold_dir": "cold", "cold_mib": 64},
            7 + variant,
            run=lambda r, a: None,
            faults=[Fault(op="link", errno=errno.EXDEV, persistent=True)],
        ),
        # parks go to RAM (4 slots) and only what RAM evicts is spilled to cold; a RAM park is
        # not durable, so nothing is acknowledged: after a fault, whatever restores is whole
        "spill": Workload(
            "spill",
            {"ram_mib": 4, "slots": 4, "spill_on": "evict", "cold_dir": "cold", "cold_mib": 64},
            7 + variant,
            run=lambda r, a: None,
            may_evict=True,
            durable=False,
        ),
        # cold holds about four conversations: the later parks evict the oldest
        "gc": Workload(
            "gc",
            {"ram_mib": 0, "cold_dir": "cold", "cold_mib": 1},
            7 + variant,
            run=lambda r, a: None,
            may_evict=True,
        ),
    }
    for w in ws.values():
        w.run = _park_all(w)
    park = ws["park"]
    ws["repair"] = Workload("repair", dict(park.config), park.parks, _repair, prepare=_damage(park))
    ws["rebuild"] = Workload(
        "rebuild", dict(park.config), park.parks, _rebuild, prepare=_drop_index(park)
    )
    return ws


WORKLOADS = workloads()
VARIANTS = range(SCALE)


def check(w: Workload, root: Path, acked: set[int], *, isolate_index: bool = False) -> None:
    """The invariants after a fault (see the module docstring). fsck reads the LMDB index in
    this process (``isolate_index=False``): every index here is written by LMDB itself, in a
    process that at worst dies or sees faults injected into the store's own io layer (never
    into LMDB's writes), so it is a real LMDB commit, which cannot SIGBUS its reader; the
    isolated read (a Python started per directory per crash point) is fsck's default for
    indexes of unknown history and has tests of its own (tests/unit/ops/test_fsck_no_signal.py)."""
    if w.name == "repair":
        repair(w.dirs(root))  # an interrupted repair is finished by the next one
    with Store.open(FP, w.cfg(root), probe=lambda: 1 << 40) as store:
        got = {}
        for i in range(w.parks):
            conv, kv = conversation(i)
            out = np.zeros_like(kv)
            n = store.restore(conv.tokens, out).tokens
            assert n in (0, 32, 64, N_TOKENS), f"{w.name}: conv{i} restored {n} tokens"
            assert np.array_equal(out[: n * TB], kv[: n * TB]), f"{w.name}: conv{i} bytes differ"
            assert not out[n * TB :].any(), f"{w.name}: conv{i} got bytes past its prefix"
            got[i] = n
    damaged = {0} if w.name == "repair" else set()  # its last segment was flipped by hand
    for i in acked | (set(range(w.parks)) if w.prepare else set()):
        if w.may_evict and i != max(acked, default=-1):
            continue
        want = 64 if i in damaged else N_TOKENS
        assert got[i] == want, f"{w.name}: acknowledged conv{i} restored {got[i]} tokens"
    errors = [f for f in fsck(w.dirs(root), isolate_index=isolate_index) if f.severity == "error"]
    assert not errors, f"{w.name}: fsck errors {errors}"


def crash_at(w: Workload, root: Path, k: int) -> tuple[bool, set[int]]:
    """Run ``w`` in a forked child that ends at its I/O operation ``k`` (``os._exit``, as a
    kill); returns (it completed, the conversations it acknowledged)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    if w.prepare is not None:
        w.prepare(root)
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            fresh = [dataclasses.replace(f) for f in w.faults]  # counters start at 0
            with faults.inject(*fresh, crash_at=k):
                w.run(root, lambda i: os.write(wfd, f"{i}\n".encode()) and None)
        except BaseException as e:  # reported through the exit status
            os.write(2, f"workload {w.name} raised {type(e).__name__}: {e}\n".encode())
            code = 3
        os._exit(code)
    os.close(wfd)
    chunks = []
    while data := os.read(r, 4096):
        chunks.append(data)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, CRASH_EXIT), f"{w.name}: crash point {k}: the child exited {code}"
    return code == 0, {int(x) for x in b"".join(chunks).split()}


def evidence(w: Workload, root: Path) -> None:
    """After a completed run: the workload did what it is named for."""
    cold = list((root / "cold").glob("strata-conv-*.seg"))
    if w.name == "degrade":
        assert cold, "degrade: nothing reached the cold level"
        assert list((root / "warm").glob("strata-conv-*.seg")), "degrade: warm is empty"
    if w.name == "spill":
        assert cold, "spill: RAM evicted nothing to the cold level"
    if w.name == "gc":
        with Store.open(FP, w.cfg(root), probe=lambda: 1 << 40) as store:
            assert store.lookup(conversation(0)[0].tokens) is None, "gc: nothing was evicted"
    if w.name == "repair":
        assert list((root / "cold" / "strata-quarantine").iterdir()), "repair: no quarantine"
