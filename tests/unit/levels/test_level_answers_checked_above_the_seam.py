"""Whatever a level's backend answers is checked above the seam before a byte is delivered:
a backend registered from outside the package that answers one key with another key's valid
segment (same model, same token range, pages that match their own sidecar) delivers nothing of
it. The answer's sidecar names another key: damage, a miss (``Store.restore``: the ladder, its
deepest valid prefix before it; ``ChunkStore.get``: counted in ``damaged``), never the other
segment's bytes and never an exception to the engine."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from stratastore import ChunkLevel, ChunkStore, Store
from stratastore.chunks import chunk_key, stored_key
from stratastore.format import FormatError, Level, ModelFingerprint
from stratastore.levels import BackendEntry, SegmentBackend, register_backend, unregister_backend
from stratastore.levels.errors import SegmentNotFound
from stratastore.levels.memory import MemoryBackend, MemorySegment
from stratastore.levels.reader import open_checked
from tests.conftest import conversation_kv, tiny_fp

FP = tiny_fp()


class SwappingBackend(MemoryBackend):
    """The shipped memory level, except that it answers a key of :attr:`answers` with the
    segment of the key it maps to (a backend with a bug, or one that lies)."""

    answers: ClassVar[dict[bytes, bytes]] = {}
    opened: ClassVar[list[SwappingBackend]] = []

    def open_reader(self, key: bytes) -> MemorySegment:
        return super().open_reader(self.answers.get(key, key))


def open_swapping(
    spec: str, fingerprint: ModelFingerprint, level: Level, args: Mapping[str, Any]
) -> SegmentBackend:
    backend = SwappingBackend(spec.partition("://")[2], fingerprint, level)
    SwappingBackend.opened.append(backend)
    return backend


@pytest.fixture
def swap() -> Iterator[str]:
    register_backend("swap", BackendEntry("swapping", open_swapping))
    SwappingBackend.answers.clear()
    SwappingBackend.opened.clear()
    yield "swap"
    unregister_backend("swap")
    SwappingBackend.answers.clear()


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "ram_mib": 0,
        "park": "disk",
        "levels": [
            {"name": "swap", "url": "swap://shelf", "mib": 8},
            {"name": "cold", "dir": str(tmp_path / "cold"), "mib": 8},
        ],
    }


def _park_two(store: Store, states: bool = False) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Park ``a`` (tokens 100..131) then ``b`` (200..231), each cut at 16: the keys of each
    one's K/V segments by their first token, of its states (``states``) by ``-checkpoint``."""
    (level,) = SwappingBackend.opened
    keys: list[dict[int, bytes]] = []
    for cid, base in (("a", 100), ("b", 200)):
        before = set(level.raw)
        conv, kv = conversation_kv(cid, 32, base, fp=FP)
        saved = {16: f"{cid} at 16".encode(), 32: f"{cid} at 32".encode()} if states else None
        store.park(conv, kv, saved)
        store.flush()
        new = [(k, level.raw[k][0]) for k in set(level.raw) - before]
        keys.append({(sc.token_start if sc.n_tokens else -sc.token_start): k for k, sc in new})
    return keys[0], keys[1]


@pytest.mark.parametrize("call", ["restore", "restore_many"])
def test_a_segment_answered_with_another_keys_is_a_ladder_stop(
    swap: str, tmp_path: Path, call: str
) -> None:
    with Store.open(FP, _config(tmp_path)) as store:
        a, b = _park_two(store)
        SwappingBackend.answers[a[16]] = b[16]  # a's second segment answered with b's
        _, kv_a = conversation_kv("a", 32, 100, fp=FP)
        out = np.zeros(40 * FP.token_bytes, np.uint8)
        prompt = np.arange(100, 140)
        got = (
            store.restore(prompt, out)
            if call == "restore"
            else store.restore_many([(prompt, out)])[0]
        )
        assert got.tokens == 16, (
            f"a restore through a level that answered a key with another segment gave "
            f"{got.tokens} tokens; the other segment's bytes must never be delivered"
        )
        tb = FP.token_bytes
        assert np.array_equal(out[: 16 * tb], kv_a[: 16 * tb])
        assert not out[16 * tb :].any(), "past the ladder stop the destination is zeroed"
        assert store.stats()["ladder_restores"] == 1


def test_a_running_state_answered_with_another_keys_is_not_delivered(
    swap: str, tmp_path: Path
) -> None:
    """A hybrid restore resumes only where a state that is its own reads back: the state of
    another checkpoint, valid as it is, is skipped for the deepest own one below it."""
    with Store.open(FP, _config(tmp_path)) as store:
        a, b = _park_two(store, states=True)
        SwappingBackend.answers[a[-32]] = b[-32]
        out = np.zeros(40 * FP.token_bytes, np.uint8)
        got = store.restore(np.arange(100, 140), out)
        assert (got.tokens, got.state) == (16, b"a at 16"), (
            f"restored {got.tokens} tokens with state {got.state!r}: b's state was answered "
            "for a's key and must not be delivered"
        )


@pytest.mark.parametrize("read", ["get", "get_into"])
def test_a_chunk_answered_with_another_keys_page_is_a_counted_miss(
    swap: str, read: str, caplog: pytest.LogCaptureFixture
) -> None:
    ka, kb = chunk_key("page-a"), chunk_key("page-b")
    pa, pb = (np.random.default_rng(i).integers(0, 256, 5000, np.uint8) for i in (1, 2))
    with ChunkStore.open([ChunkLevel("swap://chunks", 1 << 20)], FP) as s:
        assert s.put(ka, pa) == "stored" and s.put(kb, pb) == "stored"
        SwappingBackend.answers[stored_key(ka)] = stored_key(kb)
        with caplog.at_level("WARNING", logger="stratastore.chunks"):
            if read == "get":
                assert s.get(ka) is None
            else:
                assert s.get_into(ka, np.zeros(5000, np.uint8)) is None
        assert s.stats()["damaged"] == 1 and s.stats()["hits"] == 0
        assert f"chunk {stored_key(ka).hex()[:16]} is damaged" in caplog.text
        assert s.get(kb) == pb.tobytes()


def test_open_checked_refuses_a_foreign_answer_and_closes_it(swap: str) -> None:
    level = SwappingBackend("direct", FP, Level.COLD)
    a = level.put_state(b"\1" * 32, b"state one", token_pos=0).key
    b = level.put_state(b"\2" * 32, b"state two", token_pos=0).key
    SwappingBackend.answers[a] = b
    with open_checked(level, b, FP) as seg:
        assert seg.sidecar.key == b
    with pytest.raises(FormatError, match=f"segment {a.hex()[:16]}.*names segment {b.hex()[:16]}"):
        open_checked(level, a, FP)
    with pytest.raises(SegmentNotFound):
        open_checked(level, b"\3" * 32, FP)
