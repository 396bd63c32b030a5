"""Fixtures that start real ``redis-server`` processes (tests/redis_servers.py) for the tests of
the Redis-backed storage level; each yields a RedisServer or RedisCluster and stops it after.

Without ``redis-server``/``redis-cli`` every test using them skips, naming ``make test`` (which
runs tools/ensure_redis.sh) and ``apt-get install redis-server``, and so does a test module that
needs the ``redis`` client (the ``redis`` extra) when it is missing (:func:`import_or_skip`);
with STRATA_REQUIRE_REDIS=1 (.ci/run) they fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests import redis_servers
from tests.redis_servers import RedisCluster, RedisServer, TlsFiles, make_tls_files

REQUIRE_ENV = "STRATA_REQUIRE_REDIS"
AUTH_PASSWORD = "s3cret-pw"  # redis_auth_server's requirepass (the default user)
ALICE_PASSWORD = "alice-pw"  # redis_auth_server's ACL user alice: keys strata/alice/* only
ALICE_ACL = f"user alice on >{ALICE_PASSWORD} ~strata/alice/* +@all"


def redis_binaries_or_skip() -> tuple[str, str]:
    """The paths of redis-server and redis-cli; skips the test when they are missing, or fails
    it when STRATA_REQUIRE_REDIS=1."""
    found = redis_servers.find_redis()
    if found is not None:
        return found
    msg = (
        "redis-server/redis-cli not found: `make test` installs them (tools/ensure_redis.sh), "
        "or run `apt-get install redis-server`"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires them)", pytrace=False)
    pytest.skip(msg)


def import_or_skip(name: str) -> ModuleType:
    """``import name`` (the ``redis`` client, ``redis.cluster``); when it is missing, skips the
    module naming the ``redis`` extra, or fails it when STRATA_REQUIRE_REDIS=1."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        msg = (
            f"{name} not importable ({e}): `make test` installs the redis extra "
            "(pip install -e '.[redis]')"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires it)", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


@pytest.fixture(scope="session")
def redis_bin() -> tuple[str, str]:
    """(redis-server, redis-cli) paths, or skip (fail under STRATA_REQUIRE_REDIS=1)."""
    return redis_binaries_or_skip()


@pytest.fixture
def redis_server(redis_bin: tuple[str, str], tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh standalone server for this test only, in ``tmp_path / "redis"`` (kill it, fill
    it, restart it at will)."""
    with RedisServer(tmp_path / "redis", binaries=redis_bin) as server:
        yield server


@pytest.fixture(scope="session")
def redis_session_server(
    redis_bin: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """One standalone server shared by the session: use distinct keys, never kill it."""
    with RedisServer(tmp_path_factory.mktemp("redis-session"), binaries=redis_bin) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(
    redis_bin: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisCluster]:
    """A 3-master cluster (no replicas) shared by the session, cluster_state:ok."""
    with RedisCluster(tmp_path_factory.mktemp("redis-cluster"), binaries=redis_bin) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A test CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def redis_tls_server(
    redis_bin: tuple[str, str], tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A standalone server serving TLS only (no plain port; client certificates optional)."""
    d = tmp_path_factory.mktemp("redis-tls")
    with RedisServer(d, tls=tls_files, binaries=redis_bin) as server:
        yield server


@pytest.fixture(scope="session")
def redis_auth_server(
    redis_bin: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A standalone server with requirepass AUTH_PASSWORD and the ACL user alice
    (ALICE_PASSWORD), who may touch the keys ``strata/alice/*`` only."""
    d = tmp_path_factory.mktemp("redis-auth")
    with RedisServer(
        d, password=AUTH_PASSWORD, acl_users=[ALICE_ACL], binaries=redis_bin
    ) as server:
        yield server
