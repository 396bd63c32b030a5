"""Two engine nodes sharing one remote level, against a real ``redis-server`` and a real 3-master
Redis Cluster: node A and node B are two processes (tests/remote/node_worker.py), each with its own
local cold directory and the same remote URL.

What they show: B restores, validated, what A parked; a segment parked by both (one after the
other, or both at once) is stored once; the local levels stay the first choice and what B read
from the remote level is kept locally (``remote_keep_local``), so B serves it with the server
stopped; with ``remote_keep_local=false`` B reads the remote level every time and keeps nothing;
a longer prefix on the remote level wins over B's shorter local one; two stores of different
``remote_name`` on one server never see each other's conversations; a hybrid model resumes at a
running state read from the remote level.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratastore.levels.redis.backend import RedisBackend
from stratastore.levels.redis.settings import RemoteSettings
from tests.redis_servers import RedisCluster, RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.node_worker import fingerprint, kv

import_or_skip("redis")

REPO = Path(__file__).resolve().parents[2]
FP = fingerprint()
TB = FP.token_bytes
#: seconds one node process may take before the test fails naming it: it takes well under one
#: on an idle machine, but its imports alone can take many seconds on two loaded cores, and
#: a hang fails this test all the same
NODE_TIMEOUT = 300


@dataclass
class Remote:
    url: str
    kind: str


@pytest.fixture(params=["standalone", "cluster"])
def remote(request: pytest.FixtureRequest) -> Remote:
    """The shared server (session-scoped: every test uses a remote_name of its own)."""
    fixture = "redis_session_server" if request.param == "standalone" else "redis_cluster"
    return Remote(str(request.getfixturevalue(fixture).url), request.param)


@pytest.fixture(params=["standalone", "cluster"])
def own_remote(
    request: pytest.FixtureRequest, redis_bin: tuple[str, str], tmp_path: Path
) -> Iterator[tuple[Remote, RedisServer | RedisCluster]]:
    """A server (or cluster) of this test only, which it may stop."""
    server: RedisServer | RedisCluster
    if request.param == "standalone":
        server = RedisServer(tmp_path / "redis", binaries=redis_bin)
    else:
        server = RedisCluster(tmp_path / "cluster", binaries=redis_bin)
    try:
        yield Remote(server.url, request.param), server
    finally:
        server.stop()


def unique_name() -> str:
    return "tn-" + uuid.uuid4().hex[:16]


def conv_op(
    cid: str,
    tokens: list[int],
    ends: list[int],
    seed: int,
    *,
    kv_tokens: int | None = None,
    states: dict[int, bytes] | None = None,
) -> dict[str, Any]:
    """A park of ``tokens`` cut (and checkpointed) at each of ``ends``; its K/V is
    ``kv(seed, kv_tokens)`` cut to the tokens (see node_worker)."""
    return {
        "op": "park",
        "id": cid,
        "tokens": tokens,
        "checkpoints": [0, *ends],
        "cuts": [0, *ends[:-1]],
        "seed": seed,
        "kv_tokens": kv_tokens,
        "states": {str(k): v.hex() for k, v in (states or {}).items()},
    }


def sha(seed: int, tokens: int, kv_tokens: int | None = None) -> str:
    """The SHA-256 of the first ``tokens`` tokens of the K/V ``conv_op`` parks for ``seed``."""
    data = kv(FP, seed, kv_tokens or tokens)[: tokens * TB]
    return hashlib.sha256(data.tobytes()).hexdigest()


class Node:
    """One engine node: a local cold directory and the shared remote level; :meth:`run` starts a
    process (node_worker) that opens the Store, runs the operations and closes it."""

    def __init__(self, cold: Path, url: str, name: str, **settings: Any) -> None:
        self.config = {
            "ram_mib": 0,
            "park": "disk",
            "cold_dir": str(cold),
            "cold_mib": 64,
            "remote_url": url,
            "remote_name": name,
            "remote_mib": 64,
            **settings,
        }

    def start(self, *ops: dict[str, Any]) -> subprocess.Popen[str]:
        spec = json.dumps({"config": self.config, "ops": list(ops)})
        return subprocess.Popen(
            [sys.executable, "-m", "tests.remote.node_worker", spec],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def result(p: subprocess.Popen[str]) -> tuple[list[Any], list[str]]:
        try:
            out, err = p.communicate(timeout=NODE_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            pytest.fail(f"a node process did not finish within {NODE_TIMEOUT} s (hangs)")
        assert p.returncode == 0, f"node process failed ({p.returncode}):\n{err[-4000:]}"
        doc = json.loads(out.splitlines()[-1])
        return doc["results"], doc["warnings"]

    def run(self, *ops: dict[str, Any]) -> list[Any]:
        results, _ = self.result(self.start(*ops))
        return results


def inspector(url: str, name: str) -> RedisBackend:
    """A backend on the namespace the nodes share (what a third party sees in Redis)."""
    return RedisBackend.open(RemoteSettings(url, name=name), FP)


def namespace_keys(b: RedisBackend) -> list[bytes]:
    return sorted(b._r.scan_iter(match=b.ns + "*", count=1000))


STATS: dict[str, Any] = {"op": "stats"}
TOKENS = list(range(1000, 1100))  #: A's conversation: segments [0, 40) and [40, 100)
PROMPT = [*TOKENS, 7, 8, 9]  #: the next turn's prompt


def test_node_b_restores_what_node_a_parked(remote: Remote, tmp_path: Path) -> None:
    name = unique_name()
    a = Node(tmp_path / "a", remote.url, name)
    b = Node(tmp_path / "b", remote.url, name)
    park, a_stats = a.run(conv_op("c1", TOKENS, [40, 100], seed=3), STATS)
    assert park == {"where": "disk", "tokens": 100}
    ra = a_stats["levels"]["remote"]
    assert ra["remote_puts"] == 2 and ra["entries"] == 2 and ra["remote_put_errors"] == 0
    assert a_stats["levels"]["cold"]["entries"] == 2  # acknowledged on A's own disk first

    before, got, b_stats = b.run(
        {"op": "lookup", "prompt": PROMPT}, {"op": "restore", "prompt": PROMPT}, STATS
    )
    assert before == ["remote", 100]
    assert got["source"] == "remote" and got["tokens"] == 100
    assert got["sha"] == sha(3, 100) and got["rest_zero"]
    assert b_stats["hits_remote"] == 1 and b_stats["tokens_restored"] == 100
    assert b_stats["hits_disk"] == 0 and b_stats["restore_misses"] == 0
    rb = b_stats["levels"]["remote"]
    assert rb["remote_hits"] >= 2 and rb["remote_ladder_stops"] == 0
    assert rb["remote_errors"] == 0 and rb["remote_kept_local"] == 1
    assert rb["remote_puts"] == 0  # what B kept locally is not stored again
    assert b_stats["levels"]["cold"]["entries"] == 2


def test_a_segment_parked_by_both_is_stored_once(remote: Remote, tmp_path: Path) -> None:
    """One after the other: B's park of A's conversation changes nothing in Redis; B's park of a
    longer one adds its new segment only. Both at once (two processes): each segment once."""
    name = unique_name()
    a = Node(tmp_path / "a", remote.url, name)
    b = Node(tmp_path / "b", remote.url, name)
    look = inspector(remote.url, name)
    try:
        a.run(conv_op("c1", TOKENS, [40, 100], seed=3))
        keys, used, listed = namespace_keys(look), look.used(), sorted(look.keys())
        assert len(listed) == 2 and used > 0

        park, stats = b.run(conv_op("c1", TOKENS, [40, 100], seed=3), STATS)
        assert park["where"] == "disk" and stats["levels"]["cold"]["entries"] == 2
        rb = stats["levels"]["remote"]
        assert rb["remote_puts"] == 0 and rb["remote_put_errors"] == 0
        assert rb["backend_raced_puts"] == 0
        assert namespace_keys(look) == keys and look.used() == used

        longer = [*TOKENS, *range(5000, 5030)]
        (again,) = b.run(conv_op("c2", longer, [40, 100, 130], seed=3, kv_tokens=130))
        assert again["where"] == "disk"
        now = sorted(look.keys())
        assert set(listed) < set(now) and len(now) == 3  # only the new segment [100, 130)
        (new,) = set(now) - set(listed)
        assert look.used() == used + look.record(new).total_bytes
        look.delete(new)
        assert namespace_keys(look) == keys and look.used() == used

        # both at once: two processes park the same new conversation
        both = list(range(9000, 9096))
        op = conv_op("c3", both, [32, 64, 96], seed=11)
        procs = [a.start(op, STATS), b.start(op, STATS)]
        try:
            results = [Node.result(p)[0] for p in procs]
        finally:
            for p in procs:  # none is left running, whatever failed
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        puts = [r[1]["levels"]["remote"]["remote_puts"] for r in results]
        assert sum(puts) == 3, puts  # three segments, each created by one node only
        report = look.fsck()
        assert report.clean and report.segments == 5, report
        assert look.used() == sum(r.total_bytes for _, r in look.records())
    finally:
        look.close()


def test_local_first_and_kept_locally(
    own_remote: tuple[Remote, RedisServer | RedisCluster], tmp_path: Path
) -> None:
    """B keeps what it read from the remote level (remote_keep_local, the default): its next
    restore is from its own disk, with the server up (the local level is the first choice) and
    with the server stopped."""
    remote, server = own_remote
    name = unique_name()
    a = Node(tmp_path / "a", remote.url, name)
    b = Node(tmp_path / "b", remote.url, name, remote_timeout_ms=2000)
    a.run(conv_op("c1", TOKENS, [40, 100], seed=3))
    got, stats = b.run({"op": "restore", "prompt": PROMPT}, STATS)
    assert got["source"] == "remote" and got["tokens"] == 100 and got["sha"] == sha(3, 100)
    assert stats["levels"]["remote"]["remote_kept_local"] == 1
    assert stats["levels"]["cold"]["entries"] == 2

    seen, again, stats = b.run(
        {"op": "lookup", "prompt": PROMPT}, {"op": "restore", "prompt": PROMPT}, STATS
    )
    assert seen == ["disk", 100]
    assert again["source"] == "disk" and again["tokens"] == 100 and again["sha"] == sha(3, 100)
    assert stats["hits_disk"] == 1 and stats["hits_remote"] == 0

    server.stop()
    seen, again, stats = b.run(
        {"op": "lookup", "prompt": PROMPT}, {"op": "restore", "prompt": PROMPT}, STATS
    )
    assert seen == ["disk", 100]
    assert again["source"] == "disk" and again["tokens"] == 100 and again["sha"] == sha(3, 100)
    assert again["rest_zero"]
    rb = stats["levels"]["remote"]
    assert rb["remote_errors"] >= 1 and rb["remote_hits"] == 0  # the server is down: said
    assert rb["entries"] is None


def test_without_keep_local_b_reads_the_remote_level_every_time(
    remote: Remote, tmp_path: Path
) -> None:
    name = unique_name()
    Node(tmp_path / "a", remote.url, name).run(conv_op("c1", TOKENS, [40, 100], seed=3))
    b = Node(tmp_path / "b", remote.url, name, remote_keep_local=False)
    first, second, stats = b.run(
        {"op": "restore", "prompt": PROMPT}, {"op": "restore", "prompt": PROMPT}, STATS
    )
    (third,) = b.run({"op": "restore", "prompt": PROMPT})
    for got in (first, second, third):
        assert got["source"] == "remote" and got["tokens"] == 100
        assert got["sha"] == sha(3, 100) and got["rest_zero"]
    assert stats["hits_remote"] == 2 and stats["levels"]["remote"]["remote_kept_local"] == 0
    assert stats["levels"]["cold"]["entries"] == 0 and stats["levels"]["cold"]["bytes"] == 0


def test_a_longer_prefix_on_the_remote_level_is_taken_from_it(
    remote: Remote, tmp_path: Path
) -> None:
    """B holds the system prompt locally; A parked the system prompt and two turns: B's prompt
    is restored from the remote level (deeper), a prompt sharing only the system prompt from B's
    own disk (as deep: the local level first)."""
    name = unique_name()
    system = list(range(300, 332))
    turns = [*system, *range(600, 664)]
    a = Node(tmp_path / "a", remote.url, name)
    b = Node(tmp_path / "b", remote.url, name)
    b.run(conv_op("sys", system, [32], seed=21, kv_tokens=96))
    a.run(conv_op("chat", turns, [32, 64, 96], seed=21))
    other = [*system, 1, 2, 3]
    seen, got, local, stats = b.run(
        {"op": "lookup", "prompt": [*turns, 5]},
        {"op": "restore", "prompt": [*turns, 5]},
        {"op": "restore", "prompt": other},
        STATS,
    )
    assert seen == ["remote", 96]
    assert got["source"] == "remote" and got["tokens"] == 96 and got["sha"] == sha(21, 96)
    assert local["source"] == "disk" and local["tokens"] == 32
    assert local["sha"] == sha(21, 32, 96) and local["rest_zero"]
    assert stats["hits_remote"] == 1 and stats["hits_disk"] == 1


def test_two_remote_names_never_see_each_other(remote: Remote, tmp_path: Path) -> None:
    x, y = unique_name(), unique_name()
    a = Node(tmp_path / "a", remote.url, x)
    b = Node(tmp_path / "b", remote.url, y)
    a.run(conv_op("c1", TOKENS, [40, 100], seed=3))
    look_x, look_y = inspector(remote.url, x), inspector(remote.url, y)
    try:
        keys_x = namespace_keys(look_x)
        seen, got, park, stats = b.run(
            {"op": "lookup", "prompt": PROMPT},
            {"op": "restore", "prompt": PROMPT},
            conv_op("c1", TOKENS, [40, 100], seed=3),
            STATS,
        )
        assert seen is None
        assert got["source"] == "none" and got["tokens"] == 0 and got["rest_zero"]
        assert stats["hits_remote"] == 0 and stats["levels"]["remote"]["remote_misses"] >= 2
        # the same conversation parked under y is stored again, in y's namespace only
        assert park["where"] == "disk" and stats["levels"]["remote"]["remote_puts"] == 2
        assert namespace_keys(look_x) == keys_x
        assert sorted(look_y.keys()) == sorted(look_x.keys())  # content keys: equal names
        assert all(k.startswith(look_y.ns.encode()) for k in namespace_keys(look_y))
        assert not set(namespace_keys(look_y)) & set(keys_x)
    finally:
        look_x.close()
        look_y.close()


def test_a_hybrid_model_resumes_at_a_state_from_the_remote_level(
    remote: Remote, tmp_path: Path
) -> None:
    """A parks with a running state at 40 (none at 100): B resumes at 40 with that state, its
    bytes validated and nothing past them; then (kept locally with its state) from its disk."""
    name = unique_name()
    state = b"running state at 40: " + bytes(range(64))
    Node(tmp_path / "a", remote.url, name).run(
        conv_op("h", TOKENS, [40, 100], seed=5, states={40: state})
    )
    b = Node(tmp_path / "b", remote.url, name)
    got, again, stats = b.run(
        {"op": "restore", "prompt": PROMPT}, {"op": "restore", "prompt": PROMPT}, STATS
    )
    assert got["source"] == "remote" and got["tokens"] == 40
    assert got["state"] == state.hex()
    assert got["sha"] == sha(5, 40, 100) and got["rest_zero"]
    assert again["source"] == "disk" and again["tokens"] == 40
    assert again["state"] == state.hex() and again["sha"] == sha(5, 40, 100)
    assert stats["levels"]["remote"]["remote_kept_local"] == 1
