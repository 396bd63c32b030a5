"""A restore from the remote level keeps local copies (``remote_keep_local``); when one copy
fails (here, out of memory as it is fetched), the copies already kept are still handed to the
write queue: written by the next flush, never left reserved and pending in the outbox."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore.tiers.remote import RemoteLevel
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import THREE, conversation, open_store, park, unique_name

import_or_skip("redis")


def test_copies_kept_before_a_failed_one_are_written(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique_name()
    x, kx = conversation("x", 1000, THREE)
    y, ky = conversation("y", 5000, THREE)
    a = open_store(tmp_path, "a", redis_server.url, name)
    try:
        park(a, x, kx)
        park(a, y, ky)
    finally:
        a.close()
    b = open_store(tmp_path, "b", redis_server.url, name)  # only Redis holds them
    try:
        fetch, calls = RemoteLevel.fetch, [0]

        def failing_second(self: RemoteLevel, *args: Any) -> Any:
            calls[0] += 1
            if calls[0] == 2:
                raise MemoryError("out of memory fetching the second kept copy (injected)")
            return fetch(self, *args)

        monkeypatch.setattr(RemoteLevel, "fetch", failing_second)
        outs = [np.zeros(kx.size, np.uint8), np.zeros(ky.size, np.uint8)]
        with pytest.raises(MemoryError):
            b.restore_many([(x.tokens, outs[0]), (y.tokens, outs[1])])
        monkeypatch.setattr(RemoteLevel, "fetch", fetch)
        b.flush()
        assert b.describe().pending == ()  # nothing left waiting in the outbox
        assert b.lookup(x.tokens) == ("disk", len(x.tokens))  # the first copy, written
        assert b.stats()["levels"]["remote"]["remote_kept_local"] == 1
    finally:
        b.close()
