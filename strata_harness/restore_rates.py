"""Validated restores and durable parks beside the machine's own rates, on the same bytes, rounds
interleaved in one process: ``tools/cold_restore.py`` and ``make bench`` print it.

The K/V and the pool are those of ``strata bench --peers``' engine-pool protocol
(:mod:`strata_harness.peer_pool`: the Llama-3.1-8B geometry, 128 KiB a token, vLLM's paged
layout, a shuffled block table). stratastore parks the pool to a disk level
(``Store.park(conv, PagedKV(...))`` + ``flush()``) and restores into another pool, every page
validated. Each round runs each operation once (GB = 1e9 bytes; listed here as the table shows
them, run writes first, then the hot reads, then the cold ones):

- **raw cold read**: ``pread`` of the store's data files, 4 MiB a call, one thread, into one
  touched buffer (the bytes a restore reads, unvalidated);
- **restore cold**, then **numpy cold**: ``np.load`` of the same K/V saved with ``np.save``
  (``[layers, 2, tokens, heads, head_dim]``) and its copy into the pool through the block
  table, what an engine keeping its K/V in numpy files pays;
- **restore cold, flat page layout**: the same restore into a touched buffer in the stored
  page layout (a stored region: one ``pread`` a run of pages, one hash call a page), what the
  read pass does when the destination does not scatter;
- **restore hot**, **numpy hot**, **restore hot, flat page layout**: the same with the files
  resident;
- **BLAKE3 on both cores**: the data files' pages (in memory already) hashed, one thread a
  core, each page in one call: the rate at which the cores hash these bytes and nothing else;
- **read + BLAKE3 on both cores**: each page ``pread`` from the resident files into its place
  in a touched buffer the size of the data and hashed there in one call, groups of two pages
  dealt to one thread a core: the plain way to read and validate them (one copy, one hash,
  nothing scattered; a restore that hashes a run while it is still in the core's cache can
  beat it);
- **durable park** (into a new store) and **raw write + fsync** (the same bytes, one file, 4
  MiB writes, the file and its directory fsynced).

Cold operations follow an eviction of their files (fsync + ``POSIX_FADV_DONTNEED``, checked
with ``mincore``: more than 1% resident stops the run); hot ones a check that every page is
resident. Each figure is the median of ``rounds`` after one warmup round, with the lowest and
the highest beside it (the spread); the ratios are of medians.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import blake3
import numpy as np

from strata_harness.peer_pool import BLOCK, Pool
from strata_harness.peer_protocol import (
    TOKEN_BYTES,
    PeersBenchError,
    data_files,
    evict,
    fingerprint,
    fsync_dir,
    warm,
)

if TYPE_CHECKING:
    from stratastore import Store

__all__ = ["OPS", "RATIOS", "Bench", "Rates", "measure", "render"]

READ_BYTES = 4 << 20  #: bytes a raw read or write moves a call
MAX_RESIDENT = 0.01  #: a cold read with more of its files resident stops the run
GROUP = 2  #: pages a hashing thread takes at a time (4 MiB: a read group of the restore's pool)

RAW_COLD, RESTORE_COLD, NUMPY_COLD = "raw cold read", "restore cold", "numpy load + scatter, cold"
RESTORE_HOT, NUMPY_HOT = "restore hot", "numpy load + scatter, hot"
BLAKE3_2, READ_BLAKE3_2 = "BLAKE3 on both cores", "read + BLAKE3 on both cores, hot"
PARK, RAW_WRITE = "durable park", "raw write + fsync"
FLAT_COLD, FLAT_HOT = "restore cold, flat page layout", "restore hot, flat page layout"
OPS = (
    RAW_COLD,
    RESTORE_COLD,
    NUMPY_COLD,
    FLAT_COLD,
    RESTORE_HOT,
    NUMPY_HOT,
    FLAT_HOT,
    BLAKE3_2,
    READ_BLAKE3_2,
    PARK,
    RAW_WRITE,
)
#: (mine, against, target: None where there is none); ratios of medians
RATIOS: list[tuple[str, str, float | None]] = [
    (RESTORE_COLD, RAW_COLD, 0.8),
    (RESTORE_COLD, NUMPY_COLD, 1.0),
    (RESTORE_HOT, BLAKE3_2, 0.8),
    (RESTORE_HOT, READ_BLAKE3_2, None),
    (RESTORE_HOT, NUMPY_HOT, 1.0),
    (FLAT_HOT, READ_BLAKE3_2, None),
    (PARK, RAW_WRITE, 0.8),
]


@dataclass
class Rates:
    """What :func:`measure` found: GB/s and cores busy (process CPU seconds over wall seconds)
    per operation and round, the machine's load, the size."""

    nbytes: int
    rounds: int
    gbps: dict[str, list[float]] = field(default_factory=dict)
    cores: dict[str, list[float]] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)  #: the 1-minute load average at the start and end

    def median(self, op: str) -> float:
        return statistics.median(self.gbps[op])

    def ratio(self, mine: str, other: str) -> float:
        return self.median(mine) / self.median(other)


