"""Power-loss crash states, ALICE-style: record a workload's I/O operations with the directory tree
before each one, then build the states a power cut could leave:

- **prefix**: the tree after operations ``[0, i)``, everything persisted;
- **dropped write**: a file written since its last fsync comes back as it was at that fsync
  (empty when never synced), as a page cache that never reached the disk;
- **torn write**: that file holds only its first 1/8, 2/8, ... or 7/8;
- **dropped directory update**: a directory changed (create, rename, link, unlink) since its
  last fsync comes back with its entries as they were at that fsync;
- **everything unsynced lost**: all of the above at once.

LMDB files are taken as they are (LMDB fsyncs each commit itself, and a snapshot is never taken
inside a transaction). The states are deduplicated by content.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratastore.io.faults import Fault, FaultInjector

Tree = dict[str, bytes]  #: relative path -> bytes


@dataclass
class Recorder(FaultInjector):
    """Snapshots ``root`` before every I/O operation (``check`` is the seam's hook)."""

    root: Path = Path(".")
    trees: list[Tree] = field(default_factory=list)
    ops: list[tuple[str, str]] = field(default_factory=list)
    acks: list[tuple[int, int]] = field(default_factory=list)  #: (conversation, ops before it)
    _cache: dict[str, tuple[tuple[int, int, int], bytes]] = field(default_factory=dict)

    def check(self, op: str, path: str) -> Fault | None:
        self.trees.append(self.snapshot())
        self.ops.append((op, os.path.relpath(path, self.root)))
        return super().check(op, path)

    def ack(self, conv: int) -> None:
        self.acks.append((conv, len(self.ops)))

    def snapshot(self) -> Tree:
        tree: Tree = {}
        for dirpath, _, names in os.walk(self.root):
            for n in names:
                if n == "lock.mdb":  # LMDB's reader table: not state
                    continue
                full = os.path.join(dirpath, n)
                st = os.stat(full)
                sig = (st.st_ino, st.st_size, st.st_mtime_ns)
                hit = self._cache.get(full)
                if hit is None or hit[0] != sig:
                    with open(full, "rb") as f:
                        hit = (sig, f.read())
                    self._cache[full] = hit
                tree[os.path.relpath(full, self.root)] = hit[1]
        return tree


def crash_states(rec: Recorder) -> Iterator[tuple[str, int, Tree]]:
    """(kind, i, tree): every state a power cut before operation ``i`` could leave."""
    trees = [*rec.trees, rec.snapshot()]
    dirty: dict[str, bytes | None] = {}  #: path -> its bytes at the last fsync (None: never)
    dir_synced: dict[str, int] = {}  #: directory -> index of the tree at its last fsync
    pending: set[str] = set()  #: directories changed since their last fsync
    for i, (op, path) in enumerate(rec.ops):
        now, after = trees[i], trees[i + 1]
        yield "prefix", i, now
        for p, synced in dirty.items():
            if p in now:
                yield "dropped write", i, {**now, p: synced or b""}
                for q in range(1, 8):  # 1/8, 2/8, ... 7/8 of it reached the disk
                    yield "torn write", i, {**now, p: now[p][: len(now[p]) * q // 8]}
        for d in pending:
            old = trees[dir_synced.get(d, 0)]
            kept = {p: b for p, b in now.items() if os.path.dirname(p) != d}
            yield (
                "dropped dir update",
                i,
                {**kept, **{p: b for p, b in old.items() if os.path.dirname(p) == d}},
            )
        if pending and dirty:  # all of it at once: every unsynced byte and entry lost
            lost = {p: b for p, b in now.items() if os.path.dirname(p) not in pending}
            for d in pending:
                lost.update(
                    {
                        p: b
                        for p, b in trees[dir_synced.get(d, 0)].items()
                        if os.path.dirname(p) == d
                    }
                )
            for p, synced in dirty.items():
                if p in lost:
                    lost[p] = synced or b""
            yield "everything unsynced lost", i, lost
        d = os.path.dirname(path)
        if op == "open" and path not in now and path in after:
            dirty[path] = None
            pending.add(d)
        elif op == "write" and path not in dirty:
            dirty[path] = now.get(path)
        elif op == "fsync":
            dirty.pop(path, None)
        elif op in ("rename", "link", "unlink"):
            pending.add(d)
            gone = [p for p in now if p not in after and os.path.dirname(p) == d]
            if op == "rename" and gone:  # the renamed file keeps its own sync state
                src = gone[0]
                if src in dirty:
                    dirty[path] = dirty.pop(src)
                else:
                    dirty.pop(path, None)
            if op == "unlink":
                dirty.pop(path, None)
        elif op == "fsync_dir":
            pending.discard(path)
            dir_synced[path] = i + 1
        elif op == "mkdir":
            dir_synced.setdefault(path, i + 1)
    yield "prefix", len(rec.ops), trees[-1]


def digest(tree: Tree) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(tree):
        h.update(p.encode() + b"\0" + hashlib.blake2b(tree[p], digest_size=16).digest())
    return h.digest()


def materialize(tree: Tree, root: Path) -> None:
    for p, data in tree.items():
        full = root / p
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
