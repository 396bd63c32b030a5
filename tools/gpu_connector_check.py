"""The vLLM connector's worker side on a real GPU, without vLLM (which the device machine cannot
install): vLLM's caches as torch CUDA tensors (bfloat16, one a layer) in FlashAttention's
``[2, blocks, block_size, heads, dim]`` and FlashInfer's ``[blocks, 2, block_size, heads,
dim]``, the connector's own pool, saver and loader on them, against the same bytes in host
memory through the host path.

Run by tools/gpu_check.sh, ``python tools/gpu_connector_check.py``; each layout must show

* a park of a request (its prompt copied in the step, its finished pages from the held
  blocks) from the device pool writes the same segment files, byte for byte, as from the host;
* a load into other blocks (past a block vLLM's own cache holds) writes the same bytes into
  the device pool as into the host pool, and nothing else;
* with a flipped byte in a stored page, both loads stop at the same page and report the same
  blocks for vLLM to recompute, and the pools hold the same bytes.

It prints one line a layout and exits non-zero on the first difference.
``check(device=...)`` also runs under numba's CUDA simulator, with device memory seen only
through ``__cuda_array_interface__`` (tests/unit/test_gpu_connector_check.py), so the script is
known to work before a device is lent."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stratastore import ModelFingerprint, Store  # noqa: E402
from stratastore.adapters.vllm.loader import Loader  # noqa: E402
from stratastore.adapters.vllm.plan import LoadJob, SaveJob, conversation_id, save_cuts  # noqa: E402
from stratastore.adapters.vllm.pool import Pool  # noqa: E402
from stratastore.adapters.vllm.saver import Saver  # noqa: E402
from stratastore.adapters.vllm.tally import Tally  # noqa: E402
from stratastore.errors import StrataError  # noqa: E402
from stratastore.format.naming import DATA_SUFFIX  # noqa: E402
from stratastore.restore.device_arrays import as_device_array  # noqa: E402

DATA_OFFSET = 4096  #: where a segment file's pages start (spec F-SEG-3)


def _fp(layers: int, heads: int, dim: int, page: int) -> ModelFingerprint:
    return ModelFingerprint.create(
        "gpu-check",
        n_layers=layers,
        n_kv_heads=heads,
        head_dim=dim,
        page_tokens=page,
        dtype="bfloat16",
    )


def torch_cuda(a: np.ndarray) -> Any:
    """``a`` (int16) as vLLM's cache: a bfloat16 CUDA tensor of the same bytes."""
    import torch

    return torch.from_numpy(a).view(torch.bfloat16).cuda()


def _to_host(t: Any) -> np.ndarray:
    if hasattr(t, "cpu"):  # torch
        import torch

        return np.asarray(t.view(torch.int16).cpu().numpy())
    return np.asarray(as_device_array(t, "a device cache", StrataError).copy_to_host())


def _park(store: Store, pool: Pool, prompt: np.ndarray, n: int, ids: list[int], p: int) -> None:
    saver = Saver(store, pool, Tally())
    half = n // 2 - (n // 2) % p
    cid = conversation_id(prompt, "r")
    saver.submit(
        SaveJob("r", cid, prompt[:half], tuple(ids), save_cuts(half, p), held=False),
        pool.copy(ids, half),
    )
    saver.submit(SaveJob("r", cid, prompt[:n], tuple(ids), save_cuts(n, p, half)))
    saver.close()
    parks = saver.tally.snapshot()["parks"]
    if parks != 2:
        raise SystemExit(f"FAIL: {parks} of 2 parks durable")


def _load(dir: Path, fp: ModelFingerprint, pool: Pool, job: LoadJob, bs: int) -> set[int]:
    store = Store.open(fp, _config(dir))
    loader = Loader(store, pool, Tally(), bs)
    loader.start([job])
    errors = loader.errors()
    loader.close()
    store.close()
    return errors


def _config(dir: Path) -> dict[str, Any]:
    return {
        "ram_mib": 0,
        "park": "disk",
        "page_resume": True,
        "cold_dir": str(dir),
        "cold_mib": 4096,
        "create_dirs": True,
    }


