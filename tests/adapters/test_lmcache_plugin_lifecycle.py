"""The plugin's lifecycle and exception paths.

- ``flush(timeout)`` returns normally when the timeout passes with puts still in flight: the caller
  cannot tell "every put landed" from "gave up waiting".
- a put submitted while ``close()`` waits in ``_writers.shutdown(wait=True)`` takes a reference on
  its memory object (``batched_submit_put_task``) and then raises the executor's ``RuntimeError``
  (no StrataError): the reference is never dropped (LMCache's buffer leaks).
- ``close()`` does not wait for reads running on LMCache's loop executor
  (``batched_get_non_blocking`` uses ``run_in_executor(None, ...)``, not ``_readers``), and
  LMCache's ``StorageManager.close`` closes backends while its loop still runs: a read in flight
  finds the index closed and counts a valid chunk as damaged, logging "index ... is damaged;
  `strata fsck --repair`" (a wrong diagnosis and a wrong fix).
- ``_get_prefix``: an exception while opening/allocating (LMCache's ``allocate`` raising) leaks
  every memory object and open file already taken for the prefix."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

EXTRA = "needs the lmcache extra: pip install -e '.[lmcache]'"
torch = pytest.importorskip("torch", reason=EXTRA)
pytest.importorskip("lmcache", reason=EXTRA)

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402

from stratastore.errors import StrataError  # noqa: E402
from tests.adapters.lmcache_worker import CHUNK, engine, kv, plugin, prompt  # noqa: E402


@pytest.fixture
def eng(tmp_path: Path) -> Iterator[Any]:
    name = f"lifecycle-{id(tmp_path)}"
    e = engine(str(tmp_path / "d"), name)
    yield e
    LMCacheEngineBuilder.destroy(name)


def keys_of(e: Any, tokens: Any) -> list[Any]:
    return [k for _, _, k in e.token_database.process_tokens(tokens=tokens)]


def test_flush_with_a_timeout_does_not_return_normally_with_puts_in_flight(
    eng: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = plugin(eng)
    gate = threading.Event()
    real = p.chunks.put

    def slow(cid: bytes, payload: Any) -> Any:
        gate.wait(30)
        return real(cid, payload)

    monkeypatch.setattr(p.chunks, "put", slow)
    eng.store(prompt(0, CHUNK), kvcaches=kv(0, CHUNK))
    try:
        returned = True
        try:
            p.flush(timeout=0.2)
        except StrataError:
            returned = False
        assert not (returned and p.stats()["puts_in_flight"]), (
            "flush(timeout) returned normally while a put is still in flight"
        )
    finally:
        gate.set()
        p.flush()


def test_a_read_in_flight_at_close_is_not_counted_as_damage(
    eng: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = plugin(eng)
    eng.store(prompt(0, CHUNK), kvcaches=kv(0, CHUNK))
    p.flush()
    keys = keys_of(eng, prompt(0, CHUNK))
    entered, go = threading.Event(), threading.Event()
    real = p.chunks.open_chunk

    def blocked(cid: bytes) -> Any:
        entered.set()
        go.wait(30)
        return real(cid)

    monkeypatch.setattr(p.chunks, "open_chunk", blocked)
    fut = asyncio.run_coroutine_threadsafe(
        p.batched_get_non_blocking("r", keys), eng.storage_manager.loop
    )
    assert entered.wait(30)
    closer = threading.Thread(target=p.close)
    closer.start()
    closer.join(5)
    go.set()
    closer.join(30)
    try:
        got = fut.result(30)
    except Exception:
        got = []
    for obj in got:
        obj.ref_count_down()
    assert p.chunks.counters.damaged == 0, "a valid chunk read at close was counted as damaged"


def test_an_allocation_error_releases_the_prefix_already_taken(
    eng: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = plugin(eng)
    eng.store(prompt(0, 3 * CHUNK), kvcaches=kv(0, 3 * CHUNK))
    p.flush()
    keys = keys_of(eng, prompt(0, 3 * CHUNK))
    taken: list[Any] = []
    real = p.local_cpu_backend.allocate

    def allocate(*a: Any, **k: Any) -> Any:
        if len(taken) == 2:
            raise RuntimeError("allocator failure")
        obj = real(*a, **k)
        taken.append(obj)
        return obj

    monkeypatch.setattr(p.local_cpu_backend, "allocate", allocate)
    with pytest.raises(Exception):  # noqa: B017 - whatever it raises, nothing may leak
        p.batched_get_blocking(keys)
    assert [o.get_ref_count() for o in taken] == [0, 0], "memory objects of the prefix leaked"


def test_a_put_racing_close_neither_leaks_its_memory_object_nor_raises_untyped(
    eng: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close()`` flushes, then shuts the writer pool down with ``shutdown(wait=True)``, which
    waits for the puts submitted after the flush's snapshot; a put submitted while it waits takes a
    reference on its memory object (``batched_submit_put_task``), then ``submit`` raises the
    executor's RuntimeError: the reference is never dropped and the error is no StrataError."""
    p = plugin(eng)
    gates = [threading.Event(), threading.Event()]
    calls: list[int] = []
    real = p.chunks.put

    def slow(cid: bytes, payload: Any) -> Any:
        calls.append(1)
        gates[len(calls) - 1].wait(30)
        return real(cid, payload)

    def until(cond: Any) -> None:
        for _ in range(500):
            if cond():
                return
            threading.Event().wait(0.01)
        raise AssertionError("timed out")

    monkeypatch.setattr(p.chunks, "put", slow)
    eng.store(prompt(0, CHUNK), kvcaches=kv(0, CHUNK))  # put A: in flight, held
    until(lambda: len(calls) == 1)
    closer = threading.Thread(target=p.close)
    closer.start()  # close(): flush() waits for A
    eng.store(prompt(1, CHUNK), kvcaches=kv(1, CHUNK))  # put B: after the flush's snapshot
    until(lambda: len(calls) == 2)
    gates[0].set()  # A lands: flush returns; shutdown(wait=True) now waits for B
    until(lambda: p._writers._shutdown)
    key = keys_of(eng, prompt(2, CHUNK))[0]
    obj = p.local_cpu_backend.allocate(torch.Size([2, 2, CHUNK, 128]), torch.float16)
    assert obj is not None and obj.get_ref_count() == 1
    error: BaseException | None = None
    try:
        p.batched_submit_put_task([key], [obj])  # put C, while close() waits for B
    except Exception as e:
        error = e
    finally:
        gates[1].set()
        closer.join(30)
    refs = obj.get_ref_count()
    obj.ref_count_down()
    assert refs == 1, f"the put racing close() kept a reference it never drops ({error!r})"
    assert error is None or isinstance(error, StrataError), f"untyped: {error!r}"