class Bench:
    """The files and pools of one run under ``root`` (made by :meth:`__init__`, outside every
    clock)."""

    def __init__(self, root: str, tokens: int) -> None:
        from stratastore import Store
        from stratastore.chain import Checkpoint, Conversation

        self.root, self.tokens, self.nbytes = root, tokens, tokens * TOKEN_BYTES
        self.fp = fingerprint()
        self.pool = Pool(tokens)
        rng = np.random.default_rng(0)
        for layer in self.pool.layers:  # bytes that differ page to page, as K/V does
            layer.view(np.uint16)[:] = rng.integers(0, 1 << 16, layer.shape, dtype=np.uint16)
        self.prompt = np.arange(tokens, dtype=np.uint32)
        self.conv = Conversation("rates", self.prompt, [Checkpoint(tokens)])
        self.store_dir = os.path.join(root, "store")
        with Store.open(self.fp, self._config(self.store_dir)) as store:
            store.park(self.conv, self.pool.destination(self.fp))
            store.flush()
        self.paths = [
            p
            for p in data_files([self.store_dir])
            if os.path.basename(p).startswith("strata-conv-")
        ]
        if sum(os.path.getsize(p) for p in self.paths) < self.nbytes:
            raise PeersBenchError(f"the store's data files hold less than {self.nbytes:,} bytes")
        self.kv = self.pool.gather(tokens)
        self.npy = os.path.join(root, "kv.npy")
        np.save(self.npy, self.kv)
        self.target = Pool(tokens, seed=1)
        self.store: Store | None = None  #: the parked store, opened once (:meth:`open_store`)
        self.parked: Store | None = None  #: where the timed parks go (:meth:`new_store`)
        self.buf = np.ones(READ_BYTES, np.uint8)
        self.pages = self._load_pages()
        self.cores = max(1, min(os.cpu_count() or 1, 8))
        self.hashers = ThreadPoolExecutor(self.cores, thread_name_prefix="rates-hash")
        #: each page's place in memory of the data's size (the stored pages end to end)
        self.at = np.concatenate([[0], np.cumsum([n for _, _, n in self.pages])]).tolist()
        #: the pages each hashing thread takes, by their index: groups of ``GROUP`` pages dealt
        #: in turn, as the read pool deals a restore's groups
        self.parts = [
            [i for i in range(len(self.pages)) if i // GROUP % self.cores == k]
            for k in range(self.cores)
        ]
        self.memory = [_read(p, o, n) for p, o, n in self.pages]  #: for BLAKE3 alone
        self.touched = np.ones(int(self.at[-1]), np.uint8)  #: read + BLAKE3's
        self.flat = np.ones(self.nbytes, np.uint8)  #: the flat page layout's restores

    def _config(self, where: str) -> dict[str, Any]:
        mib = 2 * self.nbytes // 2**20 + 64
        return {"park": "disk", "ram_mib": 0, "cold_dir": where, "cold_mib": mib}

    def _load_pages(self) -> list[tuple[str, int, int]]:
        """(file, offset, bytes) of each stored page of the data files (their payloads, after
        each file's header: spec F-SEG)."""
        from stratastore.format import decode_segment_header
        from stratastore.format.naming import DATA_SUFFIX

        out = []
        pb = self.fp.page_tokens * TOKEN_BYTES
        for p in (p for p in self.paths if p.endswith(DATA_SUFFIX)):
            with open(p, "rb") as f:
                start = decode_segment_header(f.read(4096), p).data_offset
            size = os.path.getsize(p)
            out += [(p, o, min(pb, size - o)) for o in range(start, size, pb)]
        return out

    # -- the operations: each returns the bytes it moved ------------------------------------
    def raw_cold(self) -> int:
        view, n = self.buf.data, 0
        for p in self.paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                off = 0
                while got := os.preadv(fd, [view], off):
                    off += got
                n += off
            finally:
                os.close(fd)
        return n

    def restore(self) -> int:
        """Into the target pool through the store :meth:`open_store` opened (the engine opens
        its store once, not per restore)."""
        assert self.store is not None
        got = self.store.restore(self.prompt, self.target.destination(self.fp))
        return int(got.tokens) * TOKEN_BYTES

    def restore_flat(self) -> int:
        """Into a touched buffer in the stored page layout (a stored region: a ``pread`` a run
        of pages, a hash call a page)."""
        assert self.store is not None
        return int(self.store.restore(self.prompt, self.flat).tokens) * TOKEN_BYTES

    def check_flat(self) -> None:
        """The flat restore holds the stored pages, bit for bit (outside the clock); refilled
        with other bytes for the next one."""
        for i, page in enumerate(self.memory):
            if self.flat[self.at[i] : self.at[i + 1]].tobytes() != page:
                raise PeersBenchError("a restore into the flat layout differs from the pages")
        self.flat.fill(1)

    def open_store(self) -> None:
        """The store holding the parked pool, opened (outside the clock) if it is not."""
        from stratastore import Store

        if self.store is None:
            self.store = Store.open(self.fp, self._config(self.store_dir))

    def numpy(self) -> int:
        kv = np.load(self.npy)
        self.target.scatter(kv, self.tokens)
        return int(kv.nbytes)

    def _split(self, run: Callable[[list[int]], None]) -> int:
        """``run`` over :attr:`parts` (one a core) on the hashing threads; the bytes."""
        list(self.hashers.map(run, self.parts))
        return int(self.at[-1])

    def blake3_both(self) -> int:
        """Each page hashed in one call, from memory (read in before every clock)."""

        def run(part: list[int]) -> None:
            for i in part:
                blake3.blake3(self.memory[i]).digest()

        return self._split(run)

    def read_blake3_both(self) -> int:
        """Each page ``pread`` into its own place in a touched buffer the size of the data
        (as a restore writes every byte to memory of its own) and hashed there in one call."""

        def run(part: list[int]) -> None:
            view = self.touched.data
            fds: dict[str, int] = {}
            try:
                for i in part:
                    path, off, _ = self.pages[i]
                    if path not in fds:
                        fds[path] = os.open(path, os.O_RDONLY)
                    into = view[self.at[i] : self.at[i + 1]]
                    os.preadv(fds[path], [into], off)
                    blake3.blake3(into).digest()
            finally:
                for fd in fds.values():
                    os.close(fd)

        return self._split(run)

    def new_store(self) -> None:
        """An empty store for the next park, opened outside the clock."""
        from stratastore import Store

        where = os.path.join(self.root, "park")
        if self.parked is not None:
            self.parked.close()
        shutil.rmtree(where, ignore_errors=True)
        os.makedirs(where)
        self.parked = Store.open(self.fp, self._config(where))

    def park(self) -> int:
        """``park`` + ``flush``: durable when it returns."""
        assert self.parked is not None
        self.parked.park(self.conv, self.pool.destination(self.fp))
        self.parked.flush()
        return self.nbytes

    def raw_write(self) -> int:
        path = os.path.join(self.root, "raw.bin")
        data = self.kv.reshape(-1).view(np.uint8)
        view = data.data
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for i in range(0, data.size, READ_BYTES):
                os.write(fd, view[i : i + READ_BYTES])
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.root)
        return int(data.size)

    def close(self) -> None:
        self.hashers.shutdown()
        for store in (self.store, self.parked):
            if store is not None:
                store.close()