def check(
    device: Callable[[np.ndarray], Any] = torch_cuda,
    *,
    layers: int = 4,
    heads: int = 8,
    dim: int = 128,
    page: int = 16,
    block: int = 16,
    blocks: int = 64,
    work: Path | None = None,
) -> list[str]:
    """The checks of the module, for both layouts; ``device`` makes a layer's device cache
    from its int16 bytes. Returns a line per layout; raises ``SystemExit`` on a difference."""
    fp = _fp(layers, heads, dim, page)
    lines = []
    root = Path(work or tempfile.mkdtemp(prefix="strata-gpu-connector-"))
    for kv_first in (True, False):
        name = "FlashAttention" if kv_first else "FlashInfer"
        shape = (2, blocks, block, heads, dim) if kv_first else (blocks, 2, block, heads, dim)
        rng = np.random.default_rng(7)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        src = {n: rng.integers(-30000, 30000, shape, dtype=np.int16) for n in names}
        ids = list(rng.permutation(blocks)[:8])
        n_tok = 8 * block
        prompt = np.arange(11, 11 + n_tok + 5, dtype=np.uint32)
        stores = {}
        for side in ("host", "device"):
            caches = {n: (a.copy() if side == "host" else device(a)) for n, a in src.items()}
            pool = Pool(fp, caches, block)
            if pool.device != (side == "device") or pool.kv_first != kv_first:
                raise SystemExit(f"FAIL {name}: the {side} pool was not read as such")
            d = root / f"{name}-{side}"
            store = Store.open(fp, _config(d))
            _park(store, pool, prompt, n_tok, ids, page)
            store.close()
            stores[side] = d
        files = {s: sorted(p.name for p in d.glob(f"*{DATA_SUFFIX}")) for s, d in stores.items()}
        if files["host"] != files["device"] or not files["host"]:
            raise SystemExit(f"FAIL {name}: segments differ: {files}")
        for f in files["host"]:
            if (stores["host"] / f).read_bytes() != (stores["device"] / f).read_bytes():
                raise SystemExit(f"FAIL {name}: segment {f} differs")
        # a flipped byte in the last segment's second page: the loads stop at its start
        last = max(files["host"], key=lambda f: (stores["host"] / f).stat().st_size)
        for side in ("host", "device"):
            path = stores[side] / last
            raw = bytearray(path.read_bytes())
            raw[DATA_OFFSET + fp.page_bytes + 3] ^= 0x20
            path.write_bytes(bytes(raw))
        dst_ids = list(rng.permutation(blocks)[:8])
        job = LoadJob("r2", prompt[:n_tok], tuple(dst_ids), block)
        base = {n: rng.integers(-30000, 30000, shape, dtype=np.int16) for n in names}
        got, errors = {}, {}
        for side in ("host", "device"):
            caches = {n: (a.copy() if side == "host" else device(a)) for n, a in base.items()}
            pool = Pool(fp, caches, block)
            errors[side] = _load(stores[side], fp, pool, job, block)
            got[side] = {n: (c if side == "host" else _to_host(c)) for n, c in caches.items()}
        if errors["host"] != errors["device"] or not errors["host"]:
            raise SystemExit(f"FAIL {name}: blocks reported {errors}")
        stop = n_tok // 2 + page  # the damaged page: the last segment's second
        for n in names:
            _compare(name, n, got, base[n], dst_ids, block, stop, kv_first)
        changed = sum(not np.array_equal(got["host"][n], base[n]) for n in names)
        lines.append(
            f"{name}: park equal ({len(files['host'])} segments), load equal, the ladder "
            f"stopped alike ({len(errors['host'])} of {len(dst_ids)} blocks reported), "
            f"{changed} of {layers} layers written"
        )
    return lines


def _compare(
    name: str,
    layer: str,
    got: dict[str, dict[str, np.ndarray]],
    base: np.ndarray,
    ids: list[int],
    block: int,
    stop: int,
    kv_first: bool,
) -> None:
    """The host and device pools after a load that stopped at token ``stop``: equal up to it;
    past it each holds its old bytes or zeros (a page read and taken back), never others;
    every other block untouched."""

    def blk(a: np.ndarray, i: int) -> np.ndarray:
        return a[:, i] if kv_first else a[i]  # [2, block, heads, dim]

    host, dev = got["host"][layer], got["device"][layer]
    for j, i in enumerate(ids):
        cut = min(max(stop - j * block, 0), block)
        if not np.array_equal(blk(host, i)[:, :cut], blk(dev, i)[:, :cut]):
            raise SystemExit(f"FAIL {name}: {layer} block {i} differs in what was delivered")
        for side in (host, dev):
            past, old = blk(side, i)[:, cut:], blk(base, i)[:, cut:]
            if past.any() and not np.array_equal(past, old):
                raise SystemExit(f"FAIL {name}: {layer} block {i} past the stop was written")
    rest = [i for i in range(base.shape[1 if kv_first else 0]) if i not in ids]
    for side in (host, dev):
        if any(not np.array_equal(blk(side, i), blk(base, i)) for i in rest):
            raise SystemExit(f"FAIL {name}: {layer}: a block outside the request was written")


def main() -> int:
    for line in check():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
