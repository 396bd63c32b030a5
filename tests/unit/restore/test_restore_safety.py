"""The bytes a restore validated are the bytes it delivers, every read fault is a typed error or a
ladder stop (never a signal), and a restore writes into the caller's memory in place or refuses
before touching anything.

Only names the 0.1 code already had are imported at module level, so that each test here fails
on that code for its own reason."""

from __future__ import annotations

import errno
import itertools
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import Store, StrataError
from stratastore.format import Codec, data_name
from stratastore.io import faults
from stratastore.io.errors import StrataIOError
from stratastore.levels.local import SegmentStore
from stratastore.restore import (
    FlatKV,
    Job,
    LayerKV,
    Outcome,
    PagedKV,
    Piece,
    RestoreFailed,
    restore_batch,
    two_pass_restore,
)
from stratastore.restore.two_pass import Chunk
from tests.conftest import tiny_fp
from tests.unit.facade.test_store_facade import conversation

FP = tiny_fp()  # 2 layers x 2 kv heads x 4 dims fp16: 64 bytes a token, 4-token pages
TB, PT = FP.token_bytes, FP.page_tokens
CUTS = [0, 20, 42, 64]
ROOT = Path(__file__).resolve().parents[3]

Image = tuple[SegmentStore, list[Piece], npt.NDArray[np.uint8]]


def kv_of(n: int) -> npt.NDArray[np.uint8]:
    return (np.arange(n * TB) * 7 % 251).astype(np.uint8)


def make_image(
    store: SegmentStore, codec: Codec = Codec.RAW, ids: int = 0
) -> tuple[list[Piece], np.ndarray]:
    kv = kv_of(CUTS[-1])
    parent, pieces = store.root_key, []
    for a, b in itertools.pairwise(CUTS):
        r = store.put_kv(
            parent, np.arange(a, b) + ids, kv[a * TB : b * TB], token_start=a, codec=codec
        )
        pieces.append(Piece(a, b, r.key, store))
        parent = r.key
    return pieces, kv


@pytest.fixture
def image(tmp_path: Path) -> Iterator[Image]:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        pieces, kv = make_image(store)
        yield store, pieces, kv


def page_floor(bad: int) -> int:
    start = max(c for c in CUTS if c <= bad)
    return start + (bad - start) // PT * PT


def seg_path(store: SegmentStore, key: bytes) -> Path:
    return Path(store.path) / data_name(key)


def per_layer(kv: npt.NDArray[np.uint8], n: int) -> list[npt.NDArray[np.uint8]]:
    """K and V of each layer as ``[n, row]`` bytes, from the stored page layout."""
    row = FP.n_kv_heads * FP.head_dim * 2
    out = [np.zeros((n, row), np.uint8) for _ in range(2 * FP.n_layers)]
    for a, b in itertools.pairwise(CUTS):
        for p0 in range(a, min(b, n), PT):
            p = min(PT, b - p0)
            page = kv[p0 * TB : (p0 + p) * TB].reshape(FP.n_layers, 2, p, row)
            for layer, kind in itertools.product(range(FP.n_layers), range(2)):
                out[2 * layer + kind][p0 : p0 + p] = page[layer, kind]
    return out


KINDS = ["flat", "direct", "layer", "layer-direct", "paged", "paged-direct"]
BLOCK, TABLE = 6, [5, 0, 9, 3, 7, 1, 10, 2, 8, 4, 6]  # 6-token blocks: pages span blocks


