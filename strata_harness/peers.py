"""``strata bench --peers``: stratastore beside the stores engines use, on the same bytes, by one
protocol.

- **The same K/V for every engine**: ``mib`` MiB (1 GiB by default: 8,192 tokens) of the
  Llama-3.1-8B geometry (32 layers x 8 kv heads x 128 x fp16, 128 KiB a token), deterministic
  random bytes, in the engine layout ``[layers, 2, tokens, heads, head_dim]``.
- **Durable write**: from that layout in memory to durable on disk, each engine's files and
  directory fsynced. stratastore goes through its engine-facing API only: ``Store.open`` with
  ``park="disk"`` and ``ram_mib=0``, ``pack_pages`` + ``park`` + ``flush()`` (also reported
  without ``pack_pages``).
- **Reads** return a fresh, fully materialised array in the engine layout (a peer that loads
  another layout converts, on the clock): ``np.load``, safetensors' ``load_file``,
  ``torch.load``, LMCache's ``retrieve`` into ``torch.empty``, and ``Store.restore`` into a
  :class:`~stratastore.restore.LayerKV` over ``np.empty``. The row "stratastore (flat page
  layout)" restores into a fresh flat buffer in the stored page layout instead. **50% prefix**:
  the first half of the tokens into a fresh ``[layers, 2, tokens / 2, heads, head_dim]``
  (``np.load(mmap_mode="r")``, ``safe_open`` + ``get_slice``, ``torch.load(mmap=True)``, the
  first half's LMCache chunks, a restore of the first half of the prompt). GB/s counts the bytes
  delivered (GB = 1e9 B).
- **Bit for bit**: every result is compared with the bytes written, outside the clock; a
  difference raises :class:`PeersBenchError`.
- **Hot** reads follow a read of the data files; **cold** ones follow their eviction (fsync +
  ``POSIX_FADV_DONTNEED`` per data file; for stratastore every file under its store directory),
  verified with ``mincore``: more than 1% of the pages still resident raises; the largest
  fraction seen is in the result.
- **A fresh process per operation** (``python -m strata_harness.peer_engines``, spawned, not
  forked), which reports its seconds and peak RSS (``VmHWM``): it counts the interpreter and
  imports, the same for every engine; the clock excludes the start, the imports, loading the
  source and opening a store. LMCache keeps its index in the process that stored, so its store
  and reads share one process a round, its RSS high-water mark reset before each read
  (:mod:`strata_harness.peer_lmcache`). The table's peak RSS is the largest of a row's writes and
  of its reads.
- **Medians** of ``rounds`` after one warmup round; rounds alternate the engine order; the
  1-minute load average at the start and the end is in the result.

Also measured, the limits of this machine: one file written and fsynced; read into a fresh
buffer and into a touched one, hot and cold; numpy's copy into a touched buffer. safetensors,
torch and LMCache are used where installed (imported only in their processes), and skipped with
a note otherwise. The result (:func:`run_peers`) holds every figure, the ratios to the peer
targets and the checks made; :func:`render_peers` prints it as the peers table. Here the
driver; the operations are in :mod:`strata_harness.peer_engines`, the shared checks in
:mod:`strata_harness.peer_protocol`, the table and ratios in :mod:`strata_harness.peer_report`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from strata_harness.peer_protocol import (
    GEOMETRY,
    LAYERS,
    TOKEN_BYTES,
    PeersBenchError,
    Record,
    data_files,
    evict,
    fingerprint,
    shape,
    warm,
)
from strata_harness.peer_report import FLAT, LAYER, PAGED, render, summarise

__all__ = ["PeersBenchError", "Run", "lmcache_engine", "render_peers", "run_peers", "write_source"]

MAX_RESIDENT = 0.01  #: a cold read with more of its data files' pages resident is refused
TIMEOUT_S = 1800
FILE_PEERS = {  # engine: (row, file)
    "numpy": ("numpy np.save / np.load (+ fsync)", "kv.npy"),
    "safetensors": ("safetensors (+ fsync)", "kv.safetensors"),
    "torch": ("torch.save / torch.load (+ fsync)", "kv.pt"),
}


class Run:
    """One run: its directory, its processes, its samples and checks."""

    def __init__(self, root: str, tokens: int, cold: bool) -> None:
        self.root, self.tokens, self.half, self.cold = root, tokens, tokens // 2, cold
        self.measuring = False  #: False in the warmup round
        self.samples: dict[tuple[str, str], list[Record]] = {}
        #: the engine-pool protocol's samples (:mod:`strata_harness.peer_pool`)
        self.pool_samples: dict[tuple[str, str], list[Record]] = {}
        self.cold_resident: dict[str, float] = {}  #: row: the most pages left by an eviction
        self.hot_resident: list[float] = []
        self.evictions = 0
        self.compared = [0, 0]  #: results, bytes
        self.skipped: dict[str, str] = {}
        self.peak_reset = True
        self.package = os.path.dirname(os.path.abspath(__file__))
        pkg_parent = os.path.dirname(self.package)
        path = os.pathsep.join(p for p in (pkg_parent, os.environ.get("PYTHONPATH")) if p)
        self.env = dict(
            os.environ,
            PYTHONPATH=path,
            PYTHONHASHSEED="0",
            LMCACHE_TRACK_USAGE="false",
            LMCACHE_LOG_LEVEL="WARNING",
        )

    def file(self, name: str) -> str:
        return os.path.join(self.root, name)

    def spawn(self, op: str, **job: Any) -> Record:
        """Run ``op`` in a fresh interpreter (in the work directory, so that it imports the
        stratastore this process imported); its record."""
        job = {
            "op": op,
            "source": self.file("source.bin"),
            "packed": self.file("packed.bin"),
            "tokens": self.tokens,
            "result": self.file("result.json"),
            **job,
        }
        with open(self.file("job.json"), "w") as f:
            json.dump(job, f)
        if os.path.exists(job["result"]):
            os.unlink(job["result"])
        cmd = [sys.executable, "-m", "strata_harness.peer_engines", self.file("job.json")]
        try:
            proc = subprocess.run(
                cmd, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise PeersBenchError(f"{op} ran over {TIMEOUT_S} s") from None
        if not os.path.exists(job["result"]):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise PeersBenchError(f"{op} failed (exit {proc.returncode}):\n{tail}")
        with open(job["result"]) as f:
            out: Record = json.load(f)
        if "error" in out:
            raise PeersBenchError(str(out["error"]))
        if out["package"] != self.package:
            raise PeersBenchError(
                f"{op} ran the stratastore in {out['package']}, not this one "
                f"({self.package}); check PYTHONPATH"
            )
        return out

    def add(self, row: str, op: str, rec: Record, *, pool: bool = False) -> None:
        if rec.get("compared"):
            self.compared[0] += 1
            self.compared[1] += rec["compared"]
        if self.measuring:
            (self.pool_samples if pool else self.samples).setdefault((row, op), []).append(rec)

    def evicted(self, frac: float, what: str) -> None:
        self.evictions += 1
        self.cold_resident[what] = max(frac, self.cold_resident.get(what, 0.0))
        if frac > MAX_RESIDENT:
            raise PeersBenchError(
                f"{what}: {frac:.1%} of the data files' pages stayed in the "
                "page cache after fsync + POSIX_FADV_DONTNEED; a cold read "
                "would not be cold (a process mapping them?)"
            )

    def evict(self, paths: list[str], what: str) -> None:
        self.evicted(evict(data_files(paths)), what)

    def warm(self, paths: list[str]) -> None:
        self.hot_resident.append(warm(data_files(paths)))


def _raw(run: Run) -> None:
    path = run.file("raw.bin")
    if os.path.exists(path):
        os.unlink(path)
    run.add("raw", "write+fsync", run.spawn("raw.write", path=path))
    reads = [(f"read {'touched' if t else 'fresh'}", t) for t in (False, True)]
    run.warm([path])
    for op, touched in reads:
        run.add("raw", f"{op} hot", run.spawn("raw.read", path=path, touched=touched))
    run.add("raw", "memcpy touched", run.spawn("raw.memcpy"))
    run.add("raw", "blake3 both", run.spawn("raw.blake3"))
    run.warm([path])
    run.add("raw", "read blake3 both hot", run.spawn("raw.read_blake3", path=path))
    for op, touched in reads if run.cold else []:
        run.evict([path], "raw")
        run.add("raw", f"{op} cold", run.spawn("raw.read", path=path, touched=touched))


def _file_peer(name: str, *, pool: bool = False) -> Callable[[Run], None]:
    """A file format's write and reads; ``pool``: by the engine-pool protocol."""
    row, fname = FILE_PEERS[name]
    ops = ("pool_write", "pool_read", "pool_prefix") if pool else ("write", "read", "prefix")

    def go(run: Run) -> None:
        path = run.file(f"pool-{fname}" if pool else fname)
        if os.path.exists(path):
            os.unlink(path)
        run.add(row, "durable write", run.spawn(f"{name}.{ops[0]}", path=path), pool=pool)
        run.warm([path])
        for heat in ("hot", "cold") if run.cold else ("hot",):
            for op, name_op, t in (("read", ops[1], run.tokens), ("prefix", ops[2], run.half)):
                if heat == "cold":
                    run.evict([path], row)
                rec = run.spawn(f"{name}.{name_op}", path=path, t=t)
                run.add(row, f"{op} {heat}", rec, pool=pool)

    return go


