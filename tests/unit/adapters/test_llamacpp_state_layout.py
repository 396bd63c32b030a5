"""llama.cpp's sequence state as the adapter reads and writes it (no llama.cpp needed: the
states are built here in its layout; ``tests/llamacpp`` holds the same against the real one):
rows round-trip for V plain and transposed, and every state cut short, longer, or with a field
another layout would hold is :class:`StateLayoutError`, never misread."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from stratastore.adapters.llamacpp import state
from stratastore.adapters.llamacpp.state import (
    SEQ_MAGIC,
    Layout,
    StateLayoutError,
    build_context_state,
    build_state,
    per_layer,
    read_context_state,
    read_state,
    state_buffer,
    transpose_v_rows,
)
from stratastore.errors import StrataError

PLAIN = Layout(
    n_layer=3,
    k_type=8,
    k_row=34,
    v_type=1,
    v_row=64,
    v_trans=False,
    v_el=2,
    n_embd_v=32,
    version="0.3.36",
)
TRANSPOSED = Layout(
    n_layer=2,
    k_type=1,
    k_row=64,
    v_type=1,
    v_row=64,
    v_trans=True,
    v_el=2,
    n_embd_v=32,
    version="0.3.36",
)


def rows(layout: Layout, n: int, seed: int = 0) -> np.ndarray:
    shape = (layout.n_layer, n, layout.k_row + layout.v_row)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.mark.parametrize("layout", [PLAIN, TRANSPOSED], ids=["plain", "transposed"])
@pytest.mark.parametrize("n", [0, 1, 17])
def test_rows_round_trip(layout: Layout, n: int) -> None:
    r = rows(layout, n)
    state = build_state(r, n, layout, seq_id=3)
    assert struct.unpack_from("<IiII", state) == (SEQ_MAGIC, 3, 1, n)
    assert np.array_equal(read_state(state, layout), r)
    longer = rows(layout, n + 5, seed=1)
    assert np.array_equal(read_state(build_state(longer, n, layout), layout), longer[:, :n])


def test_transposed_v_is_element_major_in_the_state() -> None:
    """With V transposed, element j of every cell comes before element j + 1 (llama.cpp's
    ``v_trans``): the bytes after the K rows are V's columns, not its rows."""
    n, lay = 4, TRANSPOSED
    r = rows(lay, n)
    state = build_state(r, n, lay)
    off = 16 + 12 * n + 8 + lay.n_layer * (12 + n * lay.k_row) + 12  # first layer's V data
    v = r[0, :, lay.k_row :].reshape(n, lay.n_embd_v, lay.v_el)
    assert state[off : off + n * lay.v_el] == v[:, 0].tobytes()


@pytest.mark.parametrize("n", [1, 17, 300])
def test_v_rows_restored_into_the_state_are_transposed_in_place(n: int) -> None:
    """What a restore does with V transposed: each layer's V rows written into its V region
    of a new state, as rows, then :func:`transpose_v_rows`: the state is the one built from
    the rows, byte for byte (300 cells: more than a block of the transpose)."""
    lay = TRANSPOSED
    r = rows(lay, n)
    state, ks, vs = state_buffer(n, lay)
    for i in range(lay.n_layer):
        ks[i][:] = r[i, :, : lay.k_row]
        vs[i].reshape(n, lay.v_row)[:] = r[i, :, lay.k_row :]
    transpose_v_rows(vs, lay)
    assert state.tobytes() == build_state(r, n, lay)


@pytest.mark.parametrize("cpus", [{0}, {0, 1}, {0, 1, 2, 3}])
def test_per_layer_runs_every_layer_then_raises_the_lowest_layers_error(
    cpus: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state, "process_cpus", lambda: cpus)
    seen: list[int] = []

    def fill(i: int) -> None:
        seen.append(i)
        if i in (3, 5):
            raise StrataError(f"layer {i}")

    with pytest.raises(StrataError, match="layer 3"):
        per_layer(fill, 7)
    assert sorted(seen) == list(range(7))


