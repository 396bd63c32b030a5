"""A remote restore that falls short is done again from the local levels (tiers/restore.py, the
fallback to the local sources alone). The redo must never leave the caller with less than the remote
level had already delivered, validated, nor with bytes past the prefix it reports that are neither
the caller's nor zero."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import (
    BOUND,
    FP,
    conversation,
    evict_parts,
    flip_local,
    open_store,
    park,
    segment_of,
    store_config,
    unique_name,
)

import_or_skip("redis")


TB = FP.token_bytes


def _setup(url: str, tmp_path: Path, name: str) -> np.ndarray:
    """Node A: tokens [0, 120) cut at 40/80, pushed. Node B (local only): the same tokens
    [0, 100) cut at 50, its segment [0, 50) damaged at token 20. A's part [80, 120) evicted."""
    a_conv, kv = conversation("a", 1000, [40, 80, 120], seed=7)
    b_conv, _ = conversation("b", 1000, [50, 100], seed=7)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        park(a, a_conv, kv)
    finally:
        run_with_timeout(a.close, BOUND)
    local = open_store(store_config(tmp_path, "b", None, name))
    try:
        park(local, b_conv, kv[: 100 * TB])
    finally:
        run_with_timeout(local.close, BOUND)
    flip_local(tmp_path / "b", segment_of(b_conv, 0), 20 * TB + 3)
    assert evict_parts(url, name, segment_of(a_conv, 80)) >= 1
    return kv


def test_a_local_redo_never_delivers_less_than_the_remote_restore_did(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """The remote restore validates and delivers 80 tokens (a part of [80, 120) evicted); B's
    disk "holds" 100, so the restore is done again from it, which ladders at its damage
    (token 20). The caller gets 20 tokens where 80 valid ones were already in its buffer:
    the redo made the restore worse, and "a remote failure never costs a restore what is
    local" turned into a local failure costing what the remote level delivered."""
    name = unique_name()
    url = redis_session_server.url
    kv = _setup(url, tmp_path, name)
    b = open_store(store_config(tmp_path, "b", url, name))
    try:
        out = np.zeros(120 * TB, np.uint8)
        got = run_with_timeout(lambda: b.restore(np.arange(1000, 1120), out), BOUND)
        n = got.tokens * TB
        assert np.array_equal(out[:n], kv[:n])
        assert got.tokens >= 80, f"the remote level delivered 80 validated tokens; got {got}"
    finally:
        run_with_timeout(b.close, BOUND)


def test_a_local_redo_leaves_no_remote_bytes_past_the_prefix_it_reports(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """Same setup: after the redo reports its (shorter) prefix, the destination past it still
    holds what the remote restore wrote (tokens [20, 80)): neither the caller's bytes (zero
    here) nor zero. Every restore path otherwise zeroes what lies past the prefix it reports
    (restore/two_pass.py Delivery.finish, disk_read.resume_state)."""
    name = unique_name()
    url = redis_session_server.url
    _setup(url, tmp_path, name)
    b = open_store(store_config(tmp_path, "b", url, name))
    try:
        out = np.zeros(120 * TB, np.uint8)
        got = run_with_timeout(lambda: b.restore(np.arange(1000, 1120), out), BOUND)
        n = got.tokens * TB
        stale = np.flatnonzero(out[n:])
        assert not stale.size, (
            f"restored {got.tokens} tokens, but bytes from token "
            f"{(n + stale[0]) // TB} on are non-zero"
        )
    finally:
        run_with_timeout(b.close, BOUND)


def test_a_hybrid_redo_never_resumes_below_the_remote_state_delivered(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """A hybrid model (running states). Node A parks [0, 128) checkpointed at 64 and 128 with
    a state at each; node B's disk holds [0, 96) checkpointed at 32 and 96, a state at 32 only.
    A's part of [64, 128) is evicted: the remote restore delivers 64 tokens and the state at
    64. The local lookup says 96 (the checkpoint, not a state), so the restore is redone from
    disk, which resumes at its state at 32: the caller gets 32 tokens where it had 64 and a
    valid state. `local[n]` (tiered.py) counts a disk checkpoint as resumable."""
    name = unique_name()
    url = redis_session_server.url
    a_conv, kv = conversation("a", 1000, [64, 128], seed=5)
    b_conv, _ = conversation("b", 1000, [32, 96], seed=5)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        run_with_timeout(lambda: a.park(a_conv, kv.copy(), {64: b"s64", 128: b"s128"}), BOUND)
        run_with_timeout(a.flush, BOUND)
    finally:
        run_with_timeout(a.close, BOUND)
    local = open_store(store_config(tmp_path, "b", None, name))
    try:
        run_with_timeout(lambda: local.park(b_conv, kv[: 96 * TB].copy(), {32: b"s32"}), BOUND)
        run_with_timeout(local.flush, BOUND)
    finally:
        run_with_timeout(local.close, BOUND)
    assert evict_parts(url, name, segment_of(a_conv, 64)) >= 1
    b = open_store(store_config(tmp_path, "b", url, name))
    try:
        out = np.zeros(128 * TB, np.uint8)
        got = run_with_timeout(lambda: b.restore(np.arange(1000, 1128), out), BOUND)
        n = got.tokens * TB
        assert np.array_equal(out[:n], kv[:n]) and not out[n:].any()
        assert (got.tokens, got.state) == (64, b"s64"), got
    finally:
        run_with_timeout(b.close, BOUND)