def _stratastore(run: Run) -> None:
    store = run.file("store")
    shutil.rmtree(store, ignore_errors=True)
    run.add(LAYER, "durable write", run.spawn("stratastore.park", path=store))
    run.warm([store])
    for heat in ("hot", "cold") if run.cold else ("hot",):
        for row, flat in ((LAYER, False), (FLAT, True)):
            for op, t in (("read", run.tokens), ("prefix", run.half)):
                if heat == "cold":
                    run.evict([store], row)
                rec = run.spawn("stratastore.restore", path=store, t=t, flat=flat)
                run.add(row, f"{op} {heat}", rec)


def _stratastore_pool(run: Run) -> None:
    """The engine-pool protocol: park from the pool, restore into it (``PagedKV``)."""
    store = run.file("store-pool")
    shutil.rmtree(store, ignore_errors=True)
    run.add(PAGED, "durable write", run.spawn("stratastore.pool_park", path=store), pool=True)
    run.warm([store])
    for heat in ("hot", "cold") if run.cold else ("hot",):
        for op, t in (("read", run.tokens), ("prefix", run.half)):
            if heat == "cold":
                run.evict([store], PAGED)
            rec = run.spawn("stratastore.pool_restore", path=store, t=t)
            run.add(PAGED, f"{op} {heat}", rec, pool=True)