def measure(root: str, *, tokens: int = 8192, rounds: int = 5) -> Rates:
    """Every operation of the module's list, ``rounds`` times after a warmup round, in a new
    directory under ``root`` (removed after). ``tokens``: whole blocks of the pool."""
    if tokens <= 0 or tokens % BLOCK:
        raise PeersBenchError(f"tokens must be a positive multiple of {BLOCK}, not {tokens}")
    if rounds < 1:
        raise PeersBenchError(f"rounds must be at least 1, not {rounds}")
    where = os.path.join(root, f"strata-rates-{os.getpid()}")
    os.makedirs(where)
    b: Bench | None = None
    try:
        b = Bench(where, tokens)
        bench = b
        #: name: (operation, its files (evicted before a cold one, checked resident before a
        #: hot one), cold, what runs first outside the clock), in the order a round runs them:
        #: the writes first, so that the device has finished their writeback (the writes'
        #: fsync returns before it has, on a virtual disk) by the time the cold reads run
        ops: dict[str, tuple[Callable[[], int], list[str] | None, bool, Callable[[], None]]] = {
            PARK: (bench.park, None, False, bench.new_store),
            RAW_WRITE: (bench.raw_write, None, False, _nothing),
            BLAKE3_2: (bench.blake3_both, None, False, _nothing),
            READ_BLAKE3_2: (bench.read_blake3_both, bench.paths, False, _nothing),
            RESTORE_HOT: (bench.restore, bench.paths, False, bench.open_store),
            NUMPY_HOT: (bench.numpy, [bench.npy], False, _nothing),
            FLAT_HOT: (bench.restore_flat, bench.paths, False, bench.open_store),
            RAW_COLD: (bench.raw_cold, bench.paths, True, _nothing),
            RESTORE_COLD: (bench.restore, bench.paths, True, bench.open_store),
            NUMPY_COLD: (bench.numpy, [bench.npy], True, _nothing),
            FLAT_COLD: (bench.restore_flat, bench.paths, True, bench.open_store),
        }
        rates = Rates(bench.nbytes, rounds, load=(os.getloadavg()[0], 0.0))
        for rnd in range(rounds + 1):
            for name, (op, files, is_cold, first) in ops.items():
                first()
                if files is not None and is_cold and evict(files) > MAX_RESIDENT:
                    raise PeersBenchError(f"{name}: the files stayed in the page cache")
                if files is not None and not is_cold and warm(files) < 0.99:
                    raise PeersBenchError(f"{name}: the files did not stay in the page cache")
                c0, t0 = os.times(), time.perf_counter()
                got = op()
                t1, c1 = time.perf_counter(), os.times()
                if got < bench.nbytes:
                    raise PeersBenchError(f"{name}: {got:,} bytes of {bench.nbytes:,}")
                if name in (FLAT_HOT, FLAT_COLD):
                    bench.check_flat()
                elif name.startswith("restore"):
                    _check(bench)
                if rnd:
                    cpu = (c1.user - c0.user) + (c1.system - c0.system)
                    rates.gbps.setdefault(name, []).append(got / (t1 - t0) / 1e9)
                    rates.cores.setdefault(name, []).append(cpu / (t1 - t0))
        rates.load = (rates.load[0], os.getloadavg()[0])
        return rates
    finally:
        if b is not None:
            b.close()
        shutil.rmtree(where, ignore_errors=True)


