"""Parse and rebuild llama.cpp's per-sequence state (``llama_state_seq_get_data``), as
llama-cpp-python 0.3.36 (llama.cpp 0c1e57098) writes it for a plain K/V cache
(``llama_kv_cache::state_write``), for the tests: an oracle written apart from the adapter's
reader (:mod:`stratastore.adapters.llamacpp.state`), general where it is strict. Layout (little
endian; llama.cpp's ``src/llama-context.cpp`` ``state_seq_get_data`` and
``src/llama-kv-cache.cpp`` ``state_write_meta`` / ``state_write_data``):

    u32 magic 0xaf143cd8, i32 seq_id                         (llama_context::state_seq_get_data)
    u32 n_stream
    per stream: u32 cell_count; when 0 nothing else for it, else
      per cell:  i32 pos, u32 n_seq_id, [12-byte ext: M-RoPE/PLE models only], n_seq_id x i32
      u32 v_trans, u32 n_layer
      per layer: i32 k_type, u64 k_row_bytes, cell_count x k_row_bytes
      v_trans=0, per layer: i32 v_type, u64 v_row_bytes, cell_count x v_row_bytes
      v_trans=1, per layer: i32 v_type, u32 v_el_bytes, u32 n_embd_v_gqa,
                 n_embd_v_gqa x (cell_count x v_el_bytes)   (element j of every cell, then j+1)

A whole-context state (``llama_state_get_data``) is ``u32 len, arch name`` then the same from
``n_stream`` on (seq_id -1: a cell may list several sequences). ``has_ext`` must be given for
M-RoPE / PLE models (the buffer does not say)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

SEQ_MAGIC = 0xAF143CD8
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_TYPE_ROW = struct.Struct("<iQ")  # type, row bytes
assert _TYPE_ROW.size == 12
_TYPE_EL = struct.Struct("<iII")  # type, element bytes, n_embd_v_gqa
assert _TYPE_EL.size == 12
EXT_BYTES = 12  # llama_kv_cell_ext: i32 x, i32 y, i32 tok


class _Reader:
    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.mv = memoryview(buf).cast("B")
        self.off = 0

    def take(self, n: int) -> memoryview:
        if self.off + n > len(self.mv):
            raise ValueError(f"state ends at {len(self.mv)}, needed {self.off + n}")
        out = self.mv[self.off : self.off + n]
        self.off += n
        return out

    def unpack(self, s: struct.Struct) -> tuple[Any, ...]:
        return s.unpack(self.take(s.size))


def parse(buf: bytes | bytearray | memoryview, *, has_ext: bool = False) -> dict[str, Any]:
    """The pieces of a sequence state (or a whole-context state) as numpy arrays: per stream
    ``positions`` [n], ``seq_ids`` (list of arrays), ``k`` per layer [n, k_row_bytes] uint8,
    ``v`` per layer [n, v_row_bytes] or, when ``v_trans``, [n_embd_v_gqa, n, v_el_bytes]."""
    r = _Reader(buf)
    head: dict[str, Any] = {}
    (first,) = r.unpack(_U32)
    if first == SEQ_MAGIC:
        head["kind"], (head["seq_id"],) = "seq", r.unpack(_I32)
    else:  # whole context: the architecture name first
        head["kind"], head["arch"] = "context", bytes(r.take(first)).decode()
    (n_stream,) = r.unpack(_U32)
    streams = []
    for _ in range(n_stream):
        (n,) = r.unpack(_U32)
        st: dict[str, Any] = {"cell_count": n}
        streams.append(st)
        if n == 0:
            continue
        pos = np.empty(n, np.int32)
        seq_ids, exts = [], []
        for i in range(n):
            pos[i], n_seq = struct.unpack("<iI", r.take(8))
            if has_ext:
                exts.append(bytes(r.take(EXT_BYTES)))
            seq_ids.append(np.frombuffer(r.take(4 * n_seq), "<i4").copy())
        st.update(positions=pos, seq_ids=seq_ids, exts=exts)
        v_trans, n_layer = r.unpack(struct.Struct("<II"))
        st.update(v_trans=bool(v_trans), n_layer=n_layer, k_type=[], k=[], v_type=[], v=[])
        for _ in range(n_layer):
            k_type, row = r.unpack(_TYPE_ROW)
            st["k_type"].append(k_type)
            st["k"].append(np.frombuffer(r.take(n * row), np.uint8).reshape(n, row).copy())
        for _ in range(n_layer):  # a layer without V (MLA) writes nothing: not handled here
            if not v_trans:
                v_type, row = r.unpack(_TYPE_ROW)
                v = np.frombuffer(r.take(n * row), np.uint8).reshape(n, row)
            else:
                v_type, el, n_embd_v = r.unpack(_TYPE_EL)
                v = np.frombuffer(r.take(n_embd_v * n * el), np.uint8).reshape(n_embd_v, n, el)
            st["v_type"].append(v_type)
            st["v"].append(v.copy())
    if r.off != len(r.mv):
        raise ValueError(f"{len(r.mv) - r.off} bytes left after the state (has_ext={has_ext}?)")
    return {**head, "n_stream": n_stream, "streams": streams}


def v_rows(st: dict[str, Any], layer: int) -> np.ndarray:
    """Layer ``layer``'s V as one row of bytes per cell [n, n_embd_v_gqa * el], either layout."""
    v = st["v"][layer]
    if not st["v_trans"]:
        return v
    return np.ascontiguousarray(v.transpose(1, 0, 2)).reshape(v.shape[1], -1)


