"""``strata bench``: the validated restore against the raw limits and a peer, in one run.

On one directory: a 1 GiB K/V image (Llama-3.1-8B geometry, 128 KiB a token, 8,192 tokens in 8
segments) stored by the segment store, the same bytes as one raw file, and the same K/V as a
numpy ``.npy`` file; and the same bytes again as 4 conversations of 2 segments, restored one by
one, as one batch through the read agenda (:mod:`stratastore.restore.agenda`), from 1, 2 and 4
threads through the continuous agenda (one reader for every thread's calls), and from 4 threads
each on its own pipeline. Each round
reads them all, hot (page cache warm) and cold (caches dropped: ``/proc/sys/vm/drop_caches`` as
root, else ``posix_fadvise(DONTNEED)`` per file), interleaved; the figures are medians. The
restore is the real two-pass path (every page BLAKE3-validated, then applied) into a buffer the
engine already touched; ``np.load`` allocates its result, as that is its API.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stratastore.format import ModelFingerprint
from stratastore.io import files
from stratastore.levels.local import SegmentStore
from stratastore.restore import (
    FlatKV,
    Job,
    Outcome,
    Piece,
    SharedAgenda,
    restore_batch,
    two_pass_restore,
)

__all__ = ["drop_caches", "run_bench"]

SEGMENTS = 8
BATCH = 4  #: restores submitted together in the batched-agenda rows
THREADS = (1, 2, 4)  #: threads restoring those through the continuous agenda


def drop_caches(paths: list[str]) -> str:
    """Empty the page cache of ``paths``; returns how ("drop_caches" or "fadvise")."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise"


