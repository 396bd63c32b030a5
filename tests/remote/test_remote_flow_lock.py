"""With a remote level, the engine's thread takes the flow's lock twice for a restore the local
levels hold whole (ask and plan in one hold, account: the remote level is not walked), and at
most three times for one the remote level serves (ask, plan after the walk, account); keeping a
copy of a remote read (``remote_keep_local``) takes it once more, to hand the copy to the
write queue."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import THREE, conversation, open_store, park, unique_name
from tests.unit.tiers.test_flow_lock_acquisitions import (
    RESTORE_MOST,
    CountingLock,
    counted,
    on_this_thread,
)

import_or_skip("redis")

__all__ = ["counted"]  # the fixture, used by name


def test_a_restore_with_a_remote_level_takes_the_flow_lock_two_or_three_times(
    redis_server: RedisServer, tmp_path: Path, counted: CountingLock
) -> None:
    # every store opened in this test gets the counting lock; they are open one at a time
    name = unique_name()
    conv, kv = conversation("c", 1000, THREE)
    a = open_store(tmp_path, "a", redis_server.url, name)
    try:
        park(a, conv, kv)
        out = np.zeros(kv.size, np.uint8)
        with on_this_thread(counted) as local:  # the local disk holds it whole: no walk
            assert a.restore(conv.tokens, out).source == "disk"
    finally:
        a.close()
    b = open_store(tmp_path, "b", redis_server.url, name)  # another node: only Redis has it
    try:
        out = np.zeros(kv.size, np.uint8)
        with on_this_thread(counted) as remote:
            assert b.restore(conv.tokens, out).source == "remote"
        assert np.array_equal(out, kv)
        b.flush()
        assert b.stats()["levels"]["remote"]["remote_kept_local"] == 1  # the copy it kept
    finally:
        b.close()
    print(f"restore with a remote level: local hit {local['taken']}, remote {remote['taken']}")
    assert local["taken"] == 2
    assert 1 <= remote["taken"] <= RESTORE_MOST + 1  # + handing the kept copy over
