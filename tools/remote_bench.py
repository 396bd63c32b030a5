"""The shared remote level's figures, each next to its baseline in the same run.

Run ``.venv/bin/python tools/remote_bench.py [MiB] [--runs N]`` (default 1024 MiB, 5 runs). It
starts its own servers with tests/redis_servers.py, in a temporary directory, on loopback: one
standalone ``redis-server`` and one 3-master cluster (no replicas), ``maxmemory`` unset,
persistence off; they are stopped at the end, whatever happens.

One conversation of ``MiB`` (Llama-3.1-8B geometry: 32 layers x 8 kv heads x 128 dims fp16,
128 KiB a token, 2 MiB pages of 16 tokens; random bytes) cut into 8 segments is parked through a
real :class:`~stratastore.Store` (RAM level off, a local cold level, the remote level with
``remote_keep_local=False``) and flushed, so that the store's cold level and the remote level
both hold it. Then, for each server, on the same bytes, every run of every row checked (source,
tokens and every byte):

* **restore from the remote level**: a second Store (its own empty local level, the same remote
  level) restores the prompt into a preallocated buffer: the chain walked through the remote
  level's index, every page read from Redis and BLAKE3-validated before it is delivered
  (``remote_keep_local=False``: every run reads Redis);
* **plain MGET**, the baseline: redis-py reads the same parts (the backend's own part keys)
  unvalidated and copies them into the same buffer, two ways: one ``MGET`` per segment (its
  parts), and all the parts in one call (standalone: one ``MGET``; cluster:
  ``mget_nonatomic``, one ``MGET`` per hash slot in one cluster pipeline; a segment's parts
  share a slot). The ratio is against the faster of the two;
* **restore from the local cold level**: the first Store restores the same prompt from its disk
  level (warm page cache: its files were just written and read, nothing is dropped);
* **unvalidated reads through the backend** (a diagnostic): the remote level's reads alone, on
  the same thread pool and 4 MiB groups as the restore, without hashing (``read_plain``);
* **park to the remote level**: ``RedisBackend.put_kv`` of the same 8 segments (pages hashed,
  parts written, one commit script and the index each) into an empty namespace, a new one each
  run, against a plain pipeline ``SET`` of the same bytes in the same part sizes (one pipeline
  per segment, its parts under one hash tag).

Each figure is the median of ``--runs`` runs after a warmup round, the rows interleaved (the order
reversed every other round); GB = 1e9 B. Target: restore from Redis >= 0.8x the plain
MGET while validating every page. A tiny run (``8``) is the test's (tests/unit/
test_remote_bench.py); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stratastore import Checkpoint, Conversation, Store, StoreConfig  # noqa: E402
from stratastore.chain import as_tokens  # noqa: E402
from stratastore.format import ModelFingerprint  # noqa: E402
from stratastore.format.keys import SegmentKey  # noqa: E402
from stratastore.levels.redis.backend import RedisBackend  # noqa: E402
from stratastore.levels.redis.settings import RemoteSettings  # noqa: E402
from stratastore.restore.reads import read_plain  # noqa: E402
from tests.redis_servers import RedisCluster, RedisServer, find_redis  # noqa: E402

MIB = 1 << 20
SEGMENTS = 8
NAME = "bench"  #: the parked conversation's namespace (remote_name)
TARGET = 0.8  #: restore from Redis / plain MGET

ROW_RESTORE = "restore from the remote level (validated)"
ROW_MGET_SEG = "plain MGET, one per segment"
ROW_MGET_ALL = "plain MGET, all parts in one call"
ROW_LOCAL = "restore from the local cold level (validated)"
ROW_PLAIN_READ = "unvalidated reads through the backend"
ROW_PARK = "park to the remote level (put_kv)"
ROW_SET = "plain pipeline SET"
ROWS = (ROW_RESTORE, ROW_MGET_SEG, ROW_MGET_ALL, ROW_LOCAL, ROW_PLAIN_READ, ROW_PARK, ROW_SET)


def engine_fp() -> ModelFingerprint:
    """Llama-3.1-8B's K/V geometry: 128 KiB a token, pages of 16 tokens (2 MiB)."""
    return ModelFingerprint.create(
        "bench/8b", n_layers=32, n_kv_heads=8, head_dim=128, page_tokens=16
    )


@dataclass
class Section:
    """The figures of one server: median seconds per row, and what the rows were checked for."""

    kind: str  #: "standalone" or "cluster"
    url: str
    best: dict[str, float] = field(default_factory=dict)  #: median seconds per row
    lookup_s: float = 0.0  #: the remote level's chain walk alone (part of every restore)


