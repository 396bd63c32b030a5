"""``strata demo``: the main job, an end-to-end run of what the store does today.

Synthetic K/V of a real model's geometry (Llama-3.1-8B: 32 layers x 8 kv heads x 128 dims,
fp16, 128 KiB a token) for three conversations that share one system prompt, cut into
segments at message boundaries: park them durably (the shared prefix is stored once), restore
them validated, reopen and rebuild the index from the sidecars, then damage one page on disk and
show that the read refuses it.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import numpy.typing as npt

from .format import ChecksumMismatch, ModelFingerprint, data_name
from .format.naming import INDEX_DIR
from .store import SegmentStore

__all__ = ["run_demo"]


def _kv(fp: ModelFingerprint, seed: int, n_tokens: int) -> npt.NDArray[np.uint8]:
    block = np.random.default_rng(seed).integers(0, 256, fp.token_bytes, dtype=np.uint8)
    return np.tile(block, n_tokens)


def _cuts(total: int, system: int, turn: int) -> list[int]:
    cuts = [system]
    while cuts[-1] < total:
        cuts.append(min(cuts[-1] + turn, total))
    return cuts


def run_demo(path: str, tokens: int) -> int:
    fp = ModelFingerprint.create("demo/llama-3.1-8b-geometry", n_layers=32, n_kv_heads=8,
                                 head_dim=128, page_tokens=16, dtype="float16")  # fmt: skip
    system = min(512, max(tokens // 4, 1))
    turn = max((tokens - system) // 4, 1)
    print(f"strata demo: {path}")
    print(f"  model geometry: {fp.describe()}, {fp.token_bytes // 1024} KiB/token")
    convs = {name: np.concatenate([np.arange(system), np.arange(tokens - system) + 1000 * i])
             for i, name in enumerate(["A", "B", "C"], start=1)}  # fmt: skip
    chains: dict[str, list[tuple[bytes, int, int]]] = {}
    created = deduped = written = 0
    t = time.perf_counter()
    with SegmentStore.open(path, fp) as store:
        for name, toks in convs.items():
            parent, start, chain = store.root_key, 0, []
            for end in _cuts(len(toks), system, turn):
                seed = 0 if end == system else 1000 * ord(name) + end
                r = store.put_kv(parent, toks[start:end], _kv(fp, seed, end - start),
                                 token_start=start)  # fmt: skip
                created += r.created
                deduped += not r.created
                written += r.stored_bytes
                chain.append((r.key, start, end))
                parent, start = r.key, end
            chains[name] = chain
        park_s = time.perf_counter() - t
        print(f"  parked 3 conversations x {tokens} tokens: {created} segments written, "
              f"{deduped} shared prefix reused, {written / 1e6:,.0f} MB in {park_s:.2f} s "
              f"({written / park_s / 1e9:.2f} GB/s durable)")  # fmt: skip
        out = np.zeros(tokens * fp.token_bytes, dtype=np.uint8)  # touched, as engine buffers are
        t = time.perf_counter()
        restored = 0
        for chain in chains.values():
            for key, start, end in chain:
                store.get_into(key, out[start * fp.token_bytes : end * fp.token_bytes])
                restored += (end - start) * fp.token_bytes
        get_s = time.perf_counter() - t
        print(f"  restored all 3, every page BLAKE3-validated: {restored / 1e6:,.0f} MB in "
              f"{get_s:.2f} s ({restored / get_s / 1e9:.2f} GB/s)")  # fmt: skip
        entries = len(store)
    shutil.rmtree(os.path.join(path, INDEX_DIR))
    with SegmentStore.open(path, fp) as store:
        rebuilt = len(store)
        print(f"  index deleted and rebuilt from the sidecars: {rebuilt} of {entries} segments")
        victim, _, _ = chains["B"][-1]
        _flip_byte(os.path.join(path, data_name(victim)), 4096 + fp.page_bytes + 7)
        try:
            store.get_into(victim, out)
            verdict = "NOT DETECTED"
        except ChecksumMismatch as e:
            verdict = f"refused: page {e.page} of segment {victim.hex()[:12]}"
        print(f"  one byte flipped on disk -> read {verdict}")
    ok = rebuilt == entries and verdict.startswith("refused")
    print()
    print(f"  {'segments':<28}{entries:>12}")
    print(f"  {'shared-prefix reuses':<28}{deduped:>12}")
    print(f"  {'park GB/s (durable)':<28}{written / park_s / 1e9:>12.2f}")
    print(f"  {'restore GB/s (validated)':<28}{restored / get_s / 1e9:>12.2f}")
    print(f"  {'index rebuilt':<28}{'yes' if rebuilt == entries else 'NO':>12}")
    print(f"  {'damage detected':<28}{'yes' if verdict.startswith('refused') else 'NO':>12}")
    return 0 if ok else 1


def _flip_byte(path: str, offset: int) -> None:
    """Damage a file in place, as a bad disk would: deliberately outside the io layer."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))