def test_transposing_v_rows_of_a_layout_with_v_untransposed_is_refused() -> None:
    _, _, vs = state_buffer(4, PLAIN)
    with pytest.raises(StrataError, match="untransposed"):
        transpose_v_rows(vs, PLAIN)


@pytest.mark.parametrize("layout", [PLAIN, TRANSPOSED], ids=["plain", "transposed"])
def test_every_cut_and_every_extra_byte_is_refused(layout: Layout) -> None:
    state = build_state(rows(layout, 5), 5, layout)
    for cut in range(len(state)):
        with pytest.raises(StateLayoutError, match=r"0\.3\.36"):
            read_state(state[:cut], layout)
    with pytest.raises(StateLayoutError, match="cells of this context's layout take"):
        read_state(state + b"\0", layout)


def test_a_hostile_cell_count_is_refused_before_anything_is_allocated() -> None:
    state = build_state(rows(PLAIN, 2), 2, PLAIN)
    for count in (2**31, 2**32 - 1, 3):
        with pytest.raises(StateLayoutError, match=f"{count:,} cells"):
            read_state(_patched(state, 12, "<I", count), PLAIN)


@pytest.mark.parametrize("layout", [PLAIN, TRANSPOSED], ids=["plain", "transposed"])
def test_whole_context_states_round_trip_and_name_their_model(layout: Layout) -> None:
    r = rows(layout, 9)
    state = build_context_state(r, 9, layout, "llama")
    assert state[:9] == struct.pack("<I", 5) + b"llama"
    assert state[9:] == build_state(r, 9, layout)[8:]  # the sequence state's body
    assert np.array_equal(read_context_state(state, layout, "llama"), r)
    with pytest.raises(StateLayoutError, match="'qwen2'"):
        read_context_state(state, layout, "qwen2")


def test_a_layout_whose_sizes_do_not_add_up_is_refused() -> None:
    with pytest.raises(StrataError):
        Layout(**{**TRANSPOSED.__dict__, "v_row": 66})
    with pytest.raises(StrataError):
        Layout(**{**PLAIN.__dict__, "k_row": 0})


def _patched(state: bytes, offset: int, fmt: str, value: int) -> bytes:
    raw = bytearray(state)
    struct.pack_into(fmt, raw, offset, value)
    return bytes(raw)


def test_fields_of_another_layout_are_refused() -> None:
    n, lay = 5, PLAIN
    state = build_state(rows(lay, n), n, lay)
    k0 = 16 + 12 * n + 8  # the first layer's K header
    others = {
        "magic": _patched(state, 0, "<I", SEQ_MAGIC + 1),
        "streams": _patched(state, 8, "<I", 2),
        "a position": _patched(state, 16 + 12 * 2, "<i", 7),
        "two sequences in a cell": _patched(state, 16 + 4, "<I", 2),
        "v_trans": _patched(state, 16 + 12 * n, "<I", 1),
        "layers": _patched(state, 16 + 12 * n + 4, "<I", 4),
        "K type": _patched(state, k0, "<i", 1),
        "K row": _patched(state, k0 + 4, "<Q", 36),
        "V type": _patched(state, k0 + lay.n_layer * (12 + n * lay.k_row), "<i", 0),
    }
    for what, other in others.items():
        with pytest.raises(StateLayoutError) as e:
            read_state(other, lay)
        assert "llama-cpp-python 0.3.36" in str(e.value), what
    assert issubclass(StateLayoutError, StrataError)
    # the same bytes read with the other V layout: refused at v_trans, not misread
    with pytest.raises(StateLayoutError, match="v_trans"):
        read_state(
            build_state(rows(TRANSPOSED, 3), 3, TRANSPOSED),
            Layout(**{**TRANSPOSED.__dict__, "v_trans": False}),
        )


def test_rows_of_another_shape_are_not_built() -> None:
    with pytest.raises(StrataError):
        build_state(rows(PLAIN, 4)[:, :, :-1], 4, PLAIN)
