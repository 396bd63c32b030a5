"""The test infrastructure itself (tests/redis_servers.py, tests/remote/conftest.py), against the
real redis-server and the real ``redis`` client: standalone, AUTH and ACL, TLS, a 3-master
cluster with a slot migration under a live client, crash and restart, and the safety nets that
stop servers whose owner forgot them or died."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import redis_servers
from tests.redis_servers import RedisCluster, RedisServer, RedisServerError, TlsFiles
from tests.remote.conftest import (
    ALICE_PASSWORD,
    AUTH_PASSWORD,
    import_or_skip,
    redis_binaries_or_skip,
)

redis = import_or_skip("redis")
redis_cluster_client = import_or_skip("redis.cluster")

REPO = Path(__file__).resolve().parents[2]


def once() -> dict[str, object]:
    """Client kwargs for one attempt, no retries (redis-py retries connection errors, with
    backoff, by default: a refused login would take seconds)."""
    return {"retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0), "socket_timeout": 5}


def refuses(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is refused."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_standalone_ping_set_get(redis_session_server: RedisServer) -> None:
    s = redis_session_server
    assert s.url == f"redis://127.0.0.1:{s.port}" and s.running and s.pid
    r = redis.Redis(**s.client_kwargs(), socket_timeout=5)
    assert r.ping() is True
    r.set("infra/standalone", b"\x00value\xff")
    assert r.get("infra/standalone") == b"\x00value\xff"
    assert s.execute("GET", "infra/standalone") == b"\x00value\xff"
    assert s.cli("STRLEN", "infra/standalone").strip() == "7"
    with pytest.raises(RedisServerError, match="not an integer"):  # redis-cli -e: exit 1
        s.cli("INCR", "infra/standalone")
    r.close()


def test_auth_password_and_acl_user(redis_auth_server: RedisServer) -> None:
    s = redis_auth_server
    host, port = s.host, s.port
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=host, port=port, **once()).get("strata/alice/x")
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=host, port=port, password="wrong", **once()).ping()
    admin = redis.Redis(host=host, port=port, password=AUTH_PASSWORD, socket_timeout=5)
    admin.set("elsewhere", "1")
    alice = redis.Redis(
        host=host, port=port, username="alice", password=ALICE_PASSWORD, socket_timeout=5
    )
    alice.set("strata/alice/x", "a")
    assert alice.get("strata/alice/x") == b"a"
    with pytest.raises(redis.exceptions.NoPermissionError):
        alice.get("elsewhere")
    with pytest.raises(redis.exceptions.NoPermissionError):
        alice.set("strata/bob/x", "b")
    assert s.cli("GET", "strata/alice/x", user="alice", password=ALICE_PASSWORD).strip() == "a"
    with pytest.raises(RedisServerError, match="NOPERM"):
        s.cli("GET", "elsewhere", user="alice", password=ALICE_PASSWORD)
    for c in (admin, alice):
        c.close()


def test_tls_only(redis_tls_server: RedisServer, tls_files: TlsFiles) -> None:
    s = redis_tls_server
    assert s.url == f"rediss://127.0.0.1:{s.port}"
    plain = redis.Redis(host=s.host, port=s.port, socket_connect_timeout=5, **once())
    with pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()
    r = redis.Redis(
        host=s.host, port=s.port, ssl=True, ssl_ca_certs=str(tls_files.ca), socket_timeout=5
    )
    assert r.ping() is True
    r.set("infra/tls", "t")
    assert s.cli("GET", "infra/tls").strip() == "t"
    r.close()


def test_tls_client_certificate_required(
    redis_bin: tuple[str, str], tls_files: TlsFiles, tmp_path: Path
) -> None:
    with RedisServer(tmp_path, tls=tls_files, tls_auth_clients=True, binaries=redis_bin) as s:
        no_cert = redis.Redis(
            host=s.host, port=s.port, ssl=True, ssl_ca_certs=str(tls_files.ca), **once()
        )
        with pytest.raises(redis.exceptions.ConnectionError):
            no_cert.ping()
        assert redis.Redis(**s.client_kwargs(), socket_timeout=5).ping() is True


def test_cluster_keys_hash_tags_and_slot_migration(redis_cluster: RedisCluster) -> None:
    c = redis_cluster
    assert c.url == "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in c.nodes)
    assert len(c.seeds) == 3
    nodes = [redis_cluster_client.ClusterNode(n.host, n.port) for n in c.nodes]
    rc = redis_cluster_client.RedisCluster(startup_nodes=nodes, socket_timeout=5)
    keys = [f"infra/cluster/{i}" for i in range(100)]
    for k in keys:
        rc.set(k, k)
    assert [rc.get(k) for k in keys] == [k.encode() for k in keys]
    owners = {c.slot_owner(c.keyslot(k)).port for k in keys}
    assert len(owners) == 3  # 100 keys spread over the 3 masters

    tagged = [f"infra/{{conv-7}}/page/{i}" for i in range(10)]
    assert len({c.keyslot(k) for k in tagged}) == 1
    assert len({rc.keyslot(k) for k in tagged}) == 1
    slot = c.keyslot(tagged[0])
    source = c.slot_owner(slot)
    # the cluster is shared by the session: other tests' keys may already hash to this slot
    before = source.execute("CLUSTER", "COUNTKEYSINSLOT", slot)
    assert isinstance(before, int)
    rc.mset({k: "p" for k in tagged})  # one slot: a single-node multi-key command works
    assert source.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == before + 10

    c.move_slot_of(tagged[0])  # moves every key of the slot, the other tests' too
    target = c.slot_owner(slot)
    assert target is not source
    assert target.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == before + 10
    assert source.execute("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    with pytest.raises(redis_servers.RedisReplyError, match="MOVED"):
        source.execute("GET", tagged[0])
    # the client still holds the old slot map: it gets MOVED from the source and follows it
    assert rc.get(tagged[3]) == b"p"
    assert rc.mget(tagged) == [b"p"] * 10
    c.wait_ok(10)
    rc.close()


def test_kill_refuses_connections_and_restart(redis_server: RedisServer) -> None:
    s = redis_server
    s.execute("SET", "k", "v")
    pid = s.pid
    assert pid is not None
    s.kill()
    assert not s.running and refuses(s.host, s.port)
    with pytest.raises(OSError):
        os.kill(pid, 0)  # reaped, not a zombie
    s.kill()
    s.stop()  # both idempotent
    s.start()  # same port, same dir; the data is gone (no persistence)
    assert s.running and s.pid != pid
    assert s.execute("GET", "k") is None
    s.stop()
    assert refuses(s.host, s.port)


def test_maxmemory_noeviction(redis_bin: tuple[str, str], tmp_path: Path) -> None:
    with RedisServer(
        tmp_path, maxmemory="2mb", maxmemory_policy="noeviction", binaries=redis_bin
    ) as s:
        assert s.execute("CONFIG", "GET", "maxmemory-policy") == [
            b"maxmemory-policy",
            b"noeviction",
        ]
        r = redis.Redis(**s.client_kwargs(), socket_timeout=5)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(10):
                r.set(f"big/{i}", b"x" * 500_000)
        r.close()


def test_port_taken_by_another_process_is_retried(
    redis_bin: tuple[str, str], tmp_path: Path
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        s = RedisServer(tmp_path, binaries=redis_bin, start=False)
        s.port = taken
        with s:
            assert s.port != taken and s.execute("PING") == b"PONG"
        with pytest.raises(RedisServerError, match="exited"):
            RedisServer(tmp_path / "fixed", port=taken, binaries=redis_bin)


def _child(code: str) -> subprocess.Popen[str]:
    script = f"import sys\nsys.path.insert(0, {str(REPO)!r})\n" + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_atexit_stops_forgotten_servers(redis_bin: tuple[str, str], tmp_path: Path) -> None:
    child = _child(f"""
        from tests.redis_servers import RedisServer
        s = RedisServer({str(tmp_path)!r})
        print(s.port, flush=True)
        """)  # the server is never stopped: the atexit hook kills it
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    assert refuses("127.0.0.1", int(out))


@pytest.mark.skipif(redis_servers._pdeathsig_prefix() == [], reason="no setpriv (util-linux)")
def test_killed_owner_takes_its_servers_along(redis_bin: tuple[str, str], tmp_path: Path) -> None:
    child = _child(f"""
        import time
        from tests.redis_servers import RedisServer
        s = RedisServer({str(tmp_path)!r})
        print(s.port, flush=True)
        time.sleep(60)
        """)
    with child:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)  # no atexit: the kernel's parent-death signal does it
        child.wait(10)
    deadline = time.monotonic() + 5
    while not refuses("127.0.0.1", port):
        assert time.monotonic() < deadline, "the server outlived its killed owner"
        time.sleep(0.01)


def test_missing_binaries_skip_or_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_servers, "find_redis", lambda: None)
    monkeypatch.delenv("STRATA_REQUIRE_REDIS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="make test"):
        redis_binaries_or_skip()
    with pytest.raises(pytest.skip.Exception, match="redis extra"):
        import_or_skip("redis._no_such_module")
    monkeypatch.setenv("STRATA_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install redis-server"):
        redis_binaries_or_skip()
    with pytest.raises(pytest.fail.Exception, match="redis extra"):
        import_or_skip("redis._no_such_module")
