"""A writer process for the kill tests: puts segments and prints ``ACK <i> <key>`` after each
put returns (only then is it acknowledged). Segment i is reproducible from (seed, i)."""

from __future__ import annotations

import sys

import numpy as np

from stratastore.format import Codec
from stratastore.levels.local import SegmentStore
from tests.conftest import kv_bytes, tiny_fp


def segment(i: int, seed: int) -> tuple[np.ndarray, np.ndarray, Codec]:
    """Tokens, payload and codec of the i-th segment of a run."""
    rng = np.random.default_rng([seed, i])
    n = int(rng.integers(1, 3000))
    tokens = rng.integers(0, 50_000, n)
    codec = Codec.ZSTD if i % 5 == 4 else Codec.RAW
    return tokens, kv_bytes(tiny_fp(), n, seed * 100_000 + i), codec


def main(path: str, count: int, seed: int) -> None:
    with SegmentStore.open(path, tiny_fp()) as store:
        for i in range(count):
            tokens, payload, codec = segment(i, seed)
            r = store.put_kv(store.root_key, tokens, payload, token_start=0, codec=codec)
            print(f"ACK {i} {r.key.hex()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
