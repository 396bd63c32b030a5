"""F-FP and F-KEY: the fingerprint record and the key hash chain."""

from __future__ import annotations

import numpy as np
import pytest

from stratastore.format import (
    DType,
    FormatError,
    IncompatibleFingerprint,
    ModelFingerprint,
    chain_keys,
    segment_key,
    state_key,
)
from stratastore.format.fingerprint import FINGERPRINT
from tests.conftest import tiny_fp


def test_fingerprint_roundtrip_and_sizes() -> None:
    fp = ModelFingerprint.create(
        "m", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16, dtype="bfloat16"
    )
    assert fp.token_bytes == 2 * 32 * 8 * 128 * 2 == 131072
    assert fp.page_bytes == 16 * 131072
    raw = fp.pack()
    assert len(raw) == FINGERPRINT.size == 84
    assert ModelFingerprint.unpack(raw) == fp
    assert fp.dtype is DType.BFLOAT16


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_layers", 0), ("n_kv_heads", 5000), ("head_dim", 0), ("page_tokens", 0)],
)
def test_fingerprint_bounds_refused(field: str, value: int) -> None:
    kw = dict(n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4)
    kw[field] = value
    with pytest.raises(FormatError, match=field):
        ModelFingerprint.create("m", **kw)


def test_fingerprint_page_too_large_refused() -> None:
    with pytest.raises(FormatError, match="page_tokens"):
        ModelFingerprint.create(
            "m", n_layers=4096, n_kv_heads=4096, head_dim=64, page_tokens=16, dtype="float32"
        )


def test_fingerprint_unknown_dtype_name() -> None:
    with pytest.raises(FormatError, match="float16"):
        ModelFingerprint.create(
            "m", n_layers=1, n_kv_heads=1, head_dim=1, page_tokens=1, dtype="float64"
        )


@pytest.mark.parametrize("size", [0, 83, 85])
def test_fingerprint_wrong_length(size: int) -> None:
    with pytest.raises(FormatError):
        ModelFingerprint.unpack(b"\0" * size)


def test_fingerprint_mismatch_message_names_object_and_fix() -> None:
    a, b = tiny_fp("a"), tiny_fp("b")
    a.require_same(a, "x")
    with pytest.raises(IncompatibleFingerprint, match=r"obj\.side.*open it with the model"):
        a.require_same(b, "obj.side")


def test_every_field_changes_the_digest() -> None:
    base = tiny_fp()
    variants = [
        tiny_fp("other"),
        ModelFingerprint.create("test/tiny", n_layers=3, n_kv_heads=2, head_dim=4, page_tokens=4),
        ModelFingerprint.create("test/tiny", n_layers=2, n_kv_heads=1, head_dim=4, page_tokens=4),
        ModelFingerprint.create("test/tiny", n_layers=2, n_kv_heads=2, head_dim=8, page_tokens=4),
        ModelFingerprint.create("test/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=8),
        ModelFingerprint.create(
            "test/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4, dtype="bfloat16"
        ),
        ModelFingerprint.create(
            "test/tiny", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4, extra=b"rope=2x"
        ),
    ]
    digests = {v.digest() for v in variants} | {base.digest()}
    assert len(digests) == len(variants) + 1


def test_equal_prefixes_get_equal_keys_across_conversations() -> None:
    root = tiny_fp().digest()
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    b = [1, 2, 3, 4, 9, 9]
    ka = chain_keys(root, a, [4, 8])
    kb = chain_keys(root, b, [4, 6])
    assert ka[0] == kb[0]
    assert ka[1] != kb[1]
    assert segment_key(root, np.array(a[:4], dtype=np.int64)) == ka[0]


def test_key_depends_on_parent_cut_and_media() -> None:
    root = tiny_fp().digest()
    other_root = tiny_fp("x").digest()
    toks = [5, 6, 7, 8]
    base = segment_key(root, toks)
    assert segment_key(other_root, toks) != base
    assert chain_keys(root, toks, [2, 4])[-1] != base
    pic = (1, b"\x11" * 32)
    assert segment_key(root, toks, [pic]) != base
    assert segment_key(root, toks, [(2, b"\x11" * 32)]) != segment_key(root, toks, [pic])
    assert state_key(base) != base


@pytest.mark.parametrize(
    "tokens",
    [[-1], [2**32], np.array([[1, 2]]), np.array([1.5])],
)
def test_bad_token_ids_refused(tokens: object) -> None:
    with pytest.raises(FormatError):
        segment_key(tiny_fp().digest(), tokens)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "media",
    [[(4, b"\0" * 32)], [(1, b"\0" * 31)], [(2, b"\0" * 32), (1, b"\0" * 32)], [(-1, b"\0" * 32)]],
)
def test_bad_media_refused(media: list[tuple[int, bytes]]) -> None:
    with pytest.raises(FormatError, match="F-KEY-4"):
        segment_key(tiny_fp().digest(), [1, 2, 3, 4], media)


def test_bad_parent_and_cuts_refused() -> None:
    with pytest.raises(FormatError):
        segment_key(b"short", [1])
    with pytest.raises(FormatError):
        chain_keys(tiny_fp().digest(), [1, 2, 3], [2, 2])
    with pytest.raises(FormatError):
        state_key(b"\0" * 5)
