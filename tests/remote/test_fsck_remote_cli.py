"""``strata --config FILE fsck --remote [--repair --yes] [--json]``, run as a newcomer types it, in
a process of its own, against a real ``redis-server``: it checks every namespace of the config's
store name (each model's) and nothing else on the server, says what it found, repairs only with
``--yes``, and exits 0 only when every namespace is clean (after a repair: when it is clean when
checked again). User errors are a message and an exit code, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from stratastore.levels.redis.backend import RedisBackend
from stratastore.levels.redis.settings import RemoteSettings
from tests.conftest import kv_bytes, tiny_fp
from tests.redis_servers import RedisServer, free_port
from tests.remote.conftest import import_or_skip

redis = import_or_skip("redis")

REPO = Path(__file__).resolve().parents[2]
FP_A, FP_B = tiny_fp("fsck/model-a"), tiny_fp("fsck/model-b")
PART = 4096


def strata(
    tmp: Path, url: str, name: str, *args: str, password: str = ""
) -> subprocess.CompletedProcess[str]:
    """``strata --config tmp/strata.toml ARGS`` with a config naming ``url`` and ``name``."""
    cfg = tmp / "strata.toml"
    lines = [
        f'cold_dir = "{tmp / "cold"}"',
        "cold_mib = 64",
        f'remote_url = "{url}"',
        f'remote_name = "{name}"',
        "remote_mib = 64",
        "remote_timeout_ms = 2000",
    ]
    if password:
        lines.append(f'remote_password = "{password}"')
    cfg.write_text("\n".join(lines) + "\n")
    return subprocess.run(
        [sys.executable, "-m", "stratastore.cli", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def backend(url: str, name: str, fp: Any) -> RedisBackend:
    return RedisBackend.open(RemoteSettings(url, name=name, part_bytes=PART), fp)


def snapshot(r: Any, pattern: str) -> dict[bytes, Any]:
    """Every key matching ``pattern`` with its type and value (what must not change)."""
    out: dict[bytes, Any] = {}
    for k in r.scan_iter(match=pattern, count=1000):
        kind = r.type(k)
        out[k] = (kind, r.dump(k))
    return out


def no_traceback(got: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in got.stderr and "Traceback" not in got.stdout, got.stderr


def test_fsck_remote_checks_repairs_and_touches_nothing_else(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = redis_server.url
    mine_a, mine_b = backend(url, "shop", FP_A), backend(url, "shop", FP_B)
    theirs = backend(url, "shop-2", FP_A)  # another store name: a prefix of ours is not ours
    r = redis.Redis(**redis_server.client_kwargs(), socket_timeout=10)
    try:
        keep = mine_a.put_kv(FP_A.digest(), np.arange(100), kv_bytes(FP_A, 100), token_start=0).key
        lose = mine_a.put_kv(
            FP_A.digest(), np.arange(300, 400), kv_bytes(FP_A, 100, 1), token_start=0
        ).key
        other_model = mine_b.put_kv(
            FP_B.digest(), np.arange(50), kv_bytes(FP_B, 50), token_start=0
        ).key
        theirs.put_kv(FP_A.digest(), np.arange(100), kv_bytes(FP_A, 100), token_start=0)
        theirs._r.delete(theirs._part(keep, theirs._need(keep).nonce, 0))  # damage, not ours
        r.set(b"unrelated", b"v")
        c = mine_a._need(lose)
        r.delete(mine_a._part(lose, c.nonce, 1))  # a part evicted
        r.set(mine_a._part(keep, "0" * 32, 0), b"left over")  # an orphan part (no expiry)
        r.incrby(mine_a._used, 777)
        r.set(mine_a.ns + "notes/by-hand", b"a name of another shape: never judged")
        foreign = snapshot(r, "strata/shop-2/*") | snapshot(r, "unrelated")
        before = snapshot(r, "strata/shop/*")

        got = strata(tmp_path, url, "shop", "fsck", "--remote")
        no_traceback(got)
        assert got.returncode == 1, got.stdout + got.stderr
        assert "2 namespace(s)" in got.stdout, got.stdout
        lines = {
            ln.split(": ", 1)[1].split(" ", 1)[0]: ln
            for ln in got.stdout.splitlines()
            if ": strata/" in ln
        }
        assert lines[mine_a.ns].startswith("NOT CLEAN") and "missing_parts=1" in lines[mine_a.ns]
        assert "orphan_parts=1" in lines[mine_a.ns]
        assert lines[mine_b.ns].startswith("ok")
        assert snapshot(r, "strata/shop/*") == before, "fsck without --repair changed keys"

        doc = json.loads(strata(tmp_path, url, "shop", "fsck", "--remote", "--json").stdout)
        rows = {row["namespace"]: row for row in doc["namespaces"]}
        assert doc["not_clean"] == 1 and set(rows) == {mine_a.ns, mine_b.ns}
        assert rows[mine_a.ns]["missing_parts"] == 1 and rows[mine_a.ns]["orphan_parts"] == 1
        assert rows[mine_a.ns]["used_recorded"] != rows[mine_a.ns]["used_actual"]

        refused = strata(tmp_path, url, "shop", "fsck", "--remote", "--repair")
        no_traceback(refused)
        assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
        assert snapshot(r, "strata/shop/*") == before, "--repair without --yes changed keys"

        fixed = strata(tmp_path, url, "shop", "fsck", "--remote", "--repair", "--yes")
        no_traceback(fixed)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        again = strata(tmp_path, url, "shop", "fsck", "--remote")
        assert again.returncode == 0 and "NOT CLEAN" not in again.stdout, again.stdout
        assert mine_a.keys() == [keep] and mine_a.used() == mine_a.record(keep).total_bytes
        assert mine_a.get_bytes(keep, max_bytes=1 << 20) == kv_bytes(FP_A, 100).tobytes()
        assert mine_b.keys() == [other_model]
        assert r.get(mine_a.ns + "notes/by-hand") is not None
        assert snapshot(r, "strata/shop-2/*") | snapshot(r, "unrelated") == foreign
    finally:
        r.close()
        for b in (mine_a, mine_b, theirs):
            b.close()


def test_fsck_remote_user_errors_are_messages(redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.url
    cfg = tmp_path / "plain.toml"
    cfg.write_text(f'cold_dir = "{tmp_path / "cold"}"\ncold_mib = 64\n')
    cases = [
        (
            [sys.executable, "-m", "stratastore.cli", "--config", str(cfg), "fsck", "--remote"],
            "remote_url",
        ),
        ([sys.executable, "-m", "stratastore.cli", "fsck", "--remote"], "--config"),
    ]
    for argv, named in cases:
        got = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        no_traceback(got)
        assert got.returncode == 2 and named in got.stderr, (argv, got.stderr)
    with_path = strata(tmp_path, url, "shop", "fsck", "--remote", str(tmp_path))
    no_traceback(with_path)
    assert with_path.returncode == 2 and "PATH" in with_path.stderr, with_path.stderr
    down = strata(tmp_path, f"redis://127.0.0.1:{free_port()}/0", "shop", "fsck", "--remote")
    no_traceback(down)
    assert down.returncode != 0 and "redis://127.0.0.1:" in down.stderr, down.stderr


def test_fsck_remote_never_shows_the_password(
    redis_auth_server: RedisServer, tmp_path: Path
) -> None:
    from tests.remote.conftest import AUTH_PASSWORD

    url = f"redis://127.0.0.1:{redis_auth_server.port}/0"
    ok = strata(tmp_path, url, "shop", "fsck", "--remote", "--json", password=AUTH_PASSWORD)
    no_traceback(ok)
    assert ok.returncode == 0, ok.stderr
    wrong = strata(tmp_path, url, "shop", "fsck", "--remote", password="not-" + AUTH_PASSWORD)
    no_traceback(wrong)
    assert wrong.returncode != 0
    for got in (ok, wrong):
        assert AUTH_PASSWORD not in got.stdout + got.stderr
