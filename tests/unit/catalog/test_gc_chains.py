"""Capacity GC works on chains, in one process through the public ``Store`` API:

* a prefix shared by several parked conversations is not the first thing evicted (it would take
  every conversation that starts with it, the one just parked included);
* a park is never acknowledged and then silently gone: one that cannot stay on a level full of
  saved sessions is reported (a discard, or a ``SpillError`` at flush), or it restores in full;
* GC leaves no holes: every segment on disk is reachable, from the start of some conversation's
  manifest, through segments all present (fsck calls the others SEGMENT_UNREACHABLE; this test
  computes it from the files itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore import Store, StrataError
from stratastore.facade import SpillError
from stratastore.format.manifest import MAX_MANIFEST_BYTES, decode_manifest
from stratastore.format.naming import parse_name
from tests.conftest import tiny_fp
from tests.crash.catalog_worker import conversation, kv_of, tokens_of

FP = tiny_fp()  # 64 bytes a token, pages of 4 tokens
KV = npt.NDArray[np.uint8]
Parts = Sequence[tuple[int, int]]


def cold_store(tmp_path: Path, mib: int, **more: Any) -> Store:
    cfg = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": mib,
        **more,
    }
    return Store.open(FP, cfg, probe=lambda: 1 << 40, warn=lambda _msg: None)


def restored(store: Store, parts: Parts) -> int:
    """Tokens a restore of ``parts`` (plus a token nobody stored) delivers; every one of their
    bytes must be the conversation's."""
    toks = tokens_of(parts)
    prompt = np.concatenate([toks, np.array([4_000_000_000], dtype=np.uint32)])
    out = np.zeros(len(prompt) * FP.token_bytes, dtype=np.uint8)
    r = store.restore(prompt, out)
    n = r.tokens * FP.token_bytes
    assert np.array_equal(out[:n], kv_of(prompt)[:n]), "a restore delivered the wrong bytes"
    return r.tokens


def flush_errors(store: Store) -> list[str]:
    try:
        store.flush()
    except SpillError as e:
        return [cid for cid, _ in e.failures]
    return []


# -- 5. an unpinned shared prefix is evicted first ----------------------------------------------
def test_a_shared_prefix_is_not_evicted_under_the_conversations_that_use_it(tmp_path: Path) -> None:
    """Conversations share a 256-token prefix (its own segment, not pinned); each adds a
    2,000-token tail. The level (1 MiB) holds about seven, so from the eighth park on GC must
    make room: every park must restore in full right after its flush, and so must the park
    before it (the budget holds both). Today GC removes the oldest segment, the shared prefix,
    and with it the park just made and every sibling."""
    prefix = (0, 256)
    with cold_store(tmp_path, 1) as store:
        parked: list[Parts] = []
        for i in range(10):
            parts = [prefix, (1_000_000 + 10_000 * i, 2000)]
            conv, kv = conversation(f"c{i}", parts, [0, 256])
            assert store.park(conv, kv).where == "disk"
            assert flush_errors(store) == []
            parked.append(parts)
            got = restored(store, parts)
            assert got == 2256, (
                f"park #{i} (2,256 tokens, flushed) restores {got} tokens: GC evicted the "
                "prefix it shares with the others"
            )
            if i:
                before = restored(store, parked[i - 1])
                assert before == 2256, (
                    f"park #{i - 1} restores {before} tokens after park #{i}: one park's room "
                    "took its sibling's shared prefix"
                )


# -- 6. a park on a level full of sessions evicts its own first segment -------------------------
SESSION_TOKENS = 500  #: one segment: 500 * 64 bytes of K/V, its sidecar and headers (~40 KB)
PARK_SEGMENT = 1000  #: each of the park's two segments (~76 KB)


