"""A keyed Redis level (spec F-KEYED), against a real ``redis-server``: a node without the key
planting segments in the shared namespace (valid under plain BLAKE3, or claiming a made-up key
id) never has them delivered to a node with the key (a miss, counted ``unauthenticated``,
never deleted by a read), ``fsck --remote`` finds them (``SIDECAR_UNAUTHENTICATED``) and says
it cannot check keyed records without the key (``KEYED_UNCHECKED``); keyed nodes share
segments, and a rotation reads the old key's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stratastore.format import KeyRequired, LevelKeys, NotAuthenticated
from stratastore.format.level_key import PageHasher, derive_key
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.redis.backend import RedisBackend
from stratastore.levels.redis.settings import RemoteSettings
from tests.conftest import kv_bytes, tiny_fp
from tests.redis_servers import RedisServer
from tests.remote.conftest import import_or_skip
from tests.remote.test_faults import unique_name
from tests.remote.test_fsck_remote_cli import no_traceback, strata

redis = import_or_skip("redis")
FP = tiny_fp()
SECRET1 = b"first-test-secret-of-the-redis-level"
SECRET2 = b"second-test-secret-after-rotation-x"


def key_file(tmp: Path, *secrets: bytes, name: str = "level.key") -> str:
    path = tmp / name
    path.write_bytes(b"\n".join(secrets) + b"\n")
    path.chmod(0o600)
    return str(path)


def level(url: str, name: str, keyfile: str = "") -> RedisBackend:
    return RedisBackend.open(RemoteSettings(url, name=name, key_file=keyfile), FP)


def test_planted_records_are_never_delivered_and_fsck_finds_them(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = unique_name()
    kf = key_file(tmp_path, SECRET1)
    keyed, planter = level(redis_server.url, name, kf), level(redis_server.url, name)
    try:
        good = keyed.put_kv(FP.digest(), np.arange(32), kv_bytes(FP, 32), token_start=0).key
        plain = planter.put_kv(FP.digest(), np.arange(100, 132), kv_bytes(FP, 32, 1), token_start=0)
        forged = RedisBackend.open(RemoteSettings(redis_server.url, name=name), FP)
        forged.level_keys = LevelKeys([b"the planter's own made-up secret"])
        made_up = forged.put_kv(
            FP.digest(), np.arange(200, 232), kv_bytes(FP, 32, 2), token_start=0
        )
        forged.close()
        out = bytearray(32 * FP.token_bytes)
        keyed.get_into(good, out)
        assert bytes(out) == kv_bytes(FP, 32).tobytes()
        for key in (plain.key, made_up.key):
            assert key in keyed  # listed, but never delivered
            with pytest.raises(NotAuthenticated):
                keyed.get_into(key, out)
        assert keyed.counters["unauthenticated"] == 2
        assert set(keyed.fsck().unauthenticated) == {plain.key, made_up.key}
        with pytest.raises(KeyRequired):  # the keyless node cannot read the keyed record
            planter.get_into(good, out)
    finally:
        keyed.close()
        planter.close()
    checked = strata(tmp_path, redis_server.url, name, "fsck", "--remote", "--json")
    no_traceback(checked)
    [ns] = json.loads(checked.stdout)["namespaces"]
    # no key in the config: the two keyed records (the genuine one, the made-up one) are counted,
    # never judged; the planted unkeyed one is valid to a keyless check
    assert ns["keyed_unchecked"] == 2 and ns["unauthenticated"] == 0 and ns["clean"]
    assert [f["id"] for f in ns["findings"]] == ["KEYED_UNCHECKED"]
    assert SECRET1.decode() not in checked.stdout + checked.stderr


def test_keyed_nodes_share_segments_across_a_rotation(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    name = unique_name()
    a = level(redis_server.url, name, key_file(tmp_path, SECRET1))
    b = level(redis_server.url, name, key_file(tmp_path, SECRET2, SECRET1, name="rotated.key"))
    try:
        old = a.put_kv(FP.digest(), np.arange(32), kv_bytes(FP, 32), token_start=0).key
        out = bytearray(32 * FP.token_bytes)
        b.get_into(old, out)  # the rotated node reads the old key's segment
        assert bytes(out) == kv_bytes(FP, 32).tobytes()
        new = b.put_kv(FP.digest(), np.arange(40, 72), kv_bytes(FP, 32, 5), token_start=0).key
        with b.open_reader(new) as seg:
            assert seg.sidecar.hasher == PageHasher(derive_key(SECRET2))
        with pytest.raises((NotAuthenticated, SegmentNotFound)):  # a node not yet rotated
            a.get_into(new, out)
        assert new in a  # and it deletes nothing it cannot read
    finally:
        a.close()
        b.close()
