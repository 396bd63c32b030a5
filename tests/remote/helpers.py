"""Helpers of the tests of the shared remote level (real redis-server processes)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore import Checkpoint, Conversation, ModelFingerprint, Store, StoreConfig
from stratastore.chain import as_tokens
from stratastore.format import DATA_OFFSET, data_name
from stratastore.levels.redis.backend import RedisBackend
from stratastore.levels.redis.settings import RemoteSettings
from tests.conftest import run_with_timeout, tiny_fp

FP = tiny_fp()
BOUND = 60.0  #: seconds any one store call may take before a test calls it a hang


def unique_name(tag: str = "rv") -> str:
    return f"{tag}-{uuid.uuid4().hex[:16]}"


def conversation(
    cid: str, base: int, ends: list[int], *, seed: int = 0, fp: ModelFingerprint = FP
) -> tuple[Conversation, npt.NDArray[np.uint8]]:
    """Tokens ``base, base + 1, ...`` cut and checkpointed at each of ``ends``; random K/V
    seeded by ``seed`` (the same seed gives the same bytes whatever the cuts)."""
    n = ends[-1]
    conv = Conversation(
        cid,
        as_tokens(np.arange(base, base + n)),
        [Checkpoint(0), *(Checkpoint(e) for e in ends)],
        cuts=[0, *ends[:-1]],
    )
    rng = np.random.default_rng(seed)
    return conv, rng.integers(0, 256, n * fp.token_bytes, dtype=np.uint8)


def store_config(tmp: Path, sub: str, url: str | None, name: str, **kw: Any) -> StoreConfig:
    """No RAM level (every park goes to disk, then is pushed), a cold level of its own."""
    cfg: dict[str, Any] = {
        "ram_mib": 0,
        "park": "disk",
        "cold_dir": str(tmp / sub),
        "cold_mib": kw.pop("cold_mib", 64),
    }
    if url is not None:
        cfg.update(
            remote_url=url,
            remote_name=name,
            remote_mib=kw.pop("remote_mib", 64),
            remote_timeout_ms=kw.pop("remote_timeout_ms", 2000),
        )
    cfg.update(kw)
    return StoreConfig(**cfg)


def open_store(
    cfg: StoreConfig, warns: list[str] | None = None, fp: ModelFingerprint = FP
) -> Store:
    sink = warns if warns is not None else []
    store: Store = run_with_timeout(lambda: Store.open(fp, cfg, warn=sink.append), BOUND)
    return store


def park(store: Store, conv: Conversation, kv: npt.NDArray[np.uint8]) -> None:
    def go() -> None:
        report = store.park(conv, kv.copy())
        assert report.where == "disk", report
        store.flush()

    run_with_timeout(go, BOUND)


def backend(url: str, name: str, fp: ModelFingerprint = FP, **kw: Any) -> RedisBackend:
    return RedisBackend.open(RemoteSettings(url, name=name, **kw), fp)


def evict_parts(url: str, name: str, key: bytes) -> int:
    """Delete every part of segment ``key`` of store ``name`` (as an eviction would)."""
    import redis

    from stratastore.levels.redis.settings import namespace

    r = redis.Redis.from_url(url)
    try:
        names = list(r.scan_iter(match=f"{namespace(name, FP)}p/{{{key.hex()}}}/*", count=1000))
        return int(r.delete(*names)) if names else 0
    finally:
        r.close()


def segment_of(conv: Conversation, start: int) -> bytes:
    """The key of ``conv``'s segment starting at token ``start``."""
    return next(k for s, _, k in conv.segments(FP.digest()) if s == start)


def flip_local(folder: Path, key: bytes, offset: int) -> None:
    """Flip one payload byte (``offset`` bytes into the payload) of a local segment file."""
    path = folder / data_name(key)
    raw = bytearray(path.read_bytes())
    raw[DATA_OFFSET + offset] ^= 0x01
    path.write_bytes(bytes(raw))