def dest_of(kind: str, n: int) -> tuple[object, object]:
    """A destination of ``kind`` for ``n`` tokens and what it fills (to compare)."""
    direct = {"read_direct": kind.endswith("-direct")}
    if kind.startswith("layer"):
        k = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(FP.n_layers)]
        v = [np.zeros((n, FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(FP.n_layers)]
        return LayerKV(FP, k, v, **direct), (k, v)
    if kind.startswith("paged"):
        pools = [np.zeros((2, 11, BLOCK, FP.n_kv_heads, FP.head_dim), np.uint16) for _ in "kv"]
        return PagedKV(FP, pools, TABLE, **direct), pools
    out = np.zeros(n * TB, np.uint8)
    return FlatKV(FP, out, read_direct=kind == "direct"), out


def assert_holds(kind: str, got: object, kv: npt.NDArray[np.uint8], n: int) -> None:
    if kind.startswith("paged"):
        want = per_layer(kv, n)
        for layer, t in itertools.product(range(FP.n_layers), range(n)):
            b, s = TABLE[t // BLOCK], t % BLOCK
            for kind_ in (0, 1):
                row = got[layer][kind_, b, s].view(np.uint8).reshape(-1)  # type: ignore[index]
                assert np.array_equal(row, want[2 * layer + kind_][t]), (layer, t, kind_)
        return
    if kind.startswith("layer"):
        k, v = got  # type: ignore[misc]
        want = per_layer(kv, n)
        for layer in range(FP.n_layers):
            assert np.array_equal(k[layer][:n].view(np.uint8).reshape(n, -1), want[2 * layer])
            assert np.array_equal(v[layer][:n].view(np.uint8).reshape(n, -1), want[2 * layer + 1])
    else:
        assert np.array_equal(got[: n * TB], kv[: n * TB])  # type: ignore[index]


def assert_nothing_past(kind: str, got: object, n: int) -> None:
    """Every byte of the destination (all zeros before the restore) past token ``n`` is zero."""
    if kind.startswith("paged"):
        for pool in got:  # type: ignore[attr-defined]
            flat = pool.reshape(2, -1, FP.n_kv_heads * FP.head_dim).copy()
            for t in range(n):
                flat[:, TABLE[t // BLOCK] * BLOCK + t % BLOCK] = 0
            assert not flat.any(), "nothing past the prefix was left in the pools"
    elif kind.startswith("layer"):
        k, v = got  # type: ignore[misc]
        assert not any(a[n:].any() for a in k + v), "nothing past the prefix"
    else:
        assert not got[n * TB :].any(), "nothing past the prefix"  # type: ignore[index]


# -- item 4: the bytes validated are the bytes delivered ----------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_file_overwritten_between_the_passes_never_reaches_the_caller(
    image: Image, kind: str
) -> None:
    """The read pass validated the image; then every data file is overwritten in place (the same
    inode, the same size: what a reader holding a mapping would see); the apply pass must
    deliver the bytes it validated."""
    store, pieces, kv = image
    dest, got = dest_of(kind, 64)
    job = Job(pieces, 64, dest, FP, page_floor)  # type: ignore[arg-type]
    validated = job.read()
    for p in pieces:
        with open(seg_path(store, p.key), "r+b") as f:
            f.seek(4096)
            f.write(b"\xa5" * (os.fstat(f.fileno()).st_size - 4096))
    o = job.apply(validated)
    assert (o.tokens, o.first_bad) == (64, None)
    assert_holds(kind, got, kv, 64)


_TRUNCATE_BETWEEN_PASSES = """
import itertools, os, sys
import numpy as np
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from stratastore.levels.local import SegmentStore
from stratastore.format import data_name
from stratastore.restore import FlatKV, Job, Piece
from tests.conftest import tiny_fp
FP = tiny_fp(); TB = FP.token_bytes
kv = (np.arange(64 * TB) * 7 % 251).astype(np.uint8)
with SegmentStore.open(sys.argv[1], FP) as store:
    parent, pieces = store.root_key, []
    for a, b in itertools.pairwise([0, 20, 42, 64]):
        r = store.put_kv(parent, np.arange(a, b), kv[a * TB : b * TB], token_start=a)
        pieces.append(Piece(a, b, r.key, store))
        parent = r.key
    if sys.argv[3] == "restore":
        out = np.zeros(64 * TB, np.uint8)
        job = Job(pieces, 64, FlatKV(FP, out), FP, lambda t: t // 4 * 4, chunk_bytes=256)
        validated = job.read()
        for p in pieces:  # truncated between the passes, to its header: no page is left
            os.truncate(Path(store.path) / data_name(p.key), 4096)
        o = job.apply(validated)
        assert o.tokens == 64 and np.array_equal(out, kv), o
    else:  # a view taken, then its file truncated: the caller keeps what it got
        view = store.view(pieces[0].key)
        os.truncate(Path(store.path) / data_name(pieces[0].key), 4096)
        assert np.array_equal(view, kv[: 20 * TB])
print("no signal")
"""


@pytest.mark.parametrize("scenario", ["restore", "view"])
def test_a_file_truncated_after_the_read_is_no_signal(tmp_path: Path, scenario: str) -> None:
    """A data file truncated after it was read (between the passes; under a view) must not kill
    the process with SIGBUS (run in a child process: a signal would end pytest itself)."""
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(_TRUNCATE_BETWEEN_PASSES))
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s"), str(ROOT), scenario],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert "no signal" in run.stdout


class _TruncateOnRead(faults.FaultInjector):
    """Truncates ``path`` just before the ``nth`` read of it (after the reader checked the
    file's size): a file that shrinks while the read pass reads it."""

    def __init__(self, path: Path, nth: int) -> None:
        super().__init__()
        self.path, self.nth, self.reads = path, nth, 0

    def check(self, op: str, path: str) -> faults.Fault | None:
        if op == "read" and path == str(self.path):
            self.reads += 1
            if self.reads == self.nth:
                os.truncate(self.path, 4096 + 8)
        return None


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_truncated_during_the_read_pass_stops_the_ladder(image: Image, kind: str) -> None:
    store, pieces, kv = image
    dest, got = dest_of(kind, 64)
    with faults.use(_TruncateOnRead(seg_path(store, pieces[1].key), nth=2)):
        o = two_pass_restore(pieces, 64, dest, FP, resume_at=page_floor)  # type: ignore[arg-type]
    assert (o.tokens, o.first_bad) == (20, 20)
    assert "truncated while being read" in (o.reason or "") and o.damaged == [pieces[1].key]
    assert_holds(kind, got, kv, 20)
    assert_nothing_past(kind, got, 20)


@pytest.mark.parametrize("kind", KINDS)
def test_an_injected_eio_on_a_segment_read_is_a_ladder_stop_or_a_typed_error(
    image: Image, kind: str
) -> None:
    store, pieces, kv = image
    eio = faults.Fault(op="read", path_contains=data_name(pieces[1].key), persistent=True)
    dest, got = dest_of(kind, 64)
    with faults.inject(eio):
        o = two_pass_restore(pieces, 64, dest, FP, resume_at=page_floor)  # type: ignore[arg-type]
    assert (o.tokens, o.first_bad) == (20, 20) and f"errno {errno.EIO}" in (o.reason or "")
    assert_holds(kind, got, kv, 20)
    assert_nothing_past(kind, got, 20)
    dest, got = dest_of(kind, 64)
    with faults.inject(eio), pytest.raises(RestoreFailed, match="injected"):
        two_pass_restore(pieces, 64, dest, FP, resume_at=page_floor, ladder=False)  # type: ignore[arg-type]
    with faults.inject(eio), pytest.raises(StrataIOError, match="injected"):
        store.get_into(pieces[1].key, np.zeros(22 * TB, np.uint8))


def test_an_injected_eio_under_store_restore_is_a_ladder_stop(tmp_path: Path) -> None:
    cfg = {"ram_mib": 0, "cold_dir": str(tmp_path / "cold"), "cold_mib": 64}
    with Store.open(FP, cfg) as store:
        conv, kv = conversation("c", 96, 500)
        assert store.park(conv, kv.copy()).where == "disk"
        store.flush()
        prompt = np.asarray(conv.tokens)
        out = np.full(96 * TB, 0xEE, np.uint8)
        with faults.inject(faults.Fault(op="read", path_contains=".seg", nth=4, persistent=True)):
            r = store.restore(prompt, out)
        assert 0 < r.tokens < 96 and store.stats()["ladder_restores"] == 1
        assert np.array_equal(out[: r.tokens * TB], kv[: r.tokens * TB])
        assert np.isin(out[r.tokens * TB :], [0, 0xEE]).all(), "past the prefix: old or zero"


def test_a_direct_read_leaves_no_unvalidated_byte_in_the_destination(image: Image) -> None:
    """With ``read_direct`` the pages land in the caller's buffer during the read pass; a page
    that fails, and everything the ladder does not deliver, is zeroed before the call returns."""
    store, pieces, kv = image
    path = seg_path(store, pieces[1].key)
    raw = bytearray(path.read_bytes())
    raw[4096 + 2 * PT * TB + 5] ^= 0x10  # page 2 of the second segment: token 28
    path.write_bytes(bytes(raw))
    for resume, expect in [(page_floor, 28), (lambda t: max(c for c in CUTS if c <= t), 20)]:
        out = np.full_like(kv, 0xEE)
        o = two_pass_restore(
            pieces,
            64,
            FlatKV(FP, out, read_direct=True),
            FP,  # type: ignore[call-arg,unused-ignore]
            resume_at=resume,
        )
        assert (o.tokens, o.first_bad) == (expect, 28)
        assert np.array_equal(out[: expect * TB], kv[: expect * TB])
        assert np.isin(out[expect * TB :], [0, 0xEE]).all()
        assert not out[28 * TB : 32 * TB].any(), "the damaged page was zeroed"
    out = np.full_like(kv, 0xEE)
    with pytest.raises(RestoreFailed):
        two_pass_restore(
            pieces,
            64,
            FlatKV(FP, out, read_direct=True),
            FP,  # type: ignore[call-arg,unused-ignore]
            resume_at=page_floor,
            ladder=False,
        )
    assert np.isin(out, [0, 0xEE]).all(), "a failed restore delivers nothing"


@pytest.mark.parametrize("kind", ["layer-direct", "paged-direct"])
def test_a_direct_scatter_read_leaves_nothing_past_the_prefix(image: Image, kind: str) -> None:
    store, pieces, kv = image
    path = seg_path(store, pieces[1].key)
    raw = bytearray(path.read_bytes())
    raw[4096 + 2 * PT * TB + 5] ^= 0x10  # token 28
    path.write_bytes(bytes(raw))
    for resume, expect in [(page_floor, 28), (lambda t: max(c for c in CUTS if c <= t), 20)]:
        dest, got = dest_of(kind, 64)
        o = two_pass_restore(pieces, 64, dest, FP, resume_at=resume)  # type: ignore[arg-type]
        assert (o.tokens, o.first_bad) == (expect, 28)
        assert_holds(kind, got, kv, expect)
        assert_nothing_past(kind, got, expect)
    dest, got = dest_of(kind, 64)
    with pytest.raises(RestoreFailed):
        two_pass_restore(pieces, 64, dest, FP, resume_at=page_floor, ladder=False)  # type: ignore[arg-type]
    assert_nothing_past(kind, got, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_compressed_segments_restore_through_the_new_read_pass(tmp_path: Path, kind: str) -> None:
    with SegmentStore.open(tmp_path / "z", FP) as store:
        pieces, kv = make_image(store, Codec.ZSTD)
        dest, got = dest_of(kind, 64)
        o = two_pass_restore(pieces, 61, dest, FP, resume_at=page_floor)  # type: ignore[arg-type]
        assert (o.tokens, o.first_bad) == (58, None)  # 61 ends mid-page (42 + 4k): whole pages
        assert_holds(kind, got, kv, 58)
        out = np.zeros(22 * TB, np.uint8)
        store.get_into(pieces[1].key, out)
        assert np.array_equal(out, kv[20 * TB : 42 * TB])


class _OverwrittenBeforeApply(Job):
    """A job whose data file is overwritten in place before each chunk of it is copied, after
    the read pass validated that chunk (the agenda runs the read pass on its worker thread and
    the apply pass on the caller's)."""

    def write(self, chunk: Chunk, n: int) -> None:
        p = chunk.piece
        assert p.store is not None
        with open(seg_path(p.store, p.key), "r+b") as f:
            f.seek(4096)
            f.write(b"\x5a" * (os.fstat(f.fileno()).st_size - 4096))
        super().write(chunk, n)


@pytest.mark.parametrize("direct", [False, True])
def test_the_batched_agenda_delivers_what_it_validated(tmp_path: Path, direct: bool) -> None:
    with SegmentStore.open(tmp_path / "s", FP) as store:
        imgs = [make_image(store, ids=1000 * i) for i in range(3)]
        outs = [np.zeros(64 * TB, np.uint8) for _ in imgs]
        flats = [
            FlatKV(FP, o, read_direct=True) if direct else FlatKV(FP, o)  # type: ignore[call-arg,unused-ignore]
            for o in outs
        ]
        jobs = [
            _OverwrittenBeforeApply(p, 64, f, FP, page_floor)
            for (p, _), f in zip(imgs, flats, strict=True)
        ]
        res = restore_batch(jobs)
        assert all(isinstance(r, Outcome) and r.tokens == 64 for r in res), res
        assert all(np.array_equal(o, kv) for o, (_, kv) in zip(outs, imgs, strict=True))


# -- item 5: restore writes into the caller's memory or refuses ---------------------------------
def _bad_outs(n: int) -> dict[str, np.ndarray]:
    read_only = np.zeros((n, TB), np.uint8)[:, ::2].repeat(2, axis=1)  # a fresh array...
    read_only.flags.writeable = False  # ...that cannot be written
    return {
        "strided": np.zeros(2 * n * TB, np.uint8)[::2],
        "fortran": np.zeros((n, TB), np.uint8, order="F"),
        "read-only": read_only,
        "read-only strided": np.lib.stride_tricks.as_strided(
            np.zeros(2 * n * TB, np.uint8), (n * TB,), (2,), writeable=False
        ),
    }


def _ram_store(tmp_path: Path) -> Store:
    return Store.open(
        FP, {"ram_mib": 1, "cold_dir": str(tmp_path / "c"), "cold_mib": 64}, probe=lambda: 1 << 40
    )


@pytest.mark.parametrize("bad", ["strided", "fortran", "read-only", "read-only strided"])
def test_an_out_that_cannot_be_written_in_place_is_refused_before_the_ram_entry_moves(
    tmp_path: Path, bad: str
) -> None:
    with _ram_store(tmp_path) as store:
        conv, kv = conversation("a", 40, 0)
        assert store.park(conv, kv.copy()).where == "ram"
        prompt = np.asarray(conv.tokens)
        out = _bad_outs(40)[bad]
        with pytest.raises(StrataError) as err:
            store.restore(prompt, out)
        assert type(err.value).__name__ == "DestinationRefused"
        assert (
            "read-only" in str(err.value) if "read-only" in bad else "contiguous" in str(err.value)
        )
        assert not out.any(), "nothing was written"
        with pytest.raises(StrataError):
            store.restore_many([(prompt, np.zeros(40 * TB, np.uint8)), (prompt, out)])
        assert store.lookup(prompt) == ("ram", 40), "the RAM entry is still there"
        good = np.zeros(40 * TB, np.uint8)
        r = store.restore(prompt, good)
        assert (r.source, r.tokens) == ("ram", 40) and np.array_equal(good, kv)


@pytest.mark.parametrize("bad", ["strided", "fortran", "read-only strided"])
def test_load_session_refuses_an_out_it_cannot_write_in_place(tmp_path: Path, bad: str) -> None:
    with _ram_store(tmp_path) as store:
        _, kv = conversation("x", 40, 7)
        store.save_session("s", np.arange(40), kv)
        out = _bad_outs(40)[bad]
        with pytest.raises(StrataError) as err:
            store.load_session("s", out)
        assert type(err.value).__name__ == "DestinationRefused" and not out.any()
        good = np.zeros(40 * TB, np.uint8)
        store.load_session("s", good)
        assert np.array_equal(good, kv)


def test_layer_and_paged_destinations_check_their_geometry() -> None:
    h, d, n = FP.n_kv_heads, FP.head_dim, 80
    bad_layer = {
        "twice the heads": (np.zeros((n, 2 * h, d), np.float16),),
        "half the head_dim": (np.zeros((2 * n, h, d // 2), np.float16),),
        "4-byte items": (np.zeros((n, h, d), np.float32),),
        "bytes of the wrong row": (np.zeros((n, 2 * h * d * 2), np.uint8),),
    }
    for what, (a,) in bad_layer.items():
        with pytest.raises(StrataError) as err:
            LayerKV(FP, [a, a.copy()], [a.copy(), a.copy()])
        assert type(err.value).__name__ == "DestinationRefused", what
    ok = [np.zeros((n, h, d), np.float16) for _ in range(4)]
    assert LayerKV(FP, ok[:2], ok[2:]).capacity() == n
    rows = [np.zeros((n, h * d * 2), np.uint8) for _ in range(4)]  # distinct: no overlap
    assert LayerKV(FP, rows[:2], rows[2:]).capacity() == n
    for pool in (np.zeros((2, 4, 16, 2 * h, d), np.uint16), np.zeros((2, 4, 16, h, d), np.uint8)):
        with pytest.raises(StrataError) as err:
            PagedKV(FP, [pool, pool.copy()], [0, 1])
        assert type(err.value).__name__ == "DestinationRefused"


def test_a_layer_kv_with_twice_the_heads_is_refused_before_a_restore(image: Image) -> None:
    """Twice the heads used to be taken as twice the tokens, and every restored token landed at a
    wrong offset."""
    _, pieces, _ = image
    k = [np.zeros((64, 2 * FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(2)]
    v = [np.zeros((64, 2 * FP.n_kv_heads, FP.head_dim), np.float16) for _ in range(2)]
    with pytest.raises(StrataError, match="kv heads"):
        two_pass_restore(pieces, 64, LayerKV(FP, k, v), FP, resume_at=page_floor)
    assert not any(a.any() for a in k + v)
