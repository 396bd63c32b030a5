"""The one derivation of segment keys and their media, and the pure check of a manifest's keys
against its own tokens (spec F-KEY-2, F-KEY-7, F-CHAIN-2, F-CHAIN-6). The store-level regressions
are in test_media_and_manifest_keys.py."""

from __future__ import annotations

import dataclasses

import pytest

from stratastore.chain import Conversation
from stratastore.format import FormatError, KeyMismatch, key_chain, segment_key, state_key
from stratastore.format.manifest import (
    ChainManifest,
    ManifestCheckpoint,
    decode_manifest,
    encode_manifest,
    manifest_key_mismatch,
    verify_manifest_keys,
)
from tests.conftest import tiny_fp
from tests.unit.format.test_media_and_manifest_keys import AUDIO, FP, MEDIA, PIC, N, conv


def test_one_derivation_of_keys_and_media() -> None:
    """``segment_keys`` is the only derivation: media at absolute positions map to offsets
    within their segment (one at a cut belongs to the segment that starts there)."""
    c = conv("c", {0: PIC, 16: AUDIO, 20: PIC})
    root = FP.digest()
    segs = c.segment_keys(root)
    assert [s.media for s in segs] == [((0, PIC),), ((0, AUDIO), (4, PIC)), (), ()]
    parent = root
    for s in segs:
        assert s.parent == parent
        assert s.key == segment_key(parent, c.tokens[s.start : s.end], s.media)
        parent = s.key
    assert c.segments(root) == [(s.start, s.end, s.key) for s in segs]
    with pytest.raises(FormatError):
        key_chain(root, c.tokens, [], [(0, 16), (17, N)])  # a gap
    with pytest.raises(FormatError):
        key_chain(root, c.tokens, [(N, PIC)], [(0, N)])  # a picture past the tokens


def test_manifest_key_check_is_pure_and_names_the_first_bad_segment() -> None:
    root = FP.digest()
    c = conv("c", MEDIA)
    m = decode_manifest(encode_manifest(_manifest(c, root)))
    assert manifest_key_mismatch(m) is None and manifest_key_mismatch(m, root) is None
    verify_manifest_keys(m, root)
    media_free = [s.key for s in key_chain(root, c.tokens, (), c.boundaries())]
    pairs = zip(m.segments, media_free, strict=True)
    bad = dataclasses.replace(m, segments=tuple((s, e, k) for (s, e, _), k in pairs))
    err = manifest_key_mismatch(bad, root, "x.chain")
    assert isinstance(err, KeyMismatch) and err.what == "segment 1 (tokens [16, 32))"
    assert err.recorded == media_free[1] and err.derived == m.segments[1][2]
    with pytest.raises(KeyMismatch, match="F-CHAIN-2"):
        verify_manifest_keys(bad, root)
    with pytest.raises(KeyMismatch):  # another model's root derives other keys (F-KEY-1)
        verify_manifest_keys(m, tiny_fp("test/other").digest())
    wrong_state = dataclasses.replace(
        m,
        checkpoints=tuple(
            dataclasses.replace(ck, state_key=state_key(root)) if ck.length == 32 else ck
            for ck in m.checkpoints
        ),
    )
    err = manifest_key_mismatch(wrong_state)
    assert err is not None and "checkpoint at 32" in err.what


def _manifest(c: Conversation, root: bytes) -> ChainManifest:
    segs = c.segments(root)
    ends = {e: k for _, e, k in segs}
    return ChainManifest(
        c.conv_id,
        root,
        c.tokens,
        tuple(
            ManifestCheckpoint(ck.length, state_key=state_key(ends[ck.length]))
            for ck in c.checkpoints
        ),
        tuple(sorted(c.media.items())),
        tuple(segs),
        1,
    )
