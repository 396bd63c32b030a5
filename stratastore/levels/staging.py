"""Reusable host staging buffers for reads (DESIGN "Delivered means validated").

A read that validates before it delivers (``SegmentStore.get_into``, the restore's read pass
into a destination it cannot read straight into) first ``pread``s the bytes into memory the
process owns, hashes them there, and copies out of that same memory. The first touch of freshly
allocated memory costs about ten copies on the machines this runs on (page faults; see
FACTS.md), so those buffers are taken from, and given back to, a bounded pool instead of being
allocated per read. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_KEEP_BYTES", "STAGING", "StagingPool"]

#: idle staging the default pool keeps for reuse; larger reads allocate and drop their own
DEFAULT_KEEP_BYTES = 256 << 20
_GRAIN = 1 << 20  #: buffers are allocated in whole MiB so near sizes reuse one another


class StagingPool:
    """Byte buffers handed out by :meth:`take` and returned with :meth:`give`; at most
    ``keep_bytes`` of returned buffers are kept for the next :meth:`take`."""

    def __init__(
        self, keep_bytes: int = DEFAULT_KEEP_BYTES, alloc: Callable[[int], Any] | None = None
    ) -> None:
        """``alloc(n)``: a new buffer of ``n`` bytes (default: a numpy array; the device path
        passes pinned host or device memory, which slice and have ``size`` alike)."""
        self.keep_bytes = keep_bytes
        self._alloc = alloc or (lambda n: np.empty(n, dtype=np.uint8))
        self._free: list[npt.NDArray[np.uint8]] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """A writable, C-contiguous uint8 buffer of at least ``nbytes`` (its contents are
        whatever the last user left: the caller overwrites what it reads)."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.size >= nbytes]
            if fits:  # the smallest that fits (by position: arrays compare elementwise)
                return self._free.pop(min(fits, key=lambda i: self._free[i].size))
        return self._alloc(max(_GRAIN, -(-nbytes // _GRAIN) * _GRAIN))

    def give(self, buf: npt.NDArray[np.uint8]) -> None:
        """Return a buffer :meth:`take` handed out; kept when the pool has room, else dropped."""
        with self._lock:
            kept = any(b is buf for b in self._free)
            if not kept and sum(b.size for b in self._free) + buf.size <= self.keep_bytes:
                self._free.append(buf)

    def kept_bytes(self) -> int:
        with self._lock:
            return sum(b.size for b in self._free)


#: the process-wide pool the store's reads and the restore's read pass share
STAGING = StagingPool()
