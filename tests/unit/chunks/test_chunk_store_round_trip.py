"""The chunk store keeps pages by content key on any level the registry opens: a page put is
delivered bit for bit, validated, into the caller's buffer, on a directory and in memory; a put
of a page held writes nothing; lookups answer by key and by prefix; a directory keeps its pages
across a reopen; keys, settings and misuse are refused by name, never showing a credential."""

from __future__ import annotations

import re
from pathlib import Path

import blake3
import numpy as np
import numpy.typing as npt
import pytest

from stratastore import (
    ChunkConfig,
    ChunkLevel,
    ChunkStore,
    ConfigError,
    IncompatibleFingerprint,
    Store,
    StoreError,
)
from stratastore.chunks import ChunkKeyError, ChunkStoreClosed, chunk_key, stored_bytes
from stratastore.format.keys import state_key
from tests.conftest import conversation_kv, tiny_fp

PAGE = 20_000


def key(i: int) -> bytes:
    return chunk_key(f"page-{i}")


def page(i: int, n: int = PAGE) -> npt.NDArray[np.uint8]:
    return np.random.default_rng(i).integers(0, 256, n, np.uint8)


def spec_of(where: str, tmp_path: Path) -> str:
    return str(tmp_path / "d") if where == "dir" else f"memory://rt-{tmp_path.name[-20:]}"


@pytest.mark.parametrize("where", ["dir", "memory"])
def test_a_page_round_trips_validated_into_the_callers_buffer(where: str, tmp_path: Path) -> None:
    big = 3 * (1 << 20) // 2  # a page of the store spans two of its 1 MiB hashed pages
    with ChunkStore.open([ChunkLevel(spec_of(where, tmp_path), 16 << 20)], tiny_fp()) as s:
        assert s.put(key(0), page(0)) == "stored"
        assert s.put(key(1), page(1, big)) == "stored"
        assert s.put(key(0), page(0)) == "present"  # nothing written
        assert s.exists(key(0)) and key(1) in s and s.contains(key(1)) and not s.exists(key(2))
        assert s.batch_exists([key(0), key(1), key(2), key(0)]) == 2
        out = np.zeros(PAGE + 100, np.uint8)  # larger than the page: its start is filled
        assert s.get_into(key(0), out) == PAGE
        assert np.array_equal(out[:PAGE], page(0)) and not out[PAGE:].any()
        assert s.get(key(1)) == page(1, big).tobytes()
        assert s.get_into(key(2), out) is None  # a miss
        assert s.get_into(key(0), np.zeros(PAGE - 1, np.uint8)) is None  # too small: a miss
        outs = [np.zeros(PAGE, np.uint8), np.zeros(PAGE, np.uint8)]
        assert s.batch_get_into([key(0), key(2)], outs) == [PAGE, None]
        assert s.batch_put([key(3), key(0)], [page(3), page(0)]) == ["stored", "present"]
        st = s.stats()
        assert (st["puts"], st["puts_deduped"], st["hits"], st["misses"]) == (3, 2, 3, 2)
        assert (st["read_errors"], st["damaged"], st["entries"]) == (1, 0, 3)
        assert st["hit_bytes"] == 2 * PAGE + big
        assert st["used_bytes"] == s.backends[0].used() > 3 * PAGE
        assert s.describe() == [
            {
                "level": s.backends[0].path,
                "entries": 3,
                "used_bytes": st["used_bytes"],
                "budget_bytes": 16 << 20,
            }
        ]


def test_a_page_is_stored_as_the_running_state_segment_of_its_key(tmp_path: Path) -> None:
    """Spec F-KEY-5: an ordinary segment, which the directory level, fsck and inspect know; what
    it adds to the level is what a put reserves (exact on a directory)."""
    with ChunkStore.open([ChunkLevel(str(tmp_path / "d"), 1 << 20)], tiny_fp()) as s:
        s.put(key(0), page(0))
        (level,) = s.backends
        assert level.keys() == [state_key(key(0))]
        assert level.used() == stored_bytes(PAGE) == level.record(state_key(key(0))).total_bytes


def test_a_directory_keeps_its_pages_across_a_reopen(tmp_path: Path) -> None:
    levels = [ChunkLevel(str(tmp_path / "d"), 1 << 20)]
    with ChunkStore.open(levels, tiny_fp()) as s:
        s.put(key(0), page(0))
    with ChunkStore.open(levels, tiny_fp()) as s:
        assert s.get(key(0)) == page(0).tobytes() and s.entries() == 1
    with pytest.raises(IncompatibleFingerprint):
        ChunkStore.open(levels, tiny_fp("another/model"))


