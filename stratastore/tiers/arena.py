"""The RAM level's host arena: one anonymous mapping reserved at open, cut into fixed chunks
and reused for every capture, populated as it is used.

Fresh memory is slow to touch on these VMs (the host takes freed pages back, so every first
write page-faults: ~0.6 GB/s measured); a buffer touched once and reused copies at memcpy speed
(~10 GB/s). The arena asks for transparent huge pages where the kernel offers them
(``MADV_HUGEPAGE``) and reserves only address space at open. A chunk is *populated* (its pages
faulted in: ``MADV_POPULATE_WRITE``, else one write a page) before a capture first writes it,
and stays populated (chunks are reused, never given back), so RSS grows with what the arena has
held, not with its size. ``prefault`` says when:

* ``lazy``: a chunk when an allocation first takes it, before :meth:`Arena.write`;
* ``background``: that, and once the arena has been used (its first allocation) a daemon
  thread keeps ``ahead_bytes`` of free chunks populated ahead of use, so later captures land in
  populated pages without waiting for the faults (it needs
  ``MADV_POPULATE_WRITE``, which never changes what a page holds; without it this is ``lazy``).
  It asks ``room`` before each chunk: while the machine has no room for it (the RAM level: the
  parking floor would not hold), it waits for the next allocation;
* ``open``: every chunk at open (the original behaviour: the whole arena resident before the
  first call).

An allocation is a list of chunk indices; a capture of N bytes takes ceil(N / chunk) chunks,
which need not be contiguous. Allocation, release and the copies are not thread-safe against
each other (the RAM level serialises them); the arena's own lock only keeps the free list and
the populate bookkeeping consistent with the populate thread, which :meth:`Arena.close` stops
and joins before it unmaps anything.
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stratastore.config import RamPrefault
from stratastore.errors import ConfigError
from stratastore.io.system import populate_write

__all__ = ["Allocation", "Arena"]

DEFAULT_CHUNK = 4 << 20


@dataclass(frozen=True, slots=True)
class Allocation:
    chunks: tuple[int, ...]
    nbytes: int


class Arena:
    """``nbytes`` of address space reserved now, populated as ``prefault`` says (see the module
    docstring). ``setting`` names what sized it (the RAM level's ``ram_mib``), for the
    :class:`ConfigError` raised when the system cannot reserve that much (the address space,
    ``RLIMIT_AS``, or the kernel's overcommit limit): a typed error naming the setting, never a
    raw ``OSError``/``MemoryError``."""

    def __init__(
        self,
        nbytes: int,
        *,
        chunk_bytes: int = DEFAULT_CHUNK,
        hugepages: bool = True,
        prefault: RamPrefault = "lazy",
        ahead_bytes: int = 0,
        room: Callable[[int], bool] | None = None,
        setting: str = "the arena size",
    ) -> None:
        if chunk_bytes < 4096 or chunk_bytes % 4096:
            raise ConfigError(f"arena chunk of {chunk_bytes} bytes must be a multiple of 4096")
        self.chunk = chunk_bytes
        self.n_chunks = max(0, nbytes // chunk_bytes)
        self._map = _reserve(max(self.n_chunks * chunk_bytes, mmap.PAGESIZE), setting)
        self.hugepages = hugepages and _ask_hugepages(self._map)
        self.buf: npt.NDArray[np.uint8] = np.frombuffer(self._map, dtype=np.uint8)
        self._addr: int = self.buf.ctypes.data
        self.prefault = prefault
        self._cv = threading.Condition(threading.Lock())
        self._free = list(range(self.n_chunks - 1, -1, -1))  #: popped from the end: 0, 1, ...
        self._in_use = bytearray(self.n_chunks)
        self._populated = bytearray(self.n_chunks)
        self._n_populated = 0
        self._n_ahead = 0  #: chunks the populate thread populated
        self._ready = 0  #: chunks both free and populated
        self._ahead = -(-ahead_bytes // chunk_bytes)
        self._next = 0  #: no chunk below this is left for the populate thread
        self._room = room or (lambda n: True)
        self._allocs = 0  #: allocations so far (a thread refused room waits for the next)
        self._closed = False
        self._thread: threading.Thread | None = None
        if prefault == "open":
            self._populate_owned(range(self.n_chunks))
        elif prefault == "background" and self._ahead:
            self._start_thread()

    @property
    def capacity(self) -> int:
        return self.n_chunks * self.chunk

    @property
    def free_bytes(self) -> int:
        return len(self._free) * self.chunk

    @property
    def populated_bytes(self) -> int:
        """Bytes of chunks populated so far (resident, or as good as: they are never freed)."""
        return self._n_populated * self.chunk

    @property
    def populated_ahead_bytes(self) -> int:
        """Bytes of those the populate thread populated ahead of use (``background``)."""
        return self._n_ahead * self.chunk

    def alloc(self, nbytes: int) -> Allocation | None:
        """Chunks for ``nbytes``, or ``None`` when the arena has too few free. Every chunk is
        populated when this returns (the ones never used before are populated now)."""
        need = -(-nbytes // self.chunk)
        with self._cv:
            if need > len(self._free):
                return None
            chunks = tuple(self._free.pop() for _ in range(need))
            for c in chunks:
                self._in_use[c] = 1
            cold = [c for c in chunks if not self._populated[c]]
            self._ready -= need - len(cold)
            self._allocs += 1
            self._cv.notify()  # fewer chunks ready: the populate thread tops them up
        if cold:
            self._populate_owned(cold)
        return Allocation(chunks, nbytes)

    def release(self, a: Allocation) -> None:
        with self._cv:
            for c in a.chunks:
                self._in_use[c] = 0
            self._ready += sum(self._populated[c] for c in a.chunks)
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

    def read_into(
        self, a: Allocation, dst: npt.NDArray[np.uint8], nbytes: int | None = None
    ) -> None:
        """Copy the first ``nbytes`` (default all) of the allocation into ``dst``."""
        limit = a.nbytes if nbytes is None else nbytes
        flat = dst.reshape(-1)
        for at, pos, n in self._spans(a):
            if pos >= limit:
                break
            n = min(n, limit - pos)
            flat[pos : pos + n] = self.buf[at : at + n]

    def close(self) -> None:
        """Stop and join the populate thread, then unmap. A second call does nothing."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        del self.buf
        self._map.close()

    # -- populating ---------------------------------------------------------------------------
    def _populate_owned(self, chunks: Iterable[int]) -> None:
        """Populate ``chunks``, which the caller owns (just allocated, or the arena at open):
        ``MADV_POPULATE_WRITE`` over each run of consecutive chunks, else one write a page
        (these chunks were never written, so they hold zeros: writing zeros keeps them)."""
        done: list[int] = []
        for first, count in _runs(chunks):
            at, n = first * self.chunk, count * self.chunk
            if not populate_write(self._addr + at, n):
                self.buf[at : at + n : mmap.PAGESIZE] = 0
            done.extend(range(first, first + count))
        with self._cv:
            self._mark(done)

    def _mark(self, chunks: Iterable[int]) -> int:
        """Record ``chunks`` populated (under the lock); a free one is ready for the next alloc.
        Returns how many were not populated before."""
        new = 0
        for c in chunks:
            if not self._populated[c]:
                self._populated[c] = 1
                new += 1
                self._ready += not self._in_use[c]
        self._n_populated += new
        return new

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._populate_ahead, name="strata-arena-populate", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no thread to be had (a tight RLIMIT_AS): populate on use only
            return
        self._thread = t

    def _next_cold(self) -> int | None:
        """The next chunk the populate thread should populate, or ``None`` (enough are ready,
        or none is left). Under the lock. Allocation takes never-used chunks in index order,
        so the lowest free chunk never populated is the next to be needed. Nothing before the
        first allocation: an arena that is never used takes no RAM."""
        if self._ready >= self._ahead or not self._allocs:
            return None
        while self._next < self.n_chunks and (
            self._populated[self._next] or self._in_use[self._next]
        ):
            self._next += 1  # an in-use chunk was populated by its allocation
        return self._next if self._next < self.n_chunks else None

    def _populate_ahead(self) -> None:
        """The populate thread: keep ``ahead_bytes`` of free chunks populated until close.
        Each populate runs outside the lock (an alloc never waits for it; a chunk allocated
        meanwhile is populated twice, harmlessly: the advice changes no byte) and only while
        the arena is open (close joins this thread before it unmaps)."""
        while (work := self._wait_for_work()) is not None:
            c, seen = work
            if not self._has_room():
                with self._cv:  # until the next allocation (or close)
                    while self._allocs == seen and not self._closed:
                        self._cv.wait()
            elif populate_write(self._addr + c * self.chunk, self.chunk):
                with self._cv:
                    self._n_ahead += self._mark((c,))
            else:
                return  # no MADV_POPULATE_WRITE here: allocations populate on first use

    def _wait_for_work(self) -> tuple[int, int] | None:
        """The next chunk to populate and the allocation count then, once there is one;
        ``None`` when the arena closes or every chunk is populated."""
        with self._cv:
            c = self._next_cold()
            while c is None and not self._closed and self._n_populated < self.n_chunks:
                self._cv.wait()
                c = self._next_cold()
            return None if self._closed or c is None else (c, self._allocs)

    def _has_room(self) -> bool:
        """Whether one more chunk may be made resident now (``room``; a probe that fails stops
        nothing: it counts as no room)."""
        try:
            return self._room(self.chunk)
        except Exception:
            return False


def _reserve(size: int, setting: str) -> mmap.mmap:
    """An anonymous private mapping of ``size`` bytes: address space only, nothing touched."""
    fix = f"{setting}: lower it to what this machine can reserve (the RAM level's budget)"
    if size > sys.maxsize:
        raise ConfigError(f"{fix}; {size:,} bytes is more than the address space")
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, MemoryError, OverflowError, ValueError) as e:
        raise ConfigError(f"{fix}; the system refused to reserve {size:,} bytes ({e})") from None


def _ask_hugepages(m: mmap.mmap) -> bool:
    """Ask for transparent huge pages (``MADV_HUGEPAGE``); whether the kernel took the advice."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        m.madvise(mmap.MADV_HUGEPAGE)
    except OSError:
        return False
    return True


def _runs(chunks: Iterable[int]) -> list[tuple[int, int]]:
    """``(first, count)`` of each run of consecutive indices in ``chunks``, in their order."""
    out: list[tuple[int, int]] = []
    for c in chunks:
        if out and out[-1][0] + out[-1][1] == c:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((c, 1))
    return out
