"""``fsck --repair`` run over and over beside live writers on one Redis namespace: whatever the
interleaving, the namespace is clean once the writers and the repairs stop (the derived listing
and ``used`` agree with the commit records), and every segment a writer put and did not delete is
still there, whole. A repair acts only on what it judged: it never double-counts a segment the
writer lists meanwhile, never overwrites a byte count a writer moved after its sum."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from stratastore.levels.redis.backend import RedisBackend
from tests.conftest import kv_bytes, run_with_timeout
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.helpers import FP, backend, unique_name

redis = import_or_skip("redis")

ROUNDS = 150  #: puts and deletes per writer
TOKENS = 16


def _writer(
    b: RedisBackend, seed: int, kept: dict[bytes, bytes], errors: list[BaseException]
) -> None:
    rng = np.random.default_rng(seed)
    mine: list[bytes] = []
    try:
        for i in range(ROUNDS):
            toks = np.arange(TOKENS) + seed * 100_000 + i * TOKENS
            kv = kv_bytes(FP, TOKENS, seed=seed * 1000 + i)
            put = b.put_kv(FP.digest(), toks, kv, token_start=0)
            kept[put.key] = kv.tobytes()
            mine.append(put.key)
            if rng.random() < 0.3:  # an eviction of one of its own
                gone = mine.pop(int(rng.integers(len(mine))))
                b.delete(gone)
                kept.pop(gone)
    except BaseException as e:  # for the test's thread
        errors.append(e)


@pytest.mark.parametrize("episode", range(4))  # each interleaving differs: several runs
def test_repairs_beside_two_writers_leave_the_namespace_clean(
    redis_session_server: RedisServer, episode: int
) -> None:
    url, name = redis_session_server.url, unique_name(f"race{episode}")
    writers = [backend(url, name), backend(url, name)]
    checker = backend(url, name)
    kept: list[dict[bytes, bytes]] = [{}, {}]
    errors: list[BaseException] = []
    try:
        threads = [
            threading.Thread(target=_writer, args=(w, n + 1, kept[n], errors), daemon=True)
            for n, w in enumerate(writers)
        ]
        for t in threads:
            t.start()
        repairs = 0

        def repair_while_writing() -> None:
            nonlocal repairs
            while any(t.is_alive() for t in threads) or repairs < 3:
                checker.fsck(repair=True)
                repairs += 1

        run_with_timeout(repair_while_writing, 600)
        for t in threads:
            t.join()
        assert not errors, errors
        rep = checker.fsck(deep=True)
        assert rep.clean, (
            f"after {repairs} repairs beside two writers: {rep.counts()}, used recorded "
            f"{rep.used_recorded} against {rep.used_actual}"
        )
        for table in kept:
            for key, kv in table.items():
                assert key in checker, "a segment a writer put and kept is gone"
                assert checker.get_bytes(key, max_bytes=1 << 20) == kv
        listed = set(checker.keys())
        assert listed == set(kept[0]) | set(kept[1])
    finally:
        r: Any = redis.Redis(**redis_session_server.client_kwargs(), socket_timeout=30)
        for n in r.scan_iter(match=f"strata/{name}/*", count=1000):
            r.delete(n)
        r.close()
        for b in (*writers, checker):
            b.close()