@dataclass
class Image:
    """The conversation benchmarked: its prompt, its K/V (the page layout) and its segments."""

    fp: ModelFingerprint
    prompt: npt.NDArray[np.uint32]
    kv: npt.NDArray[np.uint8]
    cuts: list[int]

    def conversation(self) -> Conversation:
        """A fresh Conversation (a Store may trim the one it is given)."""
        return Conversation(
            "bench", self.prompt.copy(), [Checkpoint(len(self.prompt))], cuts=list(self.cuts)
        )

    def segments(self) -> list[SegmentKey]:
        return self.conversation().segment_keys(self.fp.digest())

    @property
    def nbytes(self) -> int:
        return int(self.kv.size)


def make_image(mib: int, fp: ModelFingerprint) -> Image:
    """``mib`` MiB of random K/V (whole tokens, a multiple of the segment count) in 8 segments."""
    tokens = max(SEGMENTS, mib * MIB // fp.token_bytes // SEGMENTS * SEGMENTS)
    per = tokens // SEGMENTS
    kv = np.random.default_rng(17).integers(0, 256, tokens * fp.token_bytes, dtype=np.uint8)
    return Image(fp, as_tokens(np.arange(tokens)), kv, list(range(0, tokens, per)))


def store_config(url: str, local: str, mib: int, keep_local: bool = False) -> StoreConfig:
    """RAM level off, one local cold level, the remote level at ``url`` (budgets with room)."""
    return StoreConfig(
        ram_mib=0,
        cold_dir=local,
        cold_mib=2 * mib + 64,
        remote_url=url,
        remote_mib=2 * mib + 64,
        remote_name=NAME,
        remote_keep_local=keep_local,
    )


def part_names(be: RedisBackend, segs: list[SegmentKey]) -> list[list[str]]:
    """The Redis keys of each segment's parts, in order (read from its commit record)."""
    out = []
    for s in segs:
        c = be._need(s.key)
        out.append([be._part(s.key, c.nonce, i) for i in range(c.parts)])
    return out


def run_rounds(
    ops: list[tuple[str, Callable[[], None], Callable[[], None]]], runs: int
) -> dict[str, float]:
    """Median seconds of each ``(row, op, after)`` over ``runs`` rounds after a warmup round,
    the rows interleaved (the order reversed every other round); ``after`` (untimed) checks what
    the op did and cleans up after it."""
    times: dict[str, list[float]] = {}
    for rnd in range(runs + 1):
        order = ops if rnd % 2 else list(reversed(ops))
        for row, op, after in order:
            t = time.perf_counter()
            op()
            dt = time.perf_counter() - t
            after()
            if rnd:
                times.setdefault(row, []).append(dt)
    return {row: statistics.median(ts) for row, ts in times.items()}


def bench_server(
    kind: str, url: str, img: Image, tmp: Path, mib: int, runs: int, out: npt.NDArray[np.uint8]
) -> Section:
    """Every row of one server (see the module)."""
    fp, n, tb = img.fp, len(img.prompt), img.fp.token_bytes
    sec = Section(kind, url)
    segs = img.segments()
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(Store.open(fp, store_config(url, str(tmp / f"{kind}-a"), mib)))
        report = first.park(img.conversation(), img.kv.copy())
        first.flush()
        assert report.where == "disk" and report.tokens == n, report
        second = stack.enter_context(Store.open(fp, store_config(url, str(tmp / f"{kind}-b"), mib)))
        be = RedisBackend.open(RemoteSettings(url, name=NAME), fp)
        stack.callback(be.close)
        assert all(s.key in be for s in segs), f"{kind}: the remote level lacks a segment"
        parts = part_names(be, segs)
        flat = [p for ps in parts for p in ps]
        client = be._r
        mget_all = client.mget_nonatomic if kind == "cluster" else client.mget

        def check(source: str | None = None, got: list[Any] | None = None) -> Callable[[], None]:
            def after() -> None:
                if source is not None and got is not None:
                    assert got[0].source == source and got[0].tokens == n, got[0]
                assert np.array_equal(out, img.kv), f"{kind}: the bytes differ"
                out.fill(0)  # the next op starts from a buffer that holds none of them

            return after

        restored: list[Any] = [None]

        def restore_remote() -> None:
            restored[0] = second.restore(img.prompt, out)

        def restore_local() -> None:
            restored[0] = first.restore(img.prompt, out)

        def copy_in(values: list[bytes | None], at: int) -> int:
            for v in values:
                assert v is not None
                out[at : at + len(v)] = np.frombuffer(v, np.uint8)
                at += len(v)
            return at

        def mget_per_segment() -> None:
            at = 0
            for ps in parts:
                at = copy_in(client.mget(ps), at)

        def mget_in_one() -> None:
            copy_in(mget_all(flat), 0)

        def plain_reads() -> None:
            for s in segs:
                with be.open_reader(s.key) as seg:
                    a, b = s.start * tb, s.end * tb
                    read_plain(seg, out[a:b], 0, seg.sidecar.page_bytes)

        park_runs = [0]
        park_be: list[RedisBackend | None] = [None]

        def park() -> None:
            park_runs[0] += 1
            settings = RemoteSettings(url, name=f"park-{kind}-{park_runs[0]}")
            pb = RedisBackend.open(settings, fp)
            park_be[0] = pb
            for s in segs:
                pb.put_kv(
                    s.parent,
                    img.prompt[s.start : s.end],
                    img.kv[s.start * tb : s.end * tb],
                    token_start=s.start,
                )

        def park_after() -> None:
            pb = park_be[0]
            assert pb is not None
            try:
                assert sorted(pb.keys()) == sorted(s.key for s in segs), f"{kind}: park lost one"
                assert pb.used() > img.nbytes
                for s in segs:  # read back, every page validated against the parked digests
                    pb.get_into(s.key, out[s.start * tb : s.end * tb])
                check()()
                for s in segs:
                    pb.delete(s.key)
                pb._r.delete(pb._used)
            finally:
                pb.close()

        pb_bytes = be.part_bytes
        n_parts = [-(-(s.end - s.start) * tb // pb_bytes) for s in segs]
        set_keys = [
            [f"plain-set/{{{s.key.hex()}}}/{i}" for i in range(k)]
            for s, k in zip(segs, n_parts, strict=True)
        ]

        def pipeline_set() -> None:
            for s, keys in zip(segs, set_keys, strict=True):
                view = memoryview(img.kv[s.start * tb : s.end * tb])
                p = client.pipeline(transaction=False)
                for i, k in enumerate(keys):
                    p.set(k, view[i * pb_bytes : (i + 1) * pb_bytes])
                assert all(p.execute())

        def set_after() -> None:
            for s, keys in zip(segs, set_keys, strict=True):
                a, b = s.start * tb, min(s.end * tb, s.start * tb + pb_bytes)
                assert client.get(keys[0]) == img.kv[a:b].tobytes(), f"{kind}: SET lost one"
            for keys in set_keys:
                assert client.delete(*keys) == len(keys)

        out.fill(0)
        sec.best = run_rounds(
            [
                (ROW_RESTORE, restore_remote, check("remote", restored)),
                (ROW_MGET_SEG, mget_per_segment, check()),
                (ROW_MGET_ALL, mget_in_one, check()),
                (ROW_LOCAL, restore_local, check("disk", restored)),
                (ROW_PLAIN_READ, plain_reads, check()),
                (ROW_PARK, park, park_after),
                (ROW_SET, pipeline_set, set_after),
            ],
            runs,
        )
        looks = []
        for _ in range(max(3, runs)):
            t = time.perf_counter()
            assert second.lookup(img.prompt) == ("remote", n)
            looks.append(time.perf_counter() - t)
        sec.lookup_s = statistics.median(looks)
    return sec


def gbs(nbytes: int, s: float) -> str:
    return f"{nbytes / s / 1e9:6.2f}"


def table(
    img: Image, sections: list[Section], runs: int, command: str, load: tuple[float, float, float]
) -> str:
    """The printed report: one markdown table, the notes under it."""
    import redis
    import redis.utils

    fp, n = img.fp, len(img.prompt)
    per = n // SEGMENTS
    lines = [
        f"remote level benchmark: {img.nbytes / MIB:,.0f} MiB conversation ({n:,} tokens x "
        f"{_size(fp.token_bytes)}, {SEGMENTS} segments of {_size(per * fp.token_bytes)}, "
        f"{_size(RemoteSettings('redis://x').part_bytes)} parts, "
        f"{_size(fp.page_tokens * fp.token_bytes)} pages); medians of {runs} runs after a "
        "warmup, rows interleaved; GB = 1e9 B; loopback",
        f"command: {command}",
        "",
        "| server | operation | GB/s | vs its baseline |",
        "|---|---|---|---|",
    ]
    status = []
    for sec in sections:
        b, nb = sec.best, img.nbytes
        mget = min(b[ROW_MGET_SEG], b[ROW_MGET_ALL])
        ratio = mget / b[ROW_RESTORE]
        status.append((sec.kind, ratio))
        rows = [
            (
                ROW_RESTORE,
                f"{ratio:.2f}x plain MGET (target >= {TARGET}x); "
                f"{b[ROW_LOCAL] / b[ROW_RESTORE]:.2f}x the local cold level",
            ),
            (ROW_MGET_SEG, "baseline"),
            (ROW_MGET_ALL, "baseline"),
            (ROW_LOCAL, "warm page cache"),
            (ROW_PLAIN_READ, f"diagnostic: {mget / b[ROW_PLAIN_READ]:.2f}x plain MGET"),
            (ROW_PARK, f"{b[ROW_SET] / b[ROW_PARK]:.2f}x plain pipeline SET"),
            (ROW_SET, "baseline"),
        ]
        for row, note in rows:
            lines.append(f"| {sec.kind} | {row} | {gbs(nb, b[row]).strip()} | {note} |")
    lines += [
        "",
        "- page cache: warm for the local cold level (its files were just written by the park "
        "and read by the warmup round; nothing dropped). Redis holds everything in memory.",
        "- the remote restore includes its chain walk through the remote level's index ("
        + ", ".join(f"{s.kind} {s.lookup_s * 1e3:.1f} ms" for s in sections)
        + ") and one round trip for each segment's commit record (STRLEN and a bounded GETRANGE); "
        "every page is BLAKE3-validated before "
        "it is delivered. MGET, SET and the unvalidated reads validate nothing.",
        "- plain MGET copies each value redis-py returns into the same preallocated buffer; "
        "cluster, all parts: mget_nonatomic (one MGET per hash slot, one cluster pipeline).",
        f"- redis-py {redis.__version__} (parser: "
        f"{'hiredis' if redis.utils.HIREDIS_AVAILABLE else 'pure Python, no hiredis'}), "
        f"{_server_version()}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
        f"1-minute load {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
    ]
    for kind, ratio in status:
        verdict = "meets" if ratio >= TARGET else "MISSES"
        lines.append(
            f"- {kind}: restore from Redis / plain MGET = {ratio:.2f}x: {verdict} "
            f"the target (>= {TARGET}x)"
        )
    return "\n".join(lines)


def _size(n: int) -> str:
    """``n`` bytes in MiB, else KiB, else bytes (whole units)."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift:,} {unit}"
    return f"{n:,} B"


def _server_version() -> str:
    import subprocess

    found = find_redis()
    if found is None:
        return "redis-server ?"
    got = subprocess.run(
        [found[0], "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    words = [w for w in got.stdout.split() if w.startswith("v=")]
    return f"redis-server {words[0][2:] if words else '?'}"


def _command() -> str:
    """The command line this run was started with, paths relative to the checkout."""

    def short(p: str) -> str:
        with contextlib.suppress(ValueError):
            return os.path.relpath(os.path.abspath(p), ROOT) if Path(p).exists() else p
        return p

    return shlex.join([short(sys.executable), short(sys.argv[0]), *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("mib", nargs="?", type=int, default=1024, help="conversation size, MiB")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each row (median kept)")
    args = ap.parse_args(argv)
    if args.mib < 1 or args.runs < 1:
        ap.error("MiB and --runs must be at least 1")
    binaries = find_redis()
    if binaries is None:
        print(
            "redis-server/redis-cli not found: apt-get install redis-server "
            "(or tools/ensure_redis.sh)",
            file=sys.stderr,
        )
        return 2
    load = os.getloadavg()
    img = make_image(args.mib, engine_fp())
    out = np.ones(img.nbytes, np.uint8)  # touched once: an engine's own buffer
    sections = []
    with tempfile.TemporaryDirectory(prefix="strata-remote-bench-") as d:
        tmp = Path(d)
        with contextlib.ExitStack() as servers:  # stopped whatever happens
            single = servers.enter_context(RedisServer(tmp / "standalone", binaries=binaries))
            cluster = servers.enter_context(RedisCluster(tmp / "cluster", binaries=binaries))
            for kind, url in (("standalone", single.url), ("cluster", cluster.url)):
                sections.append(bench_server(kind, url, img, tmp, args.mib, args.runs, out))
    print(table(img, sections, args.runs, _command(), load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
