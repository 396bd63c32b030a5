"""Review 12: the cost of a park's commit and of a GC removal must not grow with the number of
stored conversations. ``Catalog._doom`` (commit, abort, shorten) asks ``_owners(key)`` for every
touched key only to learn whether it has *any* owner, and ``_owners`` walks every
``cat.members`` row of the key: a system-prompt segment shared by N conversations makes every
park and every GC step O(N)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from stratastore.catalog import Catalog
from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, encode_manifest
from stratastore.store import SegmentStore
from tests.conftest import tiny_fp

FP = tiny_fp()
SHARED = b"\x5a" * 32  # the system prompt's segment, named by every conversation


def _manifest(cid: str, i: int) -> ChainManifest:
    ck = (ManifestCheckpoint(8, True, False, None), ManifestCheckpoint(16, False, False, None))
    segs = ((0, 8, SHARED), (8, 16, i.to_bytes(4, "big") * 8))
    return ChainManifest(cid, FP.digest(), np.arange(16, dtype=np.uint32), ck, (), segs,
                         1_000 + i)  # fmt: skip


def _park_and_remove_s(tmp: Path, stored: int) -> float:
    """Median seconds of one park (begin + commit) and one GC removal of a conversation that
    shares the system prompt with ``stored`` others."""
    st = SegmentStore.open(str(tmp), FP)
    try:
        cat = Catalog(st._index)
        ms = [_manifest(f"c{i}", i) for i in range(stored)]
        assert cat.replace_all([(m, encode_manifest(m), bytes(24)) for m in ms])
        m = _manifest("new", stored + 1)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            ticket = cat.begin("new", {k for _, _, k in m.segments}, session=False)
            cat.finish(cat.commit(ticket, m, encode_manifest(m), bytes(24)))
            r = cat.shorten("new", lambda _m: 0)
            assert r is not None and SHARED not in r.dead
            cat.finish(r)
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    finally:
        st.close()


def test_park_and_gc_cost_do_not_grow_with_the_conversations_sharing_a_prefix(
        tmp_path: Path) -> None:  # fmt: skip
    few = _park_and_remove_s(tmp_path / "few", 1)
    many = _park_and_remove_s(tmp_path / "many", 100_000)
    assert many < 3 * few + 0.02, (
        f"one park + one GC removal: {few * 1e3:.1f} ms beside 1 conversation, "
        f"{many * 1e3:.1f} ms beside 100,000 sharing its system prompt (O(N) per step)"
    )
