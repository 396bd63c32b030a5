"""The two-pass restore and the ladder: a damaged image (a flipped byte in page k, a truncated file,
a missing segment) restores exactly its deepest valid prefix, validated; the destinations lay the
same bytes out in the engine's layouts; nothing is written before the read pass has validated it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore.format import data_name
from stratastore.levels.local import SegmentStore
from stratastore.restore import FlatKV, LayerKV, PagedKV, Piece, RestoreFailed, two_pass_restore
from tests.conftest import tiny_fp

FP = tiny_fp()  # 2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, 4-token pages
TB, PT = FP.token_bytes, FP.page_tokens
CUTS = [0, 20, 42, 64]  # three segments: 5, 6 (last page short) and 6 (short) pages


def kv_of(n: int) -> npt.NDArray[np.uint8]:
    return (np.arange(n * TB) * 7 % 251).astype(np.uint8)


@pytest.fixture
def image(tmp_path: Path) -> Iterator[tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]]:
    kv = kv_of(CUTS[-1])
    with SegmentStore.open(tmp_path / "s", FP) as store:
        parent, pieces = store.root_key, []
        for a, b in itertools.pairwise(CUTS):
            r = store.put_kv(parent, np.arange(a, b), kv[a * TB : b * TB], token_start=a)
            pieces.append(Piece(a, b, r.key, store))
            parent = r.key
        yield store, pieces, kv


def page_floor(bad: int) -> int:
    start = max(c for c in CUTS if c <= bad)
    return start + (bad - start) // PT * PT


def flip(store: SegmentStore, key: bytes, offset: int) -> None:
    path = Path(store.path) / data_name(key)
    raw = bytearray(path.read_bytes())
    raw[4096 + offset] ^= 0x10
    path.write_bytes(bytes(raw))


def test_whole_image(image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]) -> None:
    _, pieces, kv = image
    out = np.zeros_like(kv)
    o = two_pass_restore(pieces, 64, FlatKV(FP, out), FP, resume_at=page_floor)
    assert (o.tokens, o.first_bad, o.damaged) == (64, None, [])
    assert np.array_equal(out, kv)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize(("seg", "page"), [(0, 0), (1, 2), (2, 5)])  # first, middle, last page
def test_flipped_byte_restores_the_deepest_valid_prefix(
    image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
    seg: int,
    page: int,
    direct: bool,
) -> None:
    store, pieces, kv = image
    flip(store, pieces[seg].key, page * PT * TB + 5)
    bad = CUTS[seg] + page * PT
    for resume, expect in [
        (page_floor, bad),
        (lambda t: max(c for c in CUTS if c <= t), CUTS[seg]),
    ]:
        out = np.full_like(kv, 0xEE)
        flat = FlatKV(FP, out, read_direct=direct)
        o = two_pass_restore(pieces, 64, flat, FP, resume_at=resume, chunk_bytes=2 * PT * TB)
        assert (o.tokens, o.first_bad) == (expect, bad)
        assert o.damaged == [pieces[seg].key] and "BLAKE3" in (o.reason or "")
        assert np.array_equal(out[: expect * TB], kv[: expect * TB])
        # past the prefix: the old bytes, or zeros where validated pages were written and then
        # taken back (chunks are applied as they validate); never the image's bytes
        assert np.isin(out[expect * TB :], [0, 0xEE]).all(), "nothing past the prefix delivered"


def test_truncated_file_and_missing_segment(
    image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
) -> None:
    store, pieces, kv = image
    path = Path(store.path) / data_name(pieces[1].key)
    path.write_bytes(path.read_bytes()[:-10])
    out = np.zeros_like(kv)
    o = two_pass_restore(pieces, 64, FlatKV(FP, out), FP, resume_at=page_floor)
    assert (o.tokens, o.first_bad) == (20, 20) and "truncated" in (o.reason or "")
    assert np.array_equal(out[: 20 * TB], kv[: 20 * TB])
    missing = [pieces[0], Piece(20, 42, pieces[1].key, None), pieces[2]]
    o = two_pass_restore(missing, 64, FlatKV(FP, np.zeros_like(kv)), FP, resume_at=page_floor)
    assert (o.tokens, o.first_bad) == (20, 20) and "no level" in (o.reason or "")


@pytest.mark.parametrize("direct", [True, False])
def test_ladder_off_fails_typed_and_delivers_nothing(
    image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]], direct: bool
) -> None:
    store, pieces, kv = image
    flip(store, pieces[2].key, 3)
    out = np.full_like(kv, 0xEE)
    with pytest.raises(RestoreFailed, match="token 42"):
        two_pass_restore(
            pieces, 64, FlatKV(FP, out, read_direct=direct), FP, resume_at=page_floor, ladder=False
        )
    assert np.isin(out, [0, 0xEE]).all(), "what was written before the damage was zeroed"


def test_apply_pass_is_chunked(
    image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
) -> None:
    _, pieces, kv = image
    out = np.zeros_like(kv)
    flat = FlatKV(FP, out, read_direct=False)  # through staging: the apply pass copies
    calls: list[int] = []
    real = flat.write_pages

    def spy(t0: int, n: int, data: npt.NDArray[np.uint8], pt: int) -> None:
        calls.append(n)
        real(t0, n, data, pt)

    flat.write_pages = spy  # type: ignore[method-assign]
    two_pass_restore(pieces, 64, flat, FP, resume_at=page_floor, chunk_bytes=2 * PT * TB)
    assert max(calls) <= 2 * PT and sum(calls) == 64 and np.array_equal(out, kv)


def per_token(kv: npt.NDArray[np.uint8], n: int) -> npt.NDArray[np.uint8]:
    """[tokens, layers, 2, row] from the stored page layout (the reference transform)."""
    row = FP.n_kv_heads * FP.head_dim * 2
    out = np.zeros((n, FP.n_layers, 2, row), np.uint8)
    for a, b in itertools.pairwise(CUTS):
        for p0 in range(a, min(b, n), PT):
            p = min(PT, b - p0)
            page = kv[p0 * TB : (p0 + p) * TB].reshape(FP.n_layers, 2, p, row)
            out[p0 : p0 + p] = page.transpose(2, 0, 1, 3)[: max(0, min(p, n - p0))]
    return out


def test_layer_and_paged_destinations(
    image: tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]],
) -> None:
    _, pieces, kv = image
    ref = per_token(kv, 64)
    k = [np.zeros((80, 2, 4), np.float16) for _ in range(2)]
    v = [np.zeros((80, 2, 4), np.float16) for _ in range(2)]
    two_pass_restore(pieces, 64, LayerKV(FP, k, v), FP, resume_at=page_floor)
    for layer in range(2):
        assert np.array_equal(k[layer][:64].view(np.uint8).reshape(64, -1), ref[:, layer, 0])
        assert np.array_equal(v[layer][:64].view(np.uint8).reshape(64, -1), ref[:, layer, 1])
    block = 16
    pools = [np.zeros((2, 10, block, 2, 4), np.uint16) for _ in range(2)]
    table = [7, 2, 9, 0]  # scattered blocks
    two_pass_restore(pieces, 64, PagedKV(FP, pools, table), FP, resume_at=page_floor)
    for t in range(64):
        b, s = table[t // block], t % block
        for layer in range(2):
            got_k = pools[layer][0, b, s].view(np.uint8).reshape(-1)
            assert np.array_equal(got_k, ref[t, layer, 0])


def test_destination_refusals() -> None:
    from stratastore import ConfigError, StrataError

    with pytest.raises(ConfigError, match="block ids"):
        PagedKV(FP, [np.zeros((2, 4, 16, 2, 4), np.uint16)] * 2, [4])
    with pytest.raises(ConfigError, match="2 K and V"):
        LayerKV(FP, [np.zeros((8, 2, 4), np.float16)], [])
    with pytest.raises(ConfigError, match="C-contiguous"):
        FlatKV(FP, np.zeros((10, 10), np.uint8)[:, ::2])
    with pytest.raises(StrataError, match="holds 1 tokens"):
        two_pass_restore([], 5, FlatKV(FP, np.zeros(64, np.uint8)), FP, resume_at=lambda t: 0)


def test_pack_pages_is_the_inverse_of_layer_kv() -> None:
    """Per-layer K/V packed into the stored layout (segments cut off-page at 6 and 13) and
    written back through LayerKV piece by piece, as a restore does, give the same arrays."""
    from stratastore.restore import pack_pages

    rng = np.random.default_rng(3)
    n = 21
    k = [rng.standard_normal((n, FP.n_kv_heads, FP.head_dim)).astype(np.float16) for _ in "ab"]
    v = [rng.standard_normal((n, FP.n_kv_heads, FP.head_dim)).astype(np.float16) for _ in "ab"]
    cuts = [0, 6, 13]
    flat = pack_pages(FP, k, v, n, cuts)
    assert flat.size == n * TB
    k2 = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in "ab"]
    v2 = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in "ab"]
    dest = LayerKV(FP, k2, v2)
    for a, b in itertools.pairwise([*cuts, n]):
        dest.write_pages(a, b - a, flat[a * TB : b * TB], PT)
    assert all(np.array_equal(x, y) for x, y in zip(k + v, k2 + v2, strict=True))


def test_pack_pages_refuses_bad_input() -> None:
    from stratastore import ConfigError
    from stratastore.restore import pack_pages

    k = [np.zeros((8, FP.n_kv_heads, FP.head_dim), np.float16)] * FP.n_layers
    with pytest.raises(ConfigError, match="needs 2 K and V arrays"):
        pack_pages(FP, k[:1], k, 8)
    with pytest.raises(ConfigError, match="holds 8 tokens, 9 are needed"):
        pack_pages(FP, k, k, 9)
