"""Which conversations have a ``cat.ages`` row (spec F-CAT-1): a function of the manifest
alone, whatever cut it. A cut that lands exactly on the pinned prefix takes the conversation
out of the table, whether capacity GC made it (F-CAT-4) or a cut before an unreadable segment
(F-CHAIN-3); a cut above the pinned prefix leaves it in, under the same key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from stratastore.catalog import Catalog, conv_id_key, pinned_length
from stratastore.format.keys import key_chain
from stratastore.format.manifest import (
    ChainManifest,
    ManifestCheckpoint,
    decode_manifest,
    encode_manifest,
)
from stratastore.levels.local.index import SegmentIndex
from tests.conftest import tiny_fp

ROOT_KEY = tiny_fp().digest()
SEALED = 1_767_225_600_000_000_000
BOUNDS = [(0, 10), (10, 20), (20, 30)]


def manifest(conv_id: str, *, pinned_at: int | None) -> ChainManifest:
    """30 tokens in three segments, a checkpoint at each segment end, the one at
    ``pinned_at`` pinned."""
    tokens = np.arange(1000, 1030, dtype=np.uint32)
    segs = key_chain(ROOT_KEY, tokens, (), BOUNDS)
    return ChainManifest(
        conv_id,
        ROOT_KEY,
        tokens,
        tuple(ManifestCheckpoint(e, pinned=e == pinned_at) for _, e in BOUNDS),
        (),
        tuple((s.start, s.end, s.key) for s in segs),
        SEALED,
    )


@pytest.fixture
def catalog(tmp_path: Path) -> Iterator[Catalog]:
    index = SegmentIndex(str(tmp_path))
    try:
        yield Catalog(index)
    finally:
        index.close()


def aged(catalog: Catalog) -> set[str]:
    return set(catalog.oldest(limit=100))


def cut_before_segment(i: int) -> Callable[[ChainManifest], int]:
    """The cut a reader makes before an unreadable segment ``i`` (F-CHAIN-3)."""
    return lambda m: m.segments[i][0]


@pytest.mark.parametrize(
    ("pinned_at", "keep", "stays"),
    [
        (10, pinned_length, False),  # capacity GC cuts to the pinned prefix
        (10, cut_before_segment(1), False),  # a cut before damage lands on it exactly
        (10, cut_before_segment(2), True),  # a cut before damage lands above it
        (20, cut_before_segment(2), False),
        (None, cut_before_segment(1), True),  # no pinned prefix: GC may still remove it
    ],
    ids=["gc_to_pin", "damage_on_pin", "damage_above_pin", "damage_on_deeper_pin", "no_pin"],
)
def test_a_cut_on_the_pinned_prefix_leaves_the_ages_table(
    catalog: Catalog,
    pinned_at: int | None,
    keep: Callable[[ChainManifest], int],
    stays: bool,
) -> None:
    m = manifest("c", pinned_at=pinned_at)
    raw = encode_manifest(m)
    catalog.put_file(m, raw, bytes(24))
    assert aged(catalog) == {"c"}  # uncut: past its pinned prefix

    r = catalog.shorten("c", keep, sessions=True)
    assert r is not None and r.manifest is not None
    cut = decode_manifest(r.manifest)
    catalog.finish(r)
    assert aged(catalog) == ({"c"} if stays else set())
    assert (pinned_length(cut) < len(cut.tokens)) is stays  # the manifest alone decides
    if stays:  # under the key it had: a cut keeps sealed_at_ns
        with catalog.index.read_txn() as txn:
            ages = catalog.index.env.open_db(b"cat.ages", txn=txn)
            key = SEALED.to_bytes(8, "big") + conv_id_key("c")
            assert bytes(txn.get(key, db=ages)) == b"c"


def test_a_manifest_already_at_its_pinned_prefix_never_has_a_row(catalog: Catalog) -> None:
    m = manifest("p", pinned_at=30)
    catalog.put_file(m, encode_manifest(m), bytes(24))
    assert aged(catalog) == set()
