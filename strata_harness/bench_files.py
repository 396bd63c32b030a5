"""What the side-by-side benchmarks of engine tiers (``tools/vllm_tier_bench.py``,
``tools/sglang_hicache_bench.py``) do to the files a tier wrote: drop them from the page cache
for the cold reads, and flip one byte of one stored chunk."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["drop_cache", "flip_one"]


def drop_cache(root: Path) -> None:
    """Every file under ``root`` dropped from the page cache (``posix_fadvise(DONTNEED)``)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def flip_one(root: Path, size: int) -> None:
    """One bit flipped in the middle file (by name) of those under ``root`` at least ``size``
    bytes long (a stored chunk of ``size`` bytes), ``size // 2`` bytes before its end."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size >= size)
    target = files[len(files) // 2]
    with open(target, "r+b") as f:
        f.seek(target.stat().st_size - size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))
