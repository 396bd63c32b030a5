"""The cost of a park's commit and of a GC removal must not grow with the number of stored
conversations. ``Catalog._doom`` (commit, abort, shorten) asks ``_owners(key)`` for every touched
key only to learn whether it has *any* owner, and ``_owners`` walks every ``cat.members`` row of the
key: a system-prompt segment shared by N conversations makes every park and every GC step O(N). The
test counts the rows read (a timing would be a wall-clock threshold); the growth in time is in
tests/bench/test_bench_scaling.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore.catalog import Catalog
from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, encode_manifest
from stratastore.levels.local import SegmentStore
from tests.conftest import tiny_fp

FP = tiny_fp()
SHARED = b"\x5a" * 32  # the system prompt's segment, named by every conversation


def _manifest(cid: str, i: int) -> ChainManifest:
    ck = (ManifestCheckpoint(8, True, False, None), ManifestCheckpoint(16, False, False, None))
    segs = ((0, 8, SHARED), (8, 16, i.to_bytes(4, "big") * 8))
    return ChainManifest(cid, FP.digest(), np.arange(16, dtype=np.uint32), ck, (), segs, 1_000 + i)


def test_park_and_gc_do_not_walk_the_conversations_sharing_a_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: the member rows a park's commit and a GC removal read, beside
    20,000 conversations that share the system prompt's segment. A whole walk of the shared
    key's rows (the bug) reads 20,000; an any-owner check reads one."""
    walked: list[int] = []
    owners = Catalog._owners

    def counting(self: Catalog, txn: Any, key: bytes) -> list[bytes]:
        rows = owners(self, txn, key)
        walked.append(len(rows))
        return rows

    monkeypatch.setattr(Catalog, "_owners", counting)
    st = SegmentStore.open(str(tmp_path), FP)
    try:
        cat = Catalog(st.index)
        ms = [_manifest(f"c{i}", i) for i in range(20_000)]
        assert cat.replace_all([(m, encode_manifest(m), bytes(24)) for m in ms])
        m = _manifest("new", 20_001)
        walked.clear()
        ticket = cat.begin("new", {k for _, _, k in m.segments}, session=False)
        cat.finish(cat.commit(ticket, m, encode_manifest(m), bytes(24)))
        r = cat.shorten("new", lambda _m: 0)
        assert r is not None and SHARED not in r.dead and r.dead  # its own segment goes
        cat.finish(r)
        assert cat.owners(SHARED) == 20_000
    finally:
        st.close()
    assert sum(walked[:-1]) < 10, f"member rows read by one park and one removal: {walked[:-1]}"