def run_bench(
    work_dir: str | None = None, *, mib: int = 1024, rounds: int = 3, cold: bool = True
) -> dict[str, Any]:
    fp = ModelFingerprint.create(
        "bench/llama-3.1-8b-geometry", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
    )
    tokens = max(SEGMENTS, mib * (1 << 20) // fp.token_bytes // SEGMENTS * SEGMENTS)
    nbytes = tokens * fp.token_bytes
    own = work_dir is None
    root = tempfile.mkdtemp(prefix="strata-bench-") if own else os.path.abspath(work_dir or "")
    files.makedirs(root)
    try:
        kv = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
        per = tokens // SEGMENTS
        with SegmentStore.open(os.path.join(root, "store"), fp) as store:
            parent, pieces = store.root_key, []
            for i in range(SEGMENTS):
                a, b = i * per, (i + 1) * per
                r = store.put_kv(
                    parent,
                    np.arange(a, b),
                    kv[a * fp.token_bytes : b * fp.token_bytes],
                    token_start=a,
                )
                pieces.append(Piece(a, b, r.key, store))
                parent = r.key
            # the same bytes again as BATCH conversations of SEGMENTS // BATCH segments (other
            # token ids, so other segments): N restores submitted together vs one
            quarter, chains = tokens // BATCH, []
            for c in range(BATCH):
                parent, chain = store.root_key, []
                for a in range(c * quarter, (c + 1) * quarter, per):
                    b = a + per
                    lo = a - c * quarter
                    r = store.put_kv(
                        parent,
                        np.arange(a, b) + tokens,
                        kv[a * fp.token_bytes : b * fp.token_bytes],
                        token_start=lo,
                    )
                    chain.append(Piece(lo, lo + per, r.key, store))
                    parent = r.key
                chains.append(chain)
            raw = os.path.join(root, "raw.bin")
            with open(raw, "wb") as f:
                f.write(kv.data)
            npy = os.path.join(root, "kv.npy")
            np.save(npy, kv.reshape(tokens, -1))
            del kv
            out = np.ones(nbytes, dtype=np.uint8)  # touched once: an engine's own buffer
            chunk = 16 << 20

            passes: dict[str, list[float]] = {}
            phase = ["warmup"]

            def restore() -> None:
                o = two_pass_restore(  # read straight into `out`, as Store.restore does
                    pieces, tokens, FlatKV(fp, out, read_direct=True), fp, resume_at=lambda t: 0
                )
                assert o.tokens == tokens
                passes.setdefault(f"read pass {phase[0]}", []).append(o.read_s)
                passes.setdefault(f"apply pass {phase[0]}", []).append(o.apply_s)

            def jobs() -> list[Job]:
                qb = quarter * fp.token_bytes
                return [
                    Job(
                        chain,
                        quarter,
                        FlatKV(fp, out[c * qb : (c + 1) * qb], read_direct=True),
                        fp,
                        lambda t: 0,
                    )
                    for c, chain in enumerate(chains)
                ]

            def one_by_one() -> None:
                for j in jobs():
                    o = two_pass_restore(j.pieces, j.wanted, j.dest, fp, resume_at=j.resume_at)
                    assert o.tokens == quarter

            def batched() -> None:
                got = restore_batch(jobs())
                assert all(isinstance(o, Outcome) and o.tokens == quarter for o in got), got

            agenda = SharedAgenda()

            def threads(n: int, shared: bool) -> Callable[[], None]:
                """The BATCH restores from ``n`` threads, each restoring its share one call at a
                time: through the continuous agenda (``shared``), or each call on its own
                pipeline."""

                def run() -> None:
                    todo = jobs()
                    got: list[Outcome | Exception] = []

                    def worker(k: int) -> None:
                        for j in todo[k::n]:
                            got.extend(agenda.run([j]) if shared else restore_batch([j]))

                    pool = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
                    for t in pool:
                        t.start()
                    for t in pool:
                        t.join()
                    assert len(got) == BATCH
                    assert all(isinstance(o, Outcome) and o.tokens == quarter for o in got), got

                return run

            def raw_read() -> None:
                with open(raw, "rb", buffering=0) as f:
                    view = out.data
                    for i in range(0, nbytes, chunk):
                        f.readinto(view[i : i + chunk])

            def np_load() -> None:
                np.load(npy)

            ops: list[tuple[str, Callable[[], None]]] = [
                ("restore (validated)", restore),
                ("raw read", raw_read),
                ("np.load", np_load),
                (f"{BATCH} restores one by one", one_by_one),
                (f"{BATCH} restores batched", batched),
                *(
                    (
                        f"{BATCH} restores, {n} thread{'s' * (n > 1)}, continuous agenda",
                        threads(n, True),
                    )
                    for n in THREADS
                ),
                (f"{BATCH} restores, {BATCH} threads, own pipelines", threads(BATCH, False)),
            ]
            paths = [raw, npy] + [
                os.path.join(store.path, n)
                for n in os.listdir(store.path)
                if n.startswith("strata-conv-")
            ]
            samples: dict[str, list[float]] = {}
            how = "-"
            for rnd in range(rounds + 1):  # round 0 warms up and is dropped
                order = ops if rnd % 2 else list(reversed(ops))
                for name, fn in order:
                    phase[0] = "warmup"
                    fn()  # hot: the file was just read
                    phase[0] = "hot"
                    t = time.perf_counter()
                    fn()
                    samples.setdefault(f"{name} hot", []).append(time.perf_counter() - t)
                    if cold:
                        how = drop_caches(paths)
                        phase[0] = "cold"
                        t = time.perf_counter()
                        fn()
                        samples.setdefault(f"{name} cold", []).append(time.perf_counter() - t)
        gbs = {k: nbytes / statistics.median(v[1:]) / 1e9 for k, v in samples.items()}
        ratios = {}
        for mode in ("hot", "cold") if cold else ("hot",):
            base = gbs[f"raw read {mode}"]
            ratios[f"restore/raw {mode}"] = gbs[f"restore (validated) {mode}"] / base
            ratios[f"restore/np.load {mode}"] = (
                gbs[f"restore (validated) {mode}"] / gbs[f"np.load {mode}"]
            )
            batch = gbs[f"{BATCH} restores batched {mode}"]
            ratios[f"batched/one restore {mode}"] = batch / gbs[f"restore (validated) {mode}"]
            ratios[f"batched/one by one {mode}"] = (
                batch / gbs[f"{BATCH} restores one by one {mode}"]
            )
            for n in THREADS:
                name = f"{BATCH} restores, {n} thread{'s' * (n > 1)}, continuous agenda {mode}"
                ratios[f"continuous {n}/batched {mode}"] = gbs[name] / batch
            ratios[f"continuous {BATCH}/own pipelines {mode}"] = (
                gbs[f"{BATCH} restores, {BATCH} threads, continuous agenda {mode}"]
                / gbs[f"{BATCH} restores, {BATCH} threads, own pipelines {mode}"]
            )
        # where a hot restore's time goes: the read pass (pread straight into the caller's buffer
        # and BLAKE3 of every page there, on every core) and the apply pass (nothing left to copy
        # for a direct read: only the zeroing of what a ladder stop does not deliver)
        split = {
            f"restore {k}": nbytes / statistics.median(v[1:]) / 1e9
            for k, v in passes.items()
            if not k.endswith("warmup") and statistics.median(v[1:]) > 0
        }
        agenda.close()
        return {
            "bytes": nbytes,
            "tokens": tokens,
            "segments": SEGMENTS,
            "rounds": rounds,
            "cold_cache": how,
            "gb_per_s": gbs,
            "ratios": ratios,
            "restore_passes_gb_per_s": split,
        }
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
        else:
            for name in ("raw.bin", "kv.npy"):
                files.unlink(os.path.join(root, name), missing_ok=True)
