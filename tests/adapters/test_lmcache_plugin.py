"""stratastore as an LMCache 0.5.6 storage plugin, with the real ``lmcache`` package
on the CPU: its engine and storage manager load the plugin from ``storage_plugins`` +
``extra_config`` and a small connector copies bytes (``stratastore.adapters.lmcache.cpu``;
LMCache's own mock connector copies nothing).

Prefix chunks store, look up and retrieve bit-identically; a new process retrieves what this
one stored; a flipped byte in one stored chunk is a miss for that chunk and its successors,
never wrong bytes; remove and capacity accounting stay exact over a long put/remove loop; a
kill -9 during puts loses nothing reported durable; pins hold chunks against eviction; reads
run off LMCache's event loop; the engine.md snippet loads as written; the side-by-side benchmark
runs (at a small size, asserting nothing about time). Needs the ``lmcache`` extra (``pip
install -e '.[lmcache]'``); skipped with that reason without it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
torch = pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402

from stratastore.adapters.lmcache import (  # noqa: E402
    PluginSettings,
    PutsFailed,
    StrataStoragePlugin,
    key_fields,
)
from stratastore.adapters.lmcache.chunks import chunk_id  # noqa: E402
from stratastore.adapters.lmcache.store import stored_bytes  # noqa: E402
from stratastore.errors import ConfigError  # noqa: E402
from stratastore.format import IncompatibleFingerprint, data_name, sidecar_name  # noqa: E402
from stratastore.format.keys import state_key  # noqa: E402
from stratastore.ops.fsck import fsck  # noqa: E402
from tests.adapters.lmcache_worker import (  # noqa: E402
    CHUNK,
    PROMPT,
    engine,
    kv,
    plugin,
    prompt,
    retrieve,
    same,
)

ROOT = Path(__file__).resolve().parents[2]
CHUNK_BYTES = stored_bytes(CHUNK * 1024)  #: what one chunk adds to the directory's bytes

Engines = Callable[..., Any]


@pytest.fixture
def engines() -> Iterator[Engines]:
    """``engines(path, **settings)``: a new LMCache engine with the plugin in ``path``;
    ``engines.close(eng)`` destroys one (closing the plugin), the rest go at the end."""
    made: dict[str, Any] = {}

    def make(path: Path, **kw: Any) -> Any:
        name = f"test-{len(made)}-{os.getpid()}"
        made[name] = engine(str(path), name, **kw)
        return made[name]

    def close(eng: Any) -> None:
        LMCacheEngineBuilder.destroy(next(n for n, e in made.items() if e is eng))

    make.close = close  # type: ignore[attr-defined]
    yield make
    for name in made:
        LMCacheEngineBuilder.destroy(name)


def keys_of(eng: Any, tokens: Any) -> list[Any]:
    return [k for _, _, k in eng.token_database.process_tokens(tokens=tokens)]


def chunk_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.startswith("strata-conv-"))


def test_prefix_chunks_store_look_up_and_retrieve_bit_identically(
    engines: Engines, tmp_path: Path
) -> None:
    eng = engines(tmp_path / "d")
    assert isinstance(plugin(eng), StrataStoragePlugin)
    n = PROMPT + CHUNK // 2  # a partial last chunk: LMCache does not store it
    eng.store(prompt(0, n), kvcaches=kv(0, n))
    plugin(eng).flush()
    assert eng.lookup(prompt(0, n)) == PROMPT
    assert retrieve(eng, 0, PROMPT) == (PROMPT, True)
    for t in (CHUNK, 3 * CHUNK):  # prefixes
        assert eng.lookup(prompt(0, t)) == t and retrieve(eng, 0, t) == (t, True)
    shared = prompt(0, PROMPT).clone()
    shared[2 * CHUNK + 5] += 1  # another prompt sharing the first two chunks
    assert eng.lookup(shared) == 2 * CHUNK
    out = torch.zeros_like(kv(0))
    assert int(eng.retrieve(shared, kvcaches=out).sum()) == 2 * CHUNK
    assert same(out[:, :, : 2 * CHUNK], kv(0)[:, :, : 2 * CHUNK])
    s = plugin(eng).stats()
    assert (s["puts"], s["entries"], s["damaged"]) == (8, 8, 0) and s["hits"] >= 8 + 1 + 3 + 2
    layout_bytes = stored_bytes(len(plugin(eng).chunks.layout.encode()))
    assert s["used_bytes"] == 8 * CHUNK_BYTES + layout_bytes
    assert "strata_lmcache_hits_total" in plugin(eng).prometheus()
    eng.store(prompt(0), kvcaches=kv(0))  # again: nothing written
    plugin(eng).flush()
    assert plugin(eng).stats()["puts"] == 8 and plugin(eng).stats()["puts_deduped"] == 8


def run_worker(*args: str, **kw: Any) -> Any:
    env = dict(
        os.environ, PYTHONHASHSEED="123", LMCACHE_LOG_LEVEL="ERROR", LMCACHE_TRACK_USAGE="false"
    )
    cmd = [sys.executable, "-m", "tests.adapters.lmcache_worker", *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, **kw)


def test_a_new_process_retrieves_what_this_one_stored(engines: Engines, tmp_path: Path) -> None:
    """The plugin's keys come from the chunk keys' fields, not from ``hash()``; the worker runs
    under another hash seed than this process (LMCache hashes token ids, which ``hash()``
    does not salt; string extra keys would need one ``PYTHONHASHSEED``)."""
    eng = engines(tmp_path / "d")
    for i in range(3):
        eng.store(prompt(i), kvcaches=kv(i))
    plugin(eng).flush()
    engines.close(eng)  # type: ignore[attr-defined]
    proc = run_worker("check", str(tmp_path / "d"), "3")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == [[PROMPT, True]] * 3


def test_a_flipped_byte_is_a_miss_for_its_chunk_and_its_successors(
    engines: Engines, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "d"
    eng = engines(d)
    eng.store(prompt(0), kvcaches=kv(0))
    plugin(eng).flush()
    bad = state_key(chunk_id(key_fields(keys_of(eng, prompt(0))[3])))
    engines.close(eng)  # type: ignore[attr-defined]
    with open(d / data_name(bad), "r+b") as f:  # one byte inside chunk 3's K/V
        f.seek(4096 + 1000)
        b = f.read(1)
        f.seek(4096 + 1000)
        f.write(bytes([b[0] ^ 0x40]))
    found = [(x.id, Path(x.object).name) for x in fsck([str(d)]) if x.severity == "error"]
    assert found == [("PAGE_HASH_MISMATCH", data_name(bad))]
    eng = engines(d)
    assert eng.lookup(prompt(0)) == PROMPT  # the index cannot know; the read finds out
    with caplog.at_level("WARNING", logger="stratastore.adapters.lmcache"):
        assert retrieve(eng, 0) == (3 * CHUNK, True)  # chunks 0-2, the rest left zero
    assert f"LMCache chunk {bad.hex()[:16]} is damaged (ChecksumMismatch" in caplog.text
    assert plugin(eng).stats()["damaged"] == 1
    assert eng.lookup(prompt(0)) == 3 * CHUNK  # removed: lookups stop there now
    assert not (d / data_name(bad)).exists() and not (d / sidecar_name(bad)).exists()
    eng.store(prompt(0), kvcaches=kv(0))  # the next store writes it again
    plugin(eng).flush()
    assert retrieve(eng, 0) == (PROMPT, True)


def test_remove_and_capacity_stay_exact_over_a_long_put_remove_loop(
    engines: Engines, tmp_path: Path
) -> None:
    """The disk backend of LMCache 0.5.6 leaks its capacity accounting on ``clear`` and then
    drops puts silently; here the directory's bytes (from its index) equal the files' sizes
    after every step, stay within the budget, the newest prompt is always stored whole, a
    cleared prompt is gone, and every committed chunk is held, removed or evicted."""
    d = tmp_path / "d"
    eng = engines(d, budget_mib=1)  # 15 chunks of 64 KiB (and the layout record)
    p = plugin(eng)
    layout_bytes = stored_bytes(len(p.chunks.layout.encode())) if p.chunks.layout else None
    n = 2 * CHUNK
    stored: list[int] = []
    for i in range(150):
        eng.store(prompt(i, n), kvcaches=kv(i, n))
        p.flush()
        stored.append(i)
        assert eng.lookup(prompt(i, n)) == n, f"step {i}: the newest prompt is not stored whole"
        if i % 3 == 2:  # clear one of the stored prompts, the newest or an older one
            j = stored.pop(-1 if i % 2 else len(stored) // 2)
            eng.clear(prompt(j, n))
            assert eng.lookup(prompt(j, n)) == 0
        s = p.stats()
        files = chunk_files(d)
        assert s["used_bytes"] == sum(f.stat().st_size for f in files) <= s["budget_bytes"]
        assert s["entries"] == sum(f.suffix == ".side" for f in files) - 1
        assert s["puts"] == s["entries"] + s["removes"] + s["evictions"]
        layout_bytes = layout_bytes or stored_bytes(len(p.chunks.layout.encode()))
        assert s["used_bytes"] == layout_bytes + s["entries"] * CHUNK_BYTES
    assert s["evictions"] > 0 and s["removes"] > 0 and s["puts_refused"] == 0
    for i in range(150):
        eng.clear(prompt(i, n))
    s = p.stats()
    assert s["entries"] == 0 and s["used_bytes"] == layout_bytes
    assert len(chunk_files(d)) == 2  # the layout record's data file and sidecar


def test_kill_9_during_puts_loses_nothing_reported_durable(
    engines: Engines, tmp_path: Path
) -> None:
    d = tmp_path / "d"
    proc = run_worker("store", str(d), "40")
    assert proc.stdout is not None
    durable: list[int] = []
    for line in proc.stdout:
        what, i = line.split()
        if what == "durable":
            durable.append(int(i))
        elif len(durable) >= 3:  # "submitted": puts in flight now
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and len(durable) >= 3
    errors = [x for x in fsck([str(d)]) if x.severity == "error"]
    assert not errors, errors  # at most orphan temp files: nothing torn is visible
    eng = engines(d)
    for i in durable:
        assert retrieve(eng, i) == (PROMPT, True), f"prompt {i} was reported durable"
    got, ok = retrieve(eng, len(durable))  # in flight at the kill: whole chunks or none
    assert ok and got % CHUNK == 0


def test_pinned_chunks_are_not_evicted_until_unpinned(engines: Engines, tmp_path: Path) -> None:
    eng = engines(tmp_path / "d", budget_mib=1)  # 15 chunks
    n = 4 * CHUNK
    eng.store(prompt(0, n), kvcaches=kv(0, n))
    plugin(eng).flush()
    assert eng.lookup(prompt(0, n), lookup_id="req-0", pin=True) == n
    for i in range(1, 7):  # 24 more chunks: everything not pinned goes round
        eng.store(prompt(i, n), kvcaches=kv(i, n))
        plugin(eng).flush()
    assert eng.lookup(prompt(0, n)) == n and eng.lookup(prompt(1, n)) == 0
    assert not plugin(eng).remove(keys_of(eng, prompt(0, n))[0], force=False)
    eng.lookup_unpin("req-0")
    for i in range(7, 11):
        eng.store(prompt(i, n), kvcaches=kv(i, n))
        plugin(eng).flush()
    assert eng.lookup(prompt(0, n)) == 0 and plugin(eng).stats()["puts_refused"] == 0


def test_non_blocking_gets_read_off_lmcache_s_event_loop(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = engines(tmp_path / "d")
    p, loop = plugin(eng), eng.storage_manager.loop
    eng.store(prompt(0), kvcaches=kv(0))
    p.flush()
    keys = keys_of(eng, prompt(0))
    readers: set[str] = set()  # the threads that opened, read or validated a chunk

    def spy(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any) -> Any:
            readers.add(threading.current_thread().name)
            return real(*a)

        return call

    for name in ("open_chunk", "copy_into"):
        monkeypatch.setattr(p.chunks, name, spy(getattr(p.chunks, name)))
    run = asyncio.run_coroutine_threadsafe
    assert run(p.batched_async_contains("req", keys, pin=True), loop).result(10) == len(keys)
    assert all(p.chunks.pinned(chunk_id(key_fields(k))) for k in keys)
    objs = run(p.batched_get_non_blocking("req", keys), loop).result(10)
    assert len(objs) == len(keys) and not any(
        p.chunks.pinned(chunk_id(key_fields(k))) for k in keys
    )
    want = kv(0)
    for j, obj in enumerate(objs):
        part = want[:, :, j * CHUNK : (j + 1) * CHUNK].reshape(2, 2, CHUNK, -1).transpose(0, 1)
        assert same(obj.tensor, part.contiguous())
        obj.ref_count_down()
    one = p.get_non_blocking(keys[1]).result(10)
    assert same(
        one.tensor,
        want[:, :, CHUNK : 2 * CHUNK].reshape(2, 2, CHUNK, -1).transpose(0, 1).contiguous(),
    )
    one.ref_count_down()
    assert readers and "storage-manager-event-loop" not in readers


def test_settings_name_the_entry_and_the_fix() -> None:
    p = "storage_plugin.stratastore."
    base = {p + "module_path": "stratastore.adapters.lmcache", p + "class_name": "X"}
    with pytest.raises(ConfigError, match=re.escape(f"{p}dir is not set")):
        PluginSettings.from_config(base, ["stratastore"])
    with pytest.raises(ConfigError, match=re.escape(f"{p}budget_mib is not set")):
        PluginSettings.from_config({**base, p + "dir": "/x"}, ["stratastore"])
    with pytest.raises(ConfigError, match=re.escape(f"{p}budget_mib = 'lots': use a whole")):
        PluginSettings.from_config({**base, p + "dir": "/x", p + "budget_mib": "lots"}, None)
    s = PluginSettings.from_config({**base, p + "dir": "/x", p + "budget_mib": 3}, None)
    levels = [(lv.spec, lv.budget_bytes) for lv in s.chunks.levels]
    assert (s.name, levels, s.put_threads) == ("stratastore", [("/x", 3 << 20)], 4)


def test_flush_reports_a_failed_put_once(
    engines: Engines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = engines(tmp_path / "d")
    p = plugin(eng)
    from stratastore.io.errors import StrataIOError

    def fail(*a: Any, **k: Any) -> Any:
        raise StrataIOError("write", str(tmp_path / "d"), 28, "No space left on device")

    monkeypatch.setattr(p.chunks.pages.backends[0], "put_state", fail)
    eng.store(prompt(0), kvcaches=kv(0))
    with pytest.raises(PutsFailed, match="8 LMCache chunk put"):
        p.flush()
    p.flush()  # each failure is reported once
    assert p.stats()["put_errors"] == 8 and eng.lookup(prompt(0)) == 0


ENGINE_MD = ROOT / "docs" / "engine.md"


def test_the_engine_md_snippet_loads_the_plugin_as_written(tmp_path: Path) -> None:
    """The YAML a vLLM user pastes (``LMCACHE_CONFIG_FILE``), with the directory set to a
    temporary one: LMCache loads the plugin from it, and a prompt round-trips."""
    text = ENGINE_MD.read_text().split("## LMCache and vLLM: the stratastore storage plugin")[1]
    yaml_text = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert yaml_text, "no yaml block in the LMCache section of engine.md"
    snippet = re.sub(
        r"(storage_plugin\.stratastore\.dir:) .*", rf"\1 {tmp_path / 'kv'}", yaml_text.group(1)
    )
    (tmp_path / "lmcache.yaml").write_text(snippet)
    from lmcache.v1.config import LMCacheEngineConfig

    from stratastore.adapters.lmcache.cpu import cpu_engine

    for name in ("test-engine-md-1", "test-engine-md-2"):  # the second reads the first's
        cfg = LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
        cfg.max_local_cpu_size = 0.03  # the snippet's is sized for a real model
        n = 2 * cfg.chunk_size
        eng = cpu_engine(
            name,
            cfg,
            model_name="test/engine-md",
            layers=2,
            heads=4,
            head_dim=32,
            chunk=cfg.chunk_size,
        )
        try:
            if name.endswith("1"):
                eng.store(prompt(0, n), kvcaches=kv(0, n))
                plugin(eng).flush()
                assert plugin(eng).stats()["puts"] == n // cfg.chunk_size
            else:
                assert retrieve(eng, 0, n) == (n, True)
                assert plugin(eng).stats()["hits"] == n // cfg.chunk_size
        finally:
            LMCacheEngineBuilder.destroy(name)


def test_a_directory_of_another_model_is_refused(engines: Engines, tmp_path: Path) -> None:
    """The directory's fingerprint is the model and its K/V shape: another model's plugin
    refuses to open it (under LMCache: the error logged, the engine runs without the plugin)."""
    eng = engines(tmp_path / "d")
    eng.store(prompt(0), kvcaches=kv(0))
    plugin(eng).flush()
    engines.close(eng)  # type: ignore[attr-defined]
    with pytest.raises(IncompatibleFingerprint):
        StrataStoragePlugin(
            config=eng.config, metadata=_other_model(eng.metadata), local_cpu_backend=None
        )


def _other_model(meta: Any) -> Any:
    import dataclasses

    return dataclasses.replace(meta, model_name="test/another-model")


def test_the_benchmark_runs_at_a_small_size(tmp_path: Path) -> None:
    """``strata bench --lmcache`` at 16 MiB, one round, no warmup: both rows, every read compared
    bit for bit, the ratios present (their values are not asserted: benchmarks measure)."""
    from strata_harness.lmcache_bench import render_lmcache, run_lmcache

    doc = run_lmcache(str(tmp_path), mib=16, rounds=1, warmup=False)
    rows = doc["rows"]
    assert set(rows) == {"LMCache disk (+ fsync)", "LMCache + stratastore plugin"}
    for r in rows.values():
        assert all(
            r[k] for k in ("durable_write", "read_hot", "read_cold", "prefix_hot", "prefix_cold")
        )
    assert doc["bit_for_bit"]["results_compared"] == 8 and len(doc["ratios"]) == 3
    assert "plugin / disk, retrieve hot" in render_lmcache(doc)
    assert os.listdir(tmp_path) == []