def test_a_park_is_never_acknowledged_then_silently_gone(tmp_path: Path) -> None:
    """A level (1 MiB, when_full=evict) is filled with saved sessions (never evicted) until
    less than a session and a park segment is free, but one park segment still fits; a park of
    two segments then fits its first segment, not both. Whatever the store does (refuse it, or
    keep it), it must say so: a discard (the park's report or the ``discards`` counter) or a
    ``SpillError`` at flush, or the park restores in full. Today it is reported ``disk``,
    nothing is counted, and making room for its second segment evicted its first: nothing of
    it restores."""
    with cold_store(tmp_path, 1, when_full="evict") as store:
        saved = []
        for s in range(100):
            level = store.stats()["levels"]["cold"]
            if level["budget"] - level["bytes"] < 112 * 1024:  # a park segment, not two
                break
            toks = tokens_of([(2_000_000 + 10_000 * s, SESSION_TOKENS)])
            try:
                store.save_session(f"s{s}", toks, kv_of(toks))
            except StrataError:  # the store counts the space otherwise: it is full now
                break
            saved.append(toks)
        parts = [(5_000_000, 2 * PARK_SEGMENT)]
        conv, kv = conversation("x", parts, [0, PARK_SEGMENT])
        discards = store.stats()["discards"]
        report = store.park(conv, kv)
        failed = flush_errors(store)
        counted = store.stats()["discards"] - discards
        got = restored(store, parts)
        told = report.where == "discard" or "x" in failed or counted > 0
        assert told or got == report.tokens == 2 * PARK_SEGMENT, (
            f"park of x reported {report.where!r} ({report.tokens} tokens), flush reported "
            f"{failed or 'nothing'}, {counted} discards counted, yet it restores {got} of "
            f"{2 * PARK_SEGMENT} tokens: acknowledged, then silently gone"
        )
        for s, toks in enumerate(saved):  # the sessions are untouched either way
            out = np.zeros(len(toks) * FP.token_bytes, dtype=np.uint8)
            store.load_session(f"s{s}", out)
            assert np.array_equal(out, kv_of(toks)), f"session s{s} changed"


# -- 7. GC leaves holes -------------------------------------------------------------------------
def unreachable_segments(level_dir: Path) -> tuple[list[str], int]:
    """Segment sidecars in ``level_dir`` that no manifest reaches (walking each manifest's
    segments from its first, up to the first one missing), and how many manifests there are."""
    present = {
        parsed[0]
        for p in level_dir.iterdir()
        if (parsed := parse_name(p.name)) is not None and parsed[1] == "side"
    }
    reachable: set[bytes] = set()
    names = sorted(level_dir.glob("strata-chain-*.chain"))
    for path in names:
        raw = path.read_bytes()
        assert len(raw) <= MAX_MANIFEST_BYTES
        m = decode_manifest(raw, path.name)
        ends = {}
        for _, end, key in m.segments:
            if key not in present:
                break  # a hole: what follows is not reachable through this manifest
            reachable.add(key)
            ends[end] = key
        for c in m.checkpoints:  # running states hang off a reachable checkpoint
            if c.state_key is not None and c.length in ends:
                reachable.add(c.state_key)
    return sorted(k.hex()[:12] for k in present - reachable), len(names)


def test_gc_leaves_no_unreachable_segments(tmp_path: Path) -> None:
    """Forty conversations of four segments each (of uneven sizes; every fifth parked again, a
    turn longer) go through a 1 MiB cold level that holds about ten: GC runs on almost every
    park. After every flush, every segment file on disk must be reachable from some manifest's
    first segment through segments all present. Today GC removes the oldest segment, a
    conversation's first; its manifest goes, and its later segments stay behind, reachable from
    nothing."""
    cold = tmp_path / "cold"
    found: list[str] = []
    with cold_store(tmp_path, 1) as store:
        for i in range(40):
            n = 900 + 137 * (i % 5)
            q = n // 4
            parts = [(100_000 * (i + 1), n)]
            conv, kv = conversation(f"c{i}", parts, [0, q, 2 * q, 3 * q])
            store.park(conv, kv)
            if i % 5 == 4:  # the same conversation a turn later: the chain grows
                parts = [*parts, (100_000 * (i + 1) + 50_000, 500)]
                conv, kv = conversation(f"c{i}", parts, [0, q, 2 * q, 3 * q, n])
                store.park(conv, kv)
            assert flush_errors(store) == []
            holes, n_manifests = unreachable_segments(cold)
            assert n_manifests > 0
            if holes and not found:
                found = [f"after park #{i}: {len(holes)} segment(s) {holes[:4]}"]
        assert store.stats()["levels"]["cold"]["disk_evictions"] > 0  # GC did run
    holes, n_manifests = unreachable_segments(cold)
    if holes:
        found.append(f"at the end: {len(holes)} segment(s) {holes[:4]}")
    assert not found, (
        "segments on disk that no manifest reaches through present segments "
        f"(SEGMENT_UNREACHABLE): {'; '.join(found)}"
    )
