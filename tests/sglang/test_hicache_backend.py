"""SGLang HiCache's storage backend on stratastore (``stratastore.adapters.sglang``), built by
SGLang 0.5.23's own ``StorageBackendFactory`` (the ``dynamic`` backend) and driven as its
``HiCacheController`` drives a backend (:mod:`strata_harness.sglang_hicache`), beside SGLang's
``file`` backend on the same pages: pages written and read back byte-identical in both host layouts,
by the zero-copy and the generic calls; a fresh process served what the last one wrote; a flipped
byte is a miss from that page on (the ``file`` backend delivers it as it is); a kill -9 during
writes leaves a store ``strata fsck --deep`` finds clean with every acknowledged page served; two
processes share one Redis level; another model's level refuses to open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import redis_servers
from tests.fresh_process import run_step
from tests.fsck_cli import fsck_deep
from tests.remote.conftest import import_or_skip, redis_binaries_or_skip

ROOT = Path(__file__).resolve().parents[2]
TOKENS = list(range(3, 3 + 64 * 40))  #: 40 pages of 64 tokens


@pytest.fixture
def model(tmp_path: Path) -> str:
    """A weights file: the backend's identity reads every byte of it."""
    path = tmp_path / "weights.safetensors.bin"
    path.write_bytes(os.urandom(4096))
    return str(path)


def levels(path: Path) -> list[dict[str, Any]]:
    return [{"spec": str(path), "budget_bytes": 256 << 20}]


def phase(**args: Any) -> dict[str, Any]:
    return run_step("tests.sglang.phases", args)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("interface_v1", [1, 0])
def test_pages_read_back_byte_identical(
    tmp_path: Path, model: str, layout: str, interface_v1: int
) -> None:
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from strata_harness.sglang_hicache import STRATA, backup, hashes, prefetch, storage_config
    from strata_harness.sglang_host_pool import CpuHostPool

    pool = CpuHostPool(layout=layout, size=64 * 16)
    for i in range(8):
        pool.fill(i * 64, 100 + i)
    extra = {**STRATA, "interface_v1": interface_v1, "levels": levels(tmp_path / "l")}
    cfg = storage_config(extra, model, page_first=layout == "page_first")
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    keys = hashes(TOKENS, 64)[:8]
    try:
        assert b.batch_exists(keys) == 0
        assert backup(b, pool, keys)
        assert b.batch_exists(keys) == 8 and b.exists(keys[3])
        assert backup(b, pool, keys)  # again: held already, True
        assert not pool.get_data_page(8 * 64).any()
        assert prefetch(b, pool, keys, first_page=8) == 8  # into the pool's other slots
        for i in range(8):
            assert pool.get_data_page((8 + i) * 64).equal(pool.get_data_page(i * 64))
        assert b.get(keys[2]).equal(pool.get_data_page(2 * 64))
        assert b.get("not-a-stored-page") is None
    finally:
        b.close()


