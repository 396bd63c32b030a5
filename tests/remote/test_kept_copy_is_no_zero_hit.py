"""A copy kept locally from a remote restore (``remote_keep_local``) carries no checkpoint at
0: the node that kept it still reports an unrelated prompt as a miss (``lookup`` is None, a
restore delivers nothing and counts ``restore_misses``, not ``hits_disk``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import (
    FP,
    THREE,
    conversation,
    open_store,
    park,
    remote_stats,
    restore,
    unique_name,
)

import_or_skip("redis")


def test_a_node_that_kept_a_remote_restore_still_reports_misses(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    a = open_store(tmp_path, "a", redis_server.url, name)
    try:
        park(a, conv, kv)
    finally:
        a.close()
    b = open_store(tmp_path, "b", redis_server.url, name)
    try:
        assert restore(b, conv.tokens, kv, {120}).source == "remote"
        assert remote_stats(b)["levels"]["remote"]["remote_kept_local"] == 1
        b._tiers.view.sync()
        kept = [dc.conv for dc in b._tiers.view.convs.values()]
        assert kept and all(0 not in c.lengths() for c in kept), [c.lengths() for c in kept]
        before = remote_stats(b)
        unrelated = np.arange(9000, 9064)
        assert b.lookup(unrelated) is None
        got = restore(b, unrelated, np.zeros(64 * FP.token_bytes, np.uint8), {0})
        assert (got.source, got.tokens) == ("none", 0)
        after = remote_stats(b)
        assert after["restore_misses"] == before["restore_misses"] + 1
        assert after["hits_disk"] == before["hits_disk"]
    finally:
        b.close()