def select(state: dict[str, Any], keep: np.ndarray, stream: int = 0) -> dict[str, Any]:
    """A copy of ``state`` holding only the cells ``keep`` (bool mask or indices) of ``stream``."""
    st = dict(state["streams"][stream])
    idx = np.arange(st["cell_count"])[keep]
    st["cell_count"] = len(idx)
    st["positions"] = st["positions"][idx]
    st["seq_ids"] = [st["seq_ids"][i] for i in idx]
    st["exts"] = [st["exts"][i] for i in idx] if st["exts"] else []
    st["k"] = [k[idx] for k in st["k"]]
    st["v"] = [v[:, idx] if st["v_trans"] else v[idx] for v in st["v"]]
    streams = list(state["streams"])
    streams[stream] = st
    return {**state, "streams": streams}


def prefix(state: dict[str, Any], n_tokens: int, stream: int = 0) -> dict[str, Any]:
    """The state of the first ``n_tokens`` positions (cells with ``pos < n_tokens``)."""
    return select(state, state["streams"][stream]["positions"] < n_tokens, stream)


def serialize(state: dict[str, Any]) -> bytes:
    """The bytes ``parse`` read (or a ``select``-ed state's bytes), for ``*_set_data``."""
    out = bytearray()
    if state["kind"] == "seq":
        out += struct.pack("<Ii", SEQ_MAGIC, state["seq_id"])
    else:
        name = state["arch"].encode()
        out += _U32.pack(len(name)) + name
    out += _U32.pack(state["n_stream"])
    for st in state["streams"]:
        n = st["cell_count"]
        out += _U32.pack(n)
        if n == 0:
            continue
        for i in range(n):
            ids = st["seq_ids"][i]
            out += struct.pack("<iI", int(st["positions"][i]), len(ids))
            if st["exts"]:
                out += st["exts"][i]
            out += np.asarray(ids, "<i4").tobytes()
        out += struct.pack("<II", int(st["v_trans"]), st["n_layer"])
        for t, k in zip(st["k_type"], st["k"], strict=True):
            out += _TYPE_ROW.pack(t, k.shape[1]) + k.tobytes()
        for t, v in zip(st["v_type"], st["v"], strict=True):
            if st["v_trans"]:
                out += _TYPE_EL.pack(t, v.shape[2], v.shape[0]) + v.tobytes()
            else:
                out += _TYPE_ROW.pack(t, v.shape[1]) + v.tobytes()
    return bytes(out)
