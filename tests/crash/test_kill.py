"""Kill tests (F-DUR-3, F-IDX-4): a writer process dies mid-put (SIGKILL at random times, and
``os._exit`` at every I/O step of a put); after reopening, every acknowledged put is present and
validates byte-identical, nothing half-written is visible, and the index names no missing file.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stratastore.format.naming import TEMP_PREFIX
from stratastore.io.faults import CRASH_ENV, CRASH_EXIT
from stratastore.levels.local import SegmentStore
from tests.conftest import tiny_fp
from tests.crash.lines import Lines
from tests.crash.writer import segment

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("STRATA_KILL_ROUNDS", "12"))


def spawn(
    path: Path, count: int, seed: int, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash.writer", str(path), str(count), str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def acked(stdout: str) -> dict[int, str]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ACK":
            out[int(parts[1])] = parts[2]
    return out


def check_store(path: Path, acks: dict[int, str], seeds: dict[str, tuple[int, int]]) -> int:
    """Reopen and check the invariants; returns how many segments are visible."""
    with SegmentStore.open(path, tiny_fp()) as store:
        visible = {k.hex() for k in store.keys()}
        for key_hex in acks.values():
            assert key_hex in visible, f"acknowledged put {key_hex[:12]} was lost"
        for key_hex in visible:
            key = bytes.fromhex(key_hex)
            assert key_hex in seeds, f"visible segment {key_hex[:12]} was never written"
            seed, i = seeds[key_hex]
            _, payload, _ = segment(i, seed)
            out = np.zeros_like(payload)
            store.get_into(key, out)  # validates every page
            assert np.array_equal(out, payload)
        assert store.skipped == [], store.skipped
        return len(visible)


def expected_keys(seed: int, count: int) -> dict[str, tuple[int, int]]:
    from stratastore.format import segment_key

    root = tiny_fp().digest()
    return {segment_key(root, segment(i, seed)[0]).hex(): (seed, i) for i in range(count)}


@pytest.mark.slow
def test_killed_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(1234)
    path = tmp_path / "s"
    seeds: dict[str, tuple[int, int]] = {}
    all_acks: dict[int, str] = {}
    kills = 0
    for rnd in range(ROUNDS):
        count = 400
        seeds.update(expected_keys(rnd, count))
        proc = spawn(path, count, rnd)
        out = Lines(proc, f"the writer of round {rnd}")
        # its first acknowledgement, not a guess at how long imports take (seconds on a
        # loaded machine): the kill then lands among its puts
        out.wait_for("ACK ")
        time.sleep(rng.uniform(0.0, 1.2))
        proc.send_signal(signal.SIGKILL)
        stdout = out.finish(60)
        kills += proc.returncode == -signal.SIGKILL
        acks = acked(stdout)
        assert acks, f"round {rnd}: the acknowledgement waited for is not in the output"
        all_acks.update({rnd * 1000 + i: k for i, k in acks.items()})
        check_store(path, {i: k for i, k in all_acks.items()}, seeds)
    assert kills >= ROUNDS // 2, "the writer finished before it could be killed; slow it down"
    assert len(all_acks) > 0
    # temp files of killed puts may remain (fsck's ORPHAN_TEMP); they are never adopted
    assert all(
        n.startswith(("strata-conv-", TEMP_PREFIX, "strata-index")) for n in os.listdir(path)
    )


def test_crash_at_every_io_step_of_a_put(tmp_path: Path) -> None:
    """Crash at I/O operation k for every k of a run of 3 puts (one zstd-free, page-spanning)."""
    count = 3
    seeds = expected_keys(7, count)
    k, completed = 0, False
    states = 0
    while not completed:
        k += 1
        path = tmp_path / f"k{k}"
        proc = spawn(path, count, 7, {CRASH_ENV: str(k)})
        stdout, stderr = proc.communicate(timeout=120)
        if proc.returncode == 0:
            completed = True
        else:
            assert proc.returncode == CRASH_EXIT, stderr
        acks = acked(stdout)
        if path.exists():
            visible = check_store(path, acks, seeds)
            assert len(acks) <= visible <= len(acks) + 1  # at most the one in flight
            states += 1
        assert k < 500, "the crash loop does not terminate"
    assert len(acked(stdout)) == count
    assert states >= 3 * 8, f"only {states} crash states were checked"
