"""tools/remote_bench.py, the remote level's benchmark, run at a tiny size in a subprocess: it
starts and stops its own servers (a standalone one and a 3-master cluster), every row runs and is
checked, and the table names every row. Its figures mean nothing at this size and are not looked
at."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_servers import find_redis

ROOT = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "STRATA_REQUIRE_REDIS"
ROWS = (
    "restore from the remote level (validated)",
    "plain MGET, one per segment",
    "plain MGET, all parts in one call",
    "restore from the local cold level (validated)",
    "unvalidated reads through the backend",
    "park to the remote level (put_kv)",
    "plain pipeline SET",
)


def _need_redis() -> None:
    """Skip without redis-server/redis-cli or the redis client; fail with STRATA_REQUIRE_REDIS=1."""
    missing = []
    if find_redis() is None:
        missing.append("redis-server/redis-cli (`apt-get install redis-server`)")
    if importlib.util.find_spec("redis") is None:
        missing.append("the redis client (pip install -e '.[redis]')")
    if not missing:
        return
    msg = f"tools/remote_bench.py needs {' and '.join(missing)}; `make test` installs them"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg} ({REQUIRE_ENV}=1 requires them)", pytrace=False)
    pytest.skip(msg)


def test_the_remote_benchmark_runs_tiny_and_prints_every_row() -> None:
    _need_redis()
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "remote_bench.py"), "8", "--runs", "1"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "8 MiB conversation" in out and "command: " in out and "page cache: warm" in out
    for kind in ("standalone", "cluster"):
        for row in ROWS:
            assert f"| {kind} | {row} |" in out, (kind, row, out)
        assert f"- {kind}: restore from Redis / plain MGET = " in out