def _nothing() -> None:
    pass


def _check(bench: Bench) -> None:
    """The restored pool holds the parked K/V, bit for bit (outside the clock); the target
    pool is refilled with other bytes for the next restore."""
    got = bench.target.gather(bench.tokens)
    if not np.array_equal(got.view(np.uint16), bench.kv.view(np.uint16)):
        raise PeersBenchError("a restore's pool differs from the parked K/V")
    for layer in bench.target.layers:
        layer.view(np.uint16).fill(1)


def render(rates: Rates) -> str:
    """The table: each operation's median GB/s with its lowest and highest, cores busy, then
    the ratios with their targets."""
    gib = rates.nbytes / 2**30
    lines = [
        f"{gib:.2f} GiB, medians of {rates.rounds} rounds (lowest - highest), 1-minute load "
        f"{rates.load[0]:.2f} at the start, {rates.load[1]:.2f} at the end",
    ]
    for op in OPS:
        v = rates.gbps[op]
        busy = statistics.median(rates.cores[op])
        lines.append(
            f"  {op:<34} {statistics.median(v):6.2f} GB/s  ({min(v):.2f} - {max(v):.2f})"
            f"   cores busy {busy:.2f}"
        )
    for mine, other, target in RATIOS:
        r = rates.ratio(mine, other)
        spread = _ratio_spread(rates, mine, other)
        aim = "" if target is None else f"   target >= {target:.1f}x: "
        if target is not None:
            aim += "met" if r >= target else "missed"
        lines.append(f"  {mine + ' / ' + other:<58} {r:5.2f}x ({spread}){aim}")
    return "\n".join(lines)


def _ratio_spread(rates: Rates, mine: str, other: str) -> str:
    """The lowest and highest of the round-by-round ratios."""
    each = [a / b for a, b in zip(rates.gbps[mine], rates.gbps[other], strict=True)]
    return f"rounds {min(each):.2f} - {max(each):.2f}"


def _read(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)
