"""The GPU path's figures on a real device, each next to its baseline in the same run.

Run by tools/gpu_check.sh (``NUMBA_ENABLE_CUDASIM=0``), ``python tools/gpu_bench.py [MiB]``:

1. **kernels**: page hashing (BLAKE3, one block per page), against the device's host-to-device
   copy rate (pinned memory) and its device-to-device memcpy, plus the first-bad-page check and
   the ladder copy; medians of 5 after a warmup;
2. **end to end**: a validated restore of one conversation of ``MiB`` (default 1024: 8,192
   tokens of 32 layers x 8 kv heads x 128 x fp16, 128 KiB a token) from a disk level into a
   paged pool on the device (vLLM's layout, :class:`~stratastore.restore.DevicePagedKV`, a
   shuffled block table), against a raw read of the same segment files into pinned memory plus
   an unvalidated host-to-device copy of the same bytes; hot (page cache), medians of 3.

Targets: hashing >= 5x the host-to-device rate; end to end >= 0.9x the raw read plus
copy. ``end_to_end`` also runs under the simulator at a tiny size (tests/unit/test_gpu_bench.py)
so that this script is known to work before a device is lent.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numba import cuda

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from numba_kernels import first_bad_page, ladder_copy, page_hashes  # noqa: E402
from stratastore import Checkpoint, Conversation, Store  # noqa: E402
from stratastore.chain import as_tokens  # noqa: E402
from stratastore.format import ModelFingerprint, data_name  # noqa: E402
from stratastore.restore import DevicePagedKV  # noqa: E402

MIB = 1 << 20


def timed(fn: Callable[[], object], runs: int = 5) -> float:
    """Median seconds of ``fn`` (device work included), after one warmup."""
    fn()
    cuda.synchronize()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def kernels(total_mib: int = 512, page_kib: int = 64) -> None:
    n, pb = total_mib * MIB, page_kib * 1024
    host = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    pinned = cuda.pinned_array(n, dtype=np.uint8)
    pinned[:] = host
    src = cuda.to_device(host)
    dst = cuda.device_array(n, dtype=np.uint8)
    expected = page_hashes(host, pb)  # the reference (CPU, the blake3 package)
    got = page_hashes(src, pb)
    assert np.array_equal(got, expected), "device digests differ from the blake3 package"
    d_exp, d_got = cuda.to_device(expected), cuda.to_device(got)
    pages = n // pb
    table = cuda.to_device(np.random.default_rng(1).permutation(pages).astype(np.int64))
    pool = cuda.device_array(n, dtype=np.uint8)
    print(f"kernels: {total_mib} MiB, {page_kib} KiB pages")
    h2d = timed(lambda: dst.copy_to_device(pinned))
    rows = [
        ("host-to-device copy (pinned)", h2d),
        ("device-to-device memcpy", timed(lambda: dst.copy_to_device(src))),
        ("page hashing (BLAKE3)", timed(lambda: page_hashes(src, pb))),
        ("first-bad-page check", timed(lambda: first_bad_page(d_got, d_exp))),
        ("ladder copy via block table", timed(lambda: ladder_copy(src, pb, pages, pool, table))),
    ]
    for name, s in rows:
        print(f"  {name:<30} {n / s / 1e9:8.2f} GB/s  ({h2d / s:5.2f}x host-to-device)")


def engine_fp() -> ModelFingerprint:
    return ModelFingerprint.create(
        "bench/gpu", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
    )


def end_to_end(
    total_mib: int = 1024,
    fp: ModelFingerprint | None = None,
    runs: int = 3,
    block_size: int = 16,
    tokens: int | None = None,
) -> dict[str, Any]:
    """Park one conversation of ``total_mib`` to a disk level, then restore it into a device
    paged pool (validated on the device) and, on the same files, read it raw into pinned memory
    and copy that to the device unvalidated (``tokens``: that many instead of ``total_mib``).
    Returns the figures (and prints them)."""
    fp = fp or engine_fp()
    n = tokens or max(1, total_mib * MIB // fp.token_bytes)
    rng = np.random.default_rng(7)
    kv = rng.integers(0, 256, n * fp.token_bytes, dtype=np.uint8)
    with tempfile.TemporaryDirectory(prefix="strata-gpu-") as tmp:
        cfg = {
            "ram_mib": 0,
            "park": "disk",
            "cold_dir": str(Path(tmp) / "cold"),
            "cold_mib": max(64, 2 * total_mib),
        }
        with Store.open(fp, cfg) as store:
            prompt = as_tokens(np.arange(n))
            store.park(Conversation("bench", prompt, [Checkpoint(n)]), kv.copy())
            store.flush()
            files = [Path(tmp) / "cold" / data_name(k) for k in _segment_keys(store)]
            blocks = -(-n // block_size)
            table = np.random.default_rng(3).permutation(blocks + 8)[:blocks]
            shape = (2, blocks + 8, block_size, fp.n_kv_heads, fp.head_dim)
            pools = [cuda.device_array(shape, dtype=np.uint16) for _ in range(fp.n_layers)]
            dest = DevicePagedKV(fp, pools, table)
            sizes = [os.path.getsize(f) for f in files]
            pinned = cuda.pinned_array(sum(sizes), dtype=np.uint8)
            raw_dev = cuda.device_array(sum(sizes), dtype=np.uint8)

            def restore() -> None:
                r = store.restore(prompt, dest)
                assert r.tokens == n, r

            def raw() -> None:
                off = 0
                for f, size in zip(files, sizes, strict=True):
                    with open(f, "rb", buffering=0) as fh:
                        got = fh.readinto(memoryview(pinned[off : off + size]))
                        assert got == size
                    off += size
                raw_dev.copy_to_device(pinned)

            t_restore = timed(restore, runs)
            t_raw = timed(raw, runs)
            zeros = np.zeros(shape, np.uint16)
            for pool in pools:  # the check sees what one more restore wrote, not an earlier one
                pool.copy_to_device(zeros)
            restore()
            _check(fp, pools, table, kv, n, block_size)
    nbytes = n * fp.token_bytes
    out = {"bytes": nbytes, "restore_s": t_restore, "raw_s": t_raw, "ratio": t_raw / t_restore}
    print(
        f"end to end: {nbytes / MIB:,.0f} MiB, {n:,} tokens, paged pool of {block_size}-token "
        f"blocks, hot, medians of {runs}"
    )
    print(f"  validated restore into device pool  {nbytes / t_restore / 1e9:8.2f} GB/s")
    print(f"  raw read + unvalidated copy         {nbytes / t_raw / 1e9:8.2f} GB/s")
    print(f"  ratio                               {out['ratio']:8.2f}x (target >= 0.9x)")
    return out


def _segment_keys(store: Store) -> list[bytes]:
    """The segment keys of the one conversation parked (its chain, in order)."""
    view = store._tiers.view
    view.sync()
    return [k for _, _, k in view.convs["bench"].segments]


def _check(
    fp: ModelFingerprint,
    pools: list[Any],
    table: np.ndarray,
    kv: np.ndarray,
    n: int,
    block_size: int,
) -> None:
    """The pool holds ``kv`` (stored layout, one segment) token for token: checked on a sample
    of tokens (the first, the last, some between), so a wrong figure is never printed."""
    row = fp.n_kv_heads * fp.head_dim * fp.dtype.itemsize
    pt, tb = fp.page_tokens, fp.token_bytes
    sample = sorted({0, n - 1, *np.random.default_rng(5).integers(0, n, 16).tolist()})
    for layer in (0, fp.n_layers - 1):
        host = pools[layer].copy_to_host().view(np.uint8).reshape(2, -1, row)
        for t in sample:
            page, within = divmod(t, pt)
            p = min(pt, n - page * pt)
            base = page * pt * tb
            for kind in (0, 1):
                at = base + ((layer * 2 + kind) * p + within) * row
                slot = int(table[t // block_size]) * block_size + t % block_size
                assert np.array_equal(host[kind, slot], kv[at : at + row]), (layer, t, kind)


if __name__ == "__main__":
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    print(f"device: {cuda.get_current_device().name.decode()}")
    kernels(min(mib, 512))
    end_to_end(mib)