def lmcache_engine(backend: str, row: str, *, pool: bool = False) -> Callable[[Run], None]:
    """One LMCache session a round (:func:`strata_harness.peer_lmcache.session`, or with
    ``pool`` :func:`~strata_harness.peer_lmcache.pool_session`: ``disk``, ``ram`` or
    ``strata``, the stratastore plugin), its records added to ``row``; a backend that cannot
    run here is noted in ``run.skipped``."""

    def go(run: Run) -> None:
        path = run.file(f"lmcache-{backend}")
        shutil.rmtree(path, ignore_errors=True)
        chunk = 256  # LMCache's default; the prefix must be whole chunks
        while run.half % chunk:
            chunk //= 2
        op = "lmcache.pool_session" if pool else "lmcache.session"
        out = run.spawn(op, path=path, backend=backend, half=run.half, chunk=chunk, cold=run.cold)
        shutil.rmtree(path, ignore_errors=True)
        if "unavailable" in out:
            run.skipped[_name("lmcache-" + backend, pool)] = (
                f"LMCache cannot run here: {out['unavailable']}"
            )
            return
        for frac in out["cold_resident"]:
            run.evicted(frac, row)
        run.hot_resident.append(out["hot_resident"])
        run.peak_reset = run.peak_reset and out["peak_reset"]
        for op, rec in out["records"].items():
            run.add(row, op, rec, pool=pool)

    return go


def _name(engine: str, pool: bool) -> str:
    """An engine's name in the rounds (its engine-pool protocol's: ``-pool`` after it)."""
    return f"{engine}-pool" if pool else engine