def test_the_generic_calls_serve_pages_before_any_host_pool_is_registered(
    tmp_path: Path, model: str
) -> None:
    import torch
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from strata_harness.sglang_hicache import STRATA, hashes, storage_config

    cfg = storage_config({**STRATA, "levels": levels(tmp_path / "l")}, model)
    b = StorageBackendFactory.create_backend("dynamic", cfg, None)
    keys = hashes(TOKENS, 64)[:3]
    pages = [torch.randn(4096, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    try:
        assert b.batch_set(keys, pages) and b.set(keys[0], pages[0])
        assert b.batch_exists(keys) == 3 and not b.exists("another page")
        into = [torch.empty(4096) for _ in keys]
        got = b.batch_get(keys, into)
        assert all(g is t and g.equal(p) for g, t, p in zip(got, into, pages, strict=True))
        assert b.get(keys[1]).view(torch.float32).equal(pages[1])  # as bytes, no pool to shape
    finally:
        b.close()


def test_a_fresh_process_is_served_what_the_last_one_wrote(tmp_path: Path, model: str) -> None:
    where = levels(tmp_path / "l")
    common = {"kind": "strata", "where": where, "model": model, "tokens": TOKENS, "seed": 7}
    assert phase(op="set", pages=24, **common)["set"] == 24
    assert phase(op="get", pages=24, **common) == {"read": 24, "wrong": 0}


def _flip_in(files: list[Path]) -> None:
    for path in files:
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0x01
        path.write_bytes(bytes(raw))


def test_a_flipped_byte_is_a_miss_where_the_file_backend_delivers_it(
    tmp_path: Path, model: str
) -> None:
    """Page 5 of 12 damaged in each backend's files: stratastore serves the 5 before it and
    recomputes from there; SGLang's ``file`` backend serves all 12, one of them wrong."""
    from strata_harness.sglang_hicache import backend, hashes
    from strata_harness.sglang_host_pool import CpuHostPool
    from stratastore.chunks import stored_key
    from stratastore.format import data_name

    damaged = hashes(TOKENS, 64)[5]
    got = {}
    for kind, where in [("strata", levels(tmp_path / "l")), ("file", tmp_path / "f")]:
        common = {"kind": kind, "where": where, "model": model, "tokens": TOKENS, "seed": 3}
        phase(op="set", pages=12, batch=1, **common)
        if kind == "strata":  # the page's data file, by the key it is stored under
            b = backend(kind, where, CpuHostPool(size=12 * 64), model)
            target = tmp_path / "l" / data_name(stored_key(b.chunk_key_of(damaged)))
            b.close()
        else:  # SGLang's file backend names a page's file by its hash and a suffix
            (target,) = (tmp_path / "f").glob(f"{damaged}*.bin")
        assert target.is_file(), sorted(p.name for p in target.parent.iterdir())
        _flip_in([target])
        got[kind] = phase(op="get", pages=12, **common)
    assert got["strata"] == {"read": 5, "wrong": 0, "miss_slot_untouched": True}
    assert got["file"] == {"read": 12, "wrong": 1}


def test_a_kill_during_writes_leaves_a_clean_store_serving_every_acknowledged_page(
    tmp_path: Path, model: str
) -> None:
    where = levels(tmp_path / "l")
    args = {"op": "set", "kind": "strata", "where": where, "model": model, "tokens": TOKENS}
    args |= {"seed": 11, "pages": 40, "batch": 2}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.sglang.phases", json.dumps(args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        acked = 0
        while acked < 6:  # three batches acknowledged, the fourth in flight when killed
            line = proc.stdout.readline().split()
            assert line[:1] == ["acked"], line
            acked = int(line[1])
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    fsck = fsck_deep(tmp_path / "l")
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    got = phase(**{**args, "op": "get"})
    assert got["read"] >= acked and got["wrong"] == 0


def test_two_processes_share_one_redis_level(tmp_path: Path, model: str) -> None:
    found = redis_binaries_or_skip()  # fails instead with STRATA_REQUIRE_REDIS=1
    import_or_skip("redis")
    with redis_servers.RedisServer(tmp_path / "redis", binaries=found) as server:
        shared = {"spec": server.url, "budget_bytes": 64 << 20, "settings": {"name": "hicache"}}
        one = {"kind": "strata", "model": model, "tokens": TOKENS, "seed": 5, "pages": 10}
        phase(op="set", where=[shared], **one)  # one instance writes to the Redis level
        # another instance, its own disk level above the same Redis level, is served from it
        other = [{"spec": str(tmp_path / "b"), "budget_bytes": 64 << 20}, shared]
        assert phase(op="get", where=other, **one) == {"read": 10, "wrong": 0}


def test_pages_of_another_shard_or_format_are_other_keys(tmp_path: Path, model: str) -> None:
    import torch

    from strata_harness.sglang_hicache import backend, backup, hashes
    from strata_harness.sglang_host_pool import CpuHostPool
    from stratastore.errors import ConfigError

    where = levels(tmp_path / "l")
    keys = hashes(TOKENS, 64)[:2]

    def written(pool: CpuHostPool, **kw: Any) -> Any:
        b = backend("strata", where, pool, model, **kw)
        assert backup(b, pool, keys)
        return b

    b = written(CpuHostPool(dtype=torch.bfloat16))
    assert b.batch_exists(keys) == 2
    b.close()
    for pool, kw in [
        (CpuHostPool(dtype=torch.float16), {}),  # another dtype
        (CpuHostPool(layout="layer_first"), {}),  # another layout
        (CpuHostPool(), {"tp": (1, 2)}),  # another shard
    ]:
        other = backend("strata", where, pool, model, **kw)
        assert other.batch_exists(keys) == 0, kw or pool.layout
        other.close()
    with pytest.raises(ConfigError, match="kv_cache_dtype"):  # bytes, format unknown: refused
        backend("strata", where, CpuHostPool(dtype=torch.uint8), model)
    e4m3 = written(CpuHostPool(dtype=torch.uint8), kv_cache_dtype="fp8_e4m3")
    e4m3.close()
    e5m2 = backend(
        "strata", where, CpuHostPool(dtype=torch.uint8), model, kv_cache_dtype="fp8_e5m2"
    )
    assert e5m2.batch_exists(keys) == 0  # another fp8 format: another key
    e5m2.close()


def test_a_hybrid_models_state_pools_fail_the_attach_and_clear_removes_nothing(
    tmp_path: Path, model: str
) -> None:
    from strata_harness.sglang_hicache import backend, backup, hashes
    from strata_harness.sglang_host_pool import CpuHostPool
    from stratastore.errors import ConfigError

    pool = CpuHostPool()
    b = backend("strata", levels(tmp_path / "l"), pool, model)
    keys = hashes(TOKENS, 64)[:2]
    assert backup(b, pool, keys)
    with pytest.raises(NotImplementedError, match="keeps every acknowledged page"):
        b.clear()
    assert b.batch_exists(keys) == 2
    b.register_mem_host_pool_v2(CpuHostPool(), "mamba")
    with pytest.raises(ConfigError, match="mamba"):
        b.on_host_pools_registered()
    b.close()


def test_another_models_level_refuses_to_open(tmp_path: Path, model: str) -> None:
    from strata_harness.sglang_hicache import backend, backup, hashes
    from strata_harness.sglang_host_pool import CpuHostPool
    from stratastore.format import IncompatibleFingerprint

    where = levels(tmp_path / "l")
    pool = CpuHostPool()
    b = backend("strata", where, pool, model)
    assert backup(b, pool, hashes(TOKENS, 64)[:1])
    b.close()
    other = tmp_path / "other-weights.bin"
    other.write_bytes(os.urandom(4096))
    with pytest.raises(IncompatibleFingerprint):
        backend("strata", where, pool, str(other))


def test_settings_it_cannot_use_are_refused_by_name(tmp_path: Path, model: str) -> None:
    from strata_harness.sglang_hicache import backend
    from strata_harness.sglang_host_pool import CpuHostPool
    from stratastore.errors import ConfigError

    pool = CpuHostPool()
    with pytest.raises(ConfigError, match="levels"):
        backend("strata", [], pool, model)
    with pytest.raises(ConfigError, match="budget"):
        backend("strata", [{"spec": str(tmp_path / "l")}], pool, model)
    with pytest.raises(ConfigError, match="cannot be read"):  # a settings file that is not there
        backend("strata", levels(tmp_path / "l"), pool, model, strata_config="/no/such.toml")
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        backend("strata", levels(tmp_path / "l"), pool, model, kv_cache_dtype=8)