def test_a_chunk_key_is_32_bytes_and_an_engine_name_is_hashed_to_one() -> None:
    ns = b"hicache"
    want = blake3.blake3(b"strata-chunk-name-v1\x00" + len(ns).to_bytes(4, "little") + ns)
    want.update(b"ab" * 32)
    assert chunk_key("ab" * 32, namespace="hicache") == want.digest()
    assert chunk_key(b"x") != chunk_key(b"x", namespace="other")
    assert chunk_key("x") == chunk_key(b"x")


def test_keys_settings_and_misuse_are_refused_by_name(tmp_path: Path) -> None:
    with ChunkStore.open([ChunkLevel(f"memory://m{tmp_path.name[-12:]}", 1 << 20)], tiny_fp()) as s:
        with pytest.raises(ChunkKeyError, match=re.escape("got 31 bytes; derive one")):
            s.put(b"k" * 31, page(0))
        with pytest.raises(ChunkKeyError, match="chunk_key"):
            s.exists("not-bytes")  # type: ignore[arg-type]
        for data in (b"", "text", None, np.zeros((4, 4), np.uint8)[:, ::2]):
            with pytest.raises(StoreError):
                s.put(key(0), data)  # type: ignore[arg-type]
        assert s.put(key(0), page(0)) == "stored"
        with pytest.raises(StoreError, match="must be writable"):
            s.get_into(key(0), bytes(PAGE))
        chunk = s.open_chunk(key(0))
        assert chunk is not None
        with pytest.raises(StoreError, match="bytes-like"):
            s.read_into(chunk, "text")  # type: ignore[arg-type]
        assert s.get(key(0)) == page(0).tobytes() and s.entries() == 1
    with pytest.raises(ChunkStoreClosed, match="put on a closed chunk store"):
        s.put(key(0), page(0))
    with pytest.raises(ChunkStoreClosed):
        s.pin(key(0))
    assert s.get(key(0)) is None and not s.exists(key(0))  # reads after close: misses
    with pytest.raises(ConfigError, match="budget_bytes = 0"):
        ChunkLevel(str(tmp_path), 0)
    with pytest.raises(ConfigError, match="max_age_s = -1"):
        ChunkLevel(str(tmp_path), 1, max_age_s=-1)
    with pytest.raises(ConfigError, match="at least one level"):
        ChunkConfig(())
    with pytest.raises(ConfigError, match="when_full"):
        ChunkConfig((ChunkLevel(str(tmp_path), 1),), when_full="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="same spec"):
        ChunkConfig((ChunkLevel(str(tmp_path), 1), ChunkLevel(str(tmp_path), 2)))


def test_no_message_or_repr_shows_a_levels_credential(tmp_path: Path) -> None:
    secret = "s3cret-pw"
    level = ChunkLevel(f"redis://alice:{secret}@127.0.0.1:1/0", 0 + 1, settings={"name": "x"})
    assert secret not in repr(level) and secret not in repr(ChunkConfig((level,)))
    assert "redis://..." in repr(level)
    with pytest.raises(ConfigError) as bad:
        ChunkLevel(f"redis://alice:{secret}@127.0.0.1:1/0", -5)
    assert secret not in str(bad.value)
    with pytest.raises(ConfigError) as unknown:
        ChunkStore.open([ChunkLevel(f"s3://alice:{secret}@bucket/x", 1 << 20)], tiny_fp())
    assert secret not in str(unknown.value)


def test_a_conversation_stores_level_is_refused(tmp_path: Path) -> None:
    """A chunk store evicts and moves its levels' oldest segments: a Store's directory, which
    holds conversations' K/V, is refused at open (and left as it was)."""
    cfg = {"park": "disk", "cold_dir": str(tmp_path / "conv"), "cold_mib": 64}
    conv, kv = conversation_kv("chat-1", 64, 1000)
    with Store.open(tiny_fp(), cfg) as store:
        store.park(conv, kv)
    before = sorted(p.name for p in (tmp_path / "conv").iterdir())
    with pytest.raises(ConfigError, match="a conversation store's K/V segments"):
        ChunkStore.open([ChunkLevel(str(tmp_path / "conv"), 1 << 20)], tiny_fp())
    assert sorted(p.name for p in (tmp_path / "conv").iterdir()) == before