def write_source(run: Run, *, packed: bool = True) -> None:
    """The K/V in the engine layout (``source.bin``) and, with ``packed``, in the stored page
    layout (``packed.bin``, what the flat restore is compared with)."""
    from stratastore.restore import pack_pages

    rng = np.random.default_rng(0)
    with open(run.file("source.bin"), "wb") as f:
        for _ in range(LAYERS):
            rng.integers(0, 256, run.tokens * TOKEN_BYTES // LAYERS, np.uint8).tofile(f)
    if not packed:
        return
    kv = np.memmap(run.file("source.bin"), np.float16, "r", shape=shape(run.tokens))
    flat = pack_pages(
        fingerprint(),
        [kv[x, 0] for x in range(LAYERS)],
        [kv[x, 1] for x in range(LAYERS)],
        run.tokens,
    )
    flat.tofile(run.file("packed.bin"))


def _engines(notes: list[str]) -> list[tuple[str, Callable[[Run], None]]]:
    have = {m: importlib.util.find_spec(m) is not None for m in ("safetensors", "torch", "lmcache")}
    out: list[tuple[str, Callable[[Run], None]]] = [
        ("raw", _raw),
        ("numpy", _file_peer("numpy")),
        ("stratastore", _stratastore),
        (_name("numpy", True), _file_peer("numpy", pool=True)),
        (_name("stratastore", True), _stratastore_pool),
    ]
    for name in ("safetensors", "torch"):
        if have[name]:
            out.append((name, _file_peer(name)))
            out.append((_name(name, True), _file_peer(name, pool=True)))
        else:
            notes.append(f"{name} is not installed: skipped")
    if have["lmcache"] and have["torch"]:
        version = importlib.metadata.version("lmcache")
        for pool in (False, True):
            disk = f"LMCache {version}, local disk backend (+ fsync)"
            ram = f"LMCache {version}, RAM backend"
            out.append((_name("lmcache-disk", pool), lmcache_engine("disk", disk, pool=pool)))
            out.append((_name("lmcache-ram", pool), lmcache_engine("ram", ram, pool=pool)))
    else:
        notes.append("lmcache (with torch) is not installed: LMCache skipped")
    return out


def run_peers(
    work_dir: str | None = None, *, mib: int = 1024, rounds: int = 3, cold: bool = True
) -> dict[str, Any]:
    """Run the protocol of the module docstring in a new directory under ``work_dir`` (default:
    the system's temporary directory), removed afterwards; the result document."""
    if mib < 1 or rounds < 1:
        raise PeersBenchError(f"--mib ({mib}) and --rounds ({rounds}) must be at least 1")
    tokens = max(32, mib * 2**20 // TOKEN_BYTES // 32 * 32)  # the half is whole pages
    if work_dir is not None and not os.path.isdir(work_dir):
        raise PeersBenchError(f"--dir {work_dir} is not a directory; create it or name another")
    free = shutil.disk_usage(work_dir or tempfile.gettempdir()).free
    if free < 14 * tokens * TOKEN_BYTES:
        raise PeersBenchError(
            f"{work_dir or tempfile.gettempdir()} has {free / 2**30:.1f} GiB "
            f"free; the run writes about {14 * tokens * TOKEN_BYTES / 2**30:.1f}"
            " GiB: name a --dir with room, or a smaller --mib"
        )
    notes: list[str] = []
    engines = _engines(notes)
    load_start = os.getloadavg()[0]
    root = tempfile.mkdtemp(prefix="strata-peers-", dir=work_dir)
    run = Run(root, tokens, cold)
    try:
        write_source(run)
        for rnd in range(rounds + 1):  # round 0 warms up and is dropped
            run.measuring = rnd > 0
            for name, go in engines if rnd % 2 else engines[::-1]:
                if name not in run.skipped:
                    go(run)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    notes += run.skipped.values()
    if not run.peak_reset:
        notes.append(
            "LMCache: the kernel refused to reset the RSS high-water mark, so its "
            "reads' peak RSS includes the store's"
        )
    return summarise(
        run.samples,
        run.pool_samples,
        {
            "stratastore": run.package,
            "bytes": tokens * TOKEN_BYTES,
            "tokens": tokens,
            "prefix_tokens": run.half,
            "geometry": GEOMETRY,
            "rounds": rounds,
            "warmup_rounds": 1,
            "cold": cold,
            "load_1m": {"start": load_start, "end": os.getloadavg()[0]},
            "page_cache": {
                "method": "fsync + posix_fadvise(DONTNEED), checked with mincore",
                "evictions": run.evictions,
                "max_resident_after_eviction": max(run.cold_resident.values(), default=0.0),
                "max_resident_after_eviction_by_row": run.cold_resident,
                "min_resident_before_hot": min(run.hot_resident, default=1.0),
            },
            "bit_for_bit": {
                "results_compared": run.compared[0],
                "bytes_compared": run.compared[1],
                "all_equal": True,
            },
            "notes": notes,
        },
    )


def render_peers(doc: dict[str, Any]) -> str:
    """The result as text: the peers table, the limits, the targets, the notes."""
    return render(doc)
