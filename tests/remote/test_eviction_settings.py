"""``remote_eviction = "redis"`` leaves the remote level's budget to the server: a Store says at
open, naming the server and the fix, when that server will never evict the level's keys (no
``maxmemory``, or a ``volatile-*`` policy: committed parts carry no expiry), and says nothing when
it will (``allkeys-lru``) or when the store keeps its own budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stratastore import Store
from tests.conftest import tiny_fp
from tests.redis_servers import RedisCluster, RedisServer
from tests.remote.conftest import import_or_skip

import_or_skip("redis")


def _open_warnings(tmp: Path, url: str, **settings: Any) -> list[str]:
    cfg = {
        "ram_mib": 0,
        "cold_dir": str(tmp / "cold"),
        "cold_mib": 16,
        "remote_url": url,
        "remote_name": "evict",
        "remote_eviction": "redis",
        **settings,
    }
    warns: list[str] = []
    with Store.open(tiny_fp(), cfg, warn=warns.append):
        pass
    return [w for w in warns if "maxmemory" in w]


@pytest.mark.parametrize(
    ("maxmemory", "policy", "warned"),
    [
        (None, None, True),  # the defaults: no maxmemory, noeviction
        ("16mb", "volatile-lru", True),  # evicts only keys with an expiry: never a committed part
        ("16mb", "noeviction", True),
        ("16mb", "allkeys-lru", False),
        ("16mb", "allkeys-lfu", False),
    ],
)
def test_a_server_that_never_evicts_is_said_at_open(
    redis_bin: tuple[str, str],
    tmp_path: Path,
    maxmemory: str | None,
    policy: str | None,
    warned: bool,
) -> None:
    kw: dict[str, Any] = {}
    if maxmemory is not None:
        kw.update(maxmemory=maxmemory, maxmemory_policy=policy)
    with RedisServer(tmp_path / "redis", binaries=redis_bin, **kw) as server:
        got = _open_warnings(tmp_path, server.url)
    if warned:
        assert len(got) == 1, got
        assert f"127.0.0.1:{server.port}" in got[0] and "allkeys-lru" in got[0], got
        assert "remote_eviction" in got[0] and "remote_mib" in got[0], got
    else:
        assert got == []


def test_a_cluster_names_each_primary_that_never_evicts(
    redis_cluster: RedisCluster, tmp_path: Path
) -> None:
    got = _open_warnings(tmp_path, redis_cluster.url)
    assert len(got) == 3, got  # the session's cluster: three primaries, no maxmemory


def test_the_store_s_own_budget_needs_no_server_setting(
    redis_session_server: RedisServer, tmp_path: Path
) -> None:
    got = _open_warnings(tmp_path, redis_session_server.url, remote_eviction="store", remote_mib=16)
    assert got == []
