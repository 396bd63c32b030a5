"""``strata bench --peers``: stratastore against the formats engines use today, in one run, on
the same bytes (issue 7).

One K/V image (Llama-3.1-8B geometry: 128 KiB a token, fp16; 1 GiB by default) is written
durably and read back, hot (page cache warm) and cold (caches dropped), by:

- **stratastore**: park = the segment store's durable put of 8 segments (temp file, fsync,
  rename, fsync the directory, index commit); restore = the validated two-pass restore into a
  buffer the engine already touched;
- **raw**: one file, write + fsync / ``readinto`` a touched buffer (the disk's own limits);
- **numpy** ``np.save`` + fsync / ``np.load``; **safetensors** ``save_file`` + fsync /
  ``load_file``; **torch** ``torch.save`` + fsync / ``torch.load`` (each where installed,
  skipped with a note otherwise). None of the peers validates what it reads.

Every read ends with the bytes in the engine's K/V buffer (touched beforehand, as an engine's
is): the raw read and the restore write into it directly; the peers load with their own API and
the result is copied into it. Each operation runs in a forked child, so its peak extra RSS
(``ru_maxrss`` minus the RSS it started with, the buffer included) is its own; timings are
medians of ``rounds`` after a warmup; GB = 1e9 bytes.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .bench import SEGMENTS, drop_caches
from .format import ModelFingerprint
from .io import files
from .restore import FlatKV, Piece, two_pass_restore
from .store import SegmentStore

__all__ = ["run_peers"]

CHUNK = 16 << 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _in_child(fn: Callable[[np.ndarray], None], nbytes: int = 0) -> tuple[float, int]:
    """(seconds, peak extra RSS bytes) of ``fn(dst)`` run in a forked child, ``dst`` being a
    buffer of ``nbytes`` the child touched before the clock starts (the engine's own K/V
    buffer: writing into the parent's would time copy-on-write faults instead)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and exit, never return
        code = 0
        try:
            os.close(r)
            dst = np.ones(nbytes, dtype=np.uint8)
            start = _rss()
            t = time.perf_counter()
            fn(dst)
            dt = time.perf_counter() - t
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            os.write(w, f"{dt} {max(0, peak - start)}".encode())
        except BaseException as e:
            os.write(w, f"ERR {type(e).__name__}: {e}".encode())
            code = 1
        os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    text = data.decode()
    if not text or text.startswith("ERR"):
        raise RuntimeError(f"benchmark child failed: {text or 'no output'}")
    secs, extra = text.split()
    return float(secs), int(extra)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    files.fsync_dir(os.path.dirname(path))


def run_peers(work_dir: str | None = None, *, mib: int = 1024, rounds: int = 3,
              cold: bool = True) -> dict[str, Any]:  # fmt: skip
    fp = ModelFingerprint.create("bench/llama-3.1-8b-geometry", n_layers=32, n_kv_heads=8,
                                 head_dim=128, page_tokens=16)  # fmt: skip
    tokens = max(SEGMENTS, mib * (1 << 20) // fp.token_bytes // SEGMENTS * SEGMENTS)
    nbytes, per = tokens * fp.token_bytes, tokens // SEGMENTS
    own = work_dir is None
    root = tempfile.mkdtemp(prefix="strata-peers-") if own else os.path.abspath(work_dir or "")
    files.makedirs(root)
    kv = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    out = np.ones(nbytes, dtype=np.uint8)  # the engine's buffer, touched once
    have = {m: importlib.util.find_spec(m) is not None for m in ("torch", "safetensors")}
    notes = [f"{m} is not installed: skipped" for m, ok in have.items() if not ok]
    store_dir = os.path.join(root, "store")
    paths = {"raw": os.path.join(root, "raw.bin"), "numpy": os.path.join(root, "kv.npy"),
             "safetensors": os.path.join(root, "kv.safetensors"),
             "torch": os.path.join(root, "kv.pt")}  # fmt: skip
    pieces: list[Piece] = []

    def park(dst: np.ndarray) -> None:
        shutil.rmtree(store_dir, ignore_errors=True)
        with SegmentStore.open(store_dir, fp) as store:
            parent = store.root_key
            for i in range(SEGMENTS):
                a, b = i * per, (i + 1) * per
                r = store.put_kv(parent, np.arange(a, b), kv[a * fp.token_bytes:
                                 b * fp.token_bytes], token_start=a)  # fmt: skip
                parent = r.key

    def restore(dst: np.ndarray) -> None:
        with SegmentStore.open(store_dir, fp, create=False) as store:
            ps = [Piece(p.start, p.end, p.key, store) for p in pieces]
            o = two_pass_restore(ps, tokens, FlatKV(fp, dst), fp, resume_at=lambda t: 0)
            assert o.tokens == tokens

    def raw_write(dst: np.ndarray) -> None:
        fd = os.open(paths["raw"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = kv.data
            for i in range(0, nbytes, CHUNK):
                os.write(fd, view[i : i + CHUNK])
            os.fsync(fd)
        finally:
            os.close(fd)
        files.fsync_dir(root)

    def raw_read(dst: np.ndarray) -> None:
        with open(paths["raw"], "rb", buffering=0) as f:
            view = dst.data
            for i in range(0, nbytes, CHUNK):
                f.readinto(view[i : i + CHUNK])

    shaped = kv.view(np.float16).reshape(tokens, -1)

    def np_save(dst: np.ndarray) -> None:
        with open(paths["numpy"], "wb") as f:
            np.save(f, shaped)
        _fsync_path(paths["numpy"])

    def np_load(dst: np.ndarray) -> None:
        np.copyto(dst, np.load(paths["numpy"]).reshape(-1).view(np.uint8))

    def st_save(dst: np.ndarray) -> None:
        import torch
        from safetensors.torch import save_file

        save_file({"kv": torch.from_numpy(shaped)}, paths["safetensors"])
        _fsync_path(paths["safetensors"])

    def st_load(dst: np.ndarray) -> None:
        from safetensors.torch import load_file

        t = load_file(paths["safetensors"])["kv"]
        np.copyto(dst, t.numpy().reshape(-1).view(np.uint8))

    def torch_save(dst: np.ndarray) -> None:
        import torch

        torch.save(torch.from_numpy(shaped), paths["torch"])
        _fsync_path(paths["torch"])

    def torch_load(dst: np.ndarray) -> None:
        import torch

        np.copyto(dst, torch.load(paths["torch"]).numpy().reshape(-1).view(np.uint8))

    Op = Callable[[np.ndarray], None]
    peers: list[tuple[str, Op, Op]] = [
        ("stratastore (validated)", park, restore), ("raw", raw_write, raw_read),
        ("numpy", np_save, np_load),
    ]  # fmt: skip
    if have["torch"] and have["safetensors"]:
        peers.append(("safetensors", st_save, st_load))
    if have["torch"]:
        peers.append(("torch", torch_save, torch_load))
    samples: dict[tuple[str, str], list[tuple[float, int]]] = {}
    how = "-"
    try:
        for rnd in range(rounds + 1):  # round 0 warms up and is dropped
            order = peers if rnd % 2 else list(reversed(peers))
            for name, write, read in order:
                samples.setdefault((name, "durable write"), []).append(_in_child(write))
                if name.startswith("stratastore") and not pieces:
                    with SegmentStore.open(store_dir, fp, create=False) as store:
                        for k in store.keys():
                            sc = store.sidecar(k)
                            pieces.append(Piece(sc.token_start, sc.token_end, k, None))
                        pieces.sort(key=lambda p: p.start)
                read(out)  # warm the page cache, then time a hot read
                samples.setdefault((name, "read hot"), []).append(_in_child(read, nbytes))
                if cold:
                    targets = ([os.path.join(store_dir, n) for n in os.listdir(store_dir)]
                               if name.startswith("stratastore")
                               else [paths[name]])  # fmt: skip
                    how = drop_caches(targets)
                    samples.setdefault((name, "read cold"), []).append(_in_child(read, nbytes))
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
        else:
            for p in paths.values():
                files.unlink(p, missing_ok=True)
    table: dict[str, dict[str, Any]] = {}
    for (name, op), vals in samples.items():
        secs = statistics.median(v[0] for v in vals[1:] or vals)
        rss = max(v[1] for v in vals[1:] or vals)
        table.setdefault(name, {})[op] = {
            "gb_per_s": nbytes / secs / 1e9, "tokens_per_s": tokens / secs,
            "peak_extra_rss_mib": rss / 2**20,
        }  # fmt: skip
    ours = table["stratastore (validated)"]
    raw = table["raw"]
    ratios = {"park / raw write+fsync": ours["durable write"]["gb_per_s"]
              / raw["durable write"]["gb_per_s"]}  # fmt: skip
    for mode in ("read hot", "read cold") if cold else ("read hot",):
        ratios[f"restore / raw {mode}"] = ours[mode]["gb_per_s"] / raw[mode]["gb_per_s"]
        for name in table:
            if name not in ("raw", "stratastore (validated)"):
                ratios[f"restore / {name} {mode}"] = (ours[mode]["gb_per_s"]
                                                      / table[name][mode]["gb_per_s"])  # fmt: skip
    return {"bytes": nbytes, "tokens": tokens, "rounds": rounds, "cold_cache": how,
            "peers": table, "ratios": ratios, "notes": notes}  # fmt: skip
