"""The RAM level's host arena: one anonymous mapping reserved at open, cut into fixed chunks
and reused for every capture (DESIGN layer 5, issue 4).

Fresh memory is slow to touch on these VMs (the host takes freed pages back, so every first
write page-faults: ~0.6 GB/s measured); a buffer touched once and reused copies at memcpy speed
(~10 GB/s). The arena asks for transparent huge pages where the kernel offers them
(``MADV_HUGEPAGE``) and prefaults every page at open, so no capture pays a fault.

An allocation is a list of chunk indices; a capture of N bytes takes ceil(N / chunk) chunks,
which need not be contiguous. Not thread-safe on its own: the RAM level serialises it.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError

__all__ = ["Allocation", "Arena"]

DEFAULT_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class Allocation:
    chunks: tuple[int, ...]
    nbytes: int


class Arena:
    """``nbytes`` of host memory reserved now. ``setting`` names what sized it (the RAM
    level's ``ram_mib``), for the :class:`ConfigError` raised when the system cannot give that
    much (the address space, ``RLIMIT_AS``, or the kernel's overcommit limit): a typed error
    naming the setting, never a raw ``OSError``/``MemoryError``."""

    def __init__(self, nbytes: int, *, chunk_bytes: int = DEFAULT_CHUNK,
                 hugepages: bool = True, prefault: bool = True,
                 setting: str = "the arena size") -> None:  # fmt: skip
        if chunk_bytes < 4096 or chunk_bytes % 4096:
            raise ConfigError(f"arena chunk of {chunk_bytes} bytes must be a multiple of 4096")
        self.chunk = chunk_bytes
        self.n_chunks = max(0, nbytes // chunk_bytes)
        size = max(self.n_chunks * chunk_bytes, mmap.PAGESIZE)
        fix = f"{setting}: lower it to what this machine can reserve (the RAM level's budget)"
        if size > sys.maxsize:
            raise ConfigError(f"{fix}; {size:,} bytes is more than the address space")
        try:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, MemoryError, OverflowError, ValueError) as e:
            raise ConfigError(
                f"{fix}; the system refused to reserve {size:,} bytes ({e})"
            ) from None
        self.hugepages = False
        if hugepages and hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self._map.madvise(mmap.MADV_HUGEPAGE)
                self.hugepages = True
        self.buf: npt.NDArray[np.uint8] = np.frombuffer(self._map, dtype=np.uint8)
        if prefault:
            self.buf[:: mmap.PAGESIZE] = 0  # one write a page faults the whole arena in now
        self._free = list(range(self.n_chunks - 1, -1, -1))

    @property
    def capacity(self) -> int:
        return self.n_chunks * self.chunk

    @property
    def free_bytes(self) -> int:
        return len(self._free) * self.chunk

    def alloc(self, nbytes: int) -> Allocation | None:
        """Chunks for ``nbytes``, or ``None`` when the arena has too few free."""
        need = -(-nbytes // self.chunk)
        if need > len(self._free):
            return None
        return Allocation(tuple(self._free.pop() for _ in range(need)), nbytes)

    def release(self, a: Allocation) -> None:
        self._free.extend(reversed(a.chunks))

    def _spans(self, a: Allocation) -> list[tuple[int, int, int]]:
        """``(arena offset, payload offset, length)`` of each chunk of ``a``."""
        out, pos = [], 0
        for c in a.chunks:
            n = min(self.chunk, a.nbytes - pos)
            out.append((c * self.chunk, pos, n))
            pos += n
        return out

    def write(self, a: Allocation, src: npt.NDArray[np.uint8]) -> None:
        """Copy ``a.nbytes`` bytes of ``src`` into the allocation (the capture)."""
        flat = src.reshape(-1)
        for at, pos, n in self._spans(a):
            self.buf[at : at + n] = flat[pos : pos + n]

    def read_into(self, a: Allocation, dst: npt.NDArray[np.uint8], nbytes: int | None = None
                  ) -> None:  # fmt: skip
        """Copy the first ``nbytes`` (default all) of the allocation into ``dst``."""
        limit = a.nbytes if nbytes is None else nbytes
        flat = dst.reshape(-1)
        for at, pos, n in self._spans(a):
            if pos >= limit:
                break
            n = min(n, limit - pos)
            flat[pos : pos + n] = self.buf[at : at + n]

    def close(self) -> None:
        del self.buf
        self._map.close()
