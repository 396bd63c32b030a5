"""Review 2: a remote_keep_local copy that does not land (tiers/tiered.py _keep_local,
write_disk_now; facade.py _write). The README: "that copy is the store's own, so a write of it
that fails or does not fit is warned and counted (`remote_kept_local_errors`)". It is no park:
it must not count as a discarded park or a refused spill, nor as a copy kept."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.review.helpers import (
    BOUND,
    conversation,
    open_store,
    park,
    store_config,
    unique_name,
)

import_or_skip("redis")


def test_a_kept_copy_that_does_not_land_is_counted_once_and_only_as_such(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    """Node B (a 1 MiB disk level) restores a 1.5 MiB conversation from the remote level; its
    kept-local copy does not fit. Before: discards=1 and spills_refused=1 (no park was
    discarded: the caller parked nothing), and remote_kept_local=1 beside
    remote_kept_local_errors=1 for the one copy that never landed."""
    name = unique_name()
    url = redis_session_server.url
    n = 24576
    conv, kv = conversation("big", 100, list(range(4096, n + 1, 4096)), seed=9)
    a = open_store(store_config(tmp_path, "a", url, name))
    try:
        park(a, conv, kv)
    finally:
        run_with_timeout(a.close, BOUND)
    b = open_store(store_config(tmp_path, "b", url, name, cold_mib=1))
    try:
        out = np.zeros_like(kv)
        got = run_with_timeout(lambda: b.restore(np.arange(100, 100 + n), out), BOUND)
        assert (got.source, got.tokens) == ("remote", n)
        run_with_timeout(b.flush, BOUND)
        s = b.stats()
        remote = s["levels"]["remote"]
        seen = {"discards": s["discards"], "spills_refused": s["spills_refused"],
                "remote_kept_local": remote["remote_kept_local"],
                "remote_kept_local_errors": remote["remote_kept_local_errors"]}  # fmt: skip
        assert seen == {"discards": 0, "spills_refused": 0, "remote_kept_local": 0,
                        "remote_kept_local_errors": 1}, seen  # fmt: skip
    finally:
        run_with_timeout(b.close, BOUND)
