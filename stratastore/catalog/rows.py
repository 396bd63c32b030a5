"""The rows of the shared catalog's tables (spec F-CAT) and the row operations every decision
of :class:`~stratastore.catalog.tables.Catalog` is made of, each inside the caller's
transaction. Like the segment index the catalog is derived state (rebuilt from the manifests).

Tables (named databases; integers big-endian so that keys sort by them)::

    cat.convs    C -> flags (1) + sealed_at_ns (8) + the file's stamp (24: inode, size, mtime)
                 + the manifest's bytes, where C is the
                 conversation's key: BLAKE3 of its id (32 bytes, the digest of its file name)
    cat.members  segment key (32) + owner -> b"": owner is a C, or the ticket of a park in
                 flight (21 bytes: 0xFF + pid + the process's start time + nonce): real
                 reference counts (F-CAT-3); a key no row names is no manifest's
    cat.ages     sealed_at_ns (8) + C -> conv id: the conversations GC may shorten, oldest
                 first (never a session, never one already cut to its pinned prefix)
    cat.pending  ticket -> C + the keys it registered: parks and session saves in flight
    cat.doomed   b"k" + key | b"c" + C -> ticket: removals in flight (files not yet gone)
    cat.log      generation (8) -> conv id: what changed, for the other processes
    cat.meta     b"schema", b"gen"
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from stratastore.catalog.chains import conv_id_key, evictable, manifest_keys
from stratastore.format.manifest import ChainManifest, decode_manifest
from stratastore.levels.backend import TableEnvironment

__all__ = [
    "F_SESSION",
    "GEN_KEY",
    "HEAD",
    "KEY",
    "LOG_KEEP",
    "SCHEMA",
    "SCHEMA_KEY",
    "TICKET",
    "U64",
    "CatalogRows",
    "pending_conv",
    "pending_row",
]

SCHEMA = 1
SCHEMA_KEY, GEN_KEY = b"schema", b"gen"
U64 = struct.Struct(">Q")
TICKET = struct.Struct(">BIQQ")  #: 0xFF, pid, the process's start time, nonce
assert TICKET.size == 21
HEAD = struct.Struct(">BQ24s")  #: flags, sealed_at_ns, the file's stamp (io.files.stamp)
assert HEAD.size == 33
F_SESSION = 1
KEY = 32
LOG_KEEP = 1 << 16  #: change-log entries kept; a process further behind reloads everything


def pending_row(cid: bytes, keys: set[bytes]) -> bytes:
    """A ``cat.pending`` value: the conversation C, then the keys the park registered."""
    return cid + b"".join(sorted(keys))


def pending_conv(row: bytes) -> bytes:
    """The conversation C of a ``cat.pending`` value."""
    return bytes(row[:KEY])


class CatalogRows:
    """The seven tables in ``index``'s environment (the last level's, F-CAT-1) and the row
    operations on them; every method that takes ``txn`` runs inside the caller's transaction."""

    def __init__(self, index: TableEnvironment) -> None:
        self.index = index
        env = index.env
        self._convs = env.open_db(b"cat.convs")
        self._members = env.open_db(b"cat.members")
        self._ages = env.open_db(b"cat.ages")
        self._pending = env.open_db(b"cat.pending")
        self._doomed = env.open_db(b"cat.doomed")
        self._log = env.open_db(b"cat.log")
        self._meta = env.open_db(b"cat.meta")

    # -- transactions -------------------------------------------------------------------------
    def _write(self, fn: Callable[[Any], Any]) -> Any:
        return self.index.write_txn(fn)

    def _read(self, fn: Callable[[Any], Any]) -> Any:
        with self.index.read_txn() as txn:
            return fn(txn)

    def _decode(self, conv_id: str, raw: bytes) -> ChainManifest:
        return decode_manifest(bytes(raw[HEAD.size :]), f"catalog entry {conv_id!r}")

    def _owners(self, txn: Any, key: bytes) -> list[bytes]:
        cur = txn.cursor(db=self._members)
        out: list[bytes] = []
        if cur.set_range(key):
            for k in cur.iternext(values=False):
                if k[:KEY] != key:
                    break
                out.append(bytes(k[KEY:]))
        return out

    def _sole_owner(self, txn: Any, key: bytes, owner: bytes) -> bool:
        """Whether ``owner`` is the only row naming ``key`` (reads at most two rows)."""
        cur = txn.cursor(db=self._members)
        rows: list[bytes] = []
        if cur.set_range(key):
            for k in cur.iternext(values=False):
                if k[:KEY] != key or len(rows) == 2:
                    break
                rows.append(bytes(k[KEY:]))
        return rows == [owner]

    def _has_owner(self, txn: Any, key: bytes) -> bool:
        """Whether any row names ``key`` (O(log n): the first row at or after it)."""
        cur = txn.cursor(db=self._members)
        return bool(cur.set_range(key)) and bytes(cur.key()[:KEY]) == key

    def _put_conv(self, txn: Any, m: ChainManifest, raw: bytes, stamp: bytes) -> None:
        cid = conv_id_key(m.conv_id)
        txn.put(
            cid,
            HEAD.pack(F_SESSION if m.session else 0, m.sealed_at_ns, stamp) + raw,
            db=self._convs,
        )
        if evictable(m):
            txn.put(U64.pack(m.sealed_at_ns) + cid, m.conv_id.encode(), db=self._ages)

    def _unlink_conv(self, txn: Any, conv_id: str, m: ChainManifest) -> set[bytes]:
        """Remove a conversation's entry, age and member rows; the keys it named."""
        cid = conv_id_key(conv_id)
        keys = manifest_keys(m)
        for k in keys:
            txn.delete(k + cid, db=self._members)
        txn.delete(U64.pack(m.sealed_at_ns) + cid, db=self._ages)
        txn.delete(cid, db=self._convs)
        return keys

    def _drop_ticket(self, txn: Any, ticket: bytes) -> list[bytes]:
        """Remove a park's registration rows; the keys it had registered."""
        row = txn.get(ticket, db=self._pending)
        if row is None:
            return []
        txn.delete(ticket, db=self._pending)
        tail = bytes(row[KEY:])
        keys = [tail[i : i + KEY] for i in range(0, len(tail), KEY)]
        for k in keys:
            txn.delete(k + ticket, db=self._members)
        return keys

    def _parking(self, txn: Any, cid: bytes) -> bytes | None:
        """The ticket of a park of ``cid`` in flight, if any (the pending table holds only
        what is in flight: a few rows)."""
        for k, v in txn.cursor(db=self._pending):
            if pending_conv(v) == cid:
                return bytes(k)
        return None

    def _doom(
        self, txn: Any, ticket: bytes, keys: set[bytes], conv: bytes | None
    ) -> tuple[bytes, ...]:
        """Doom the keys of ``keys`` that nothing names any more (and ``conv``'s manifest)."""
        dead = tuple(sorted(k for k in keys if not self._has_owner(txn, k)))
        for k in dead:
            txn.put(b"k" + k, ticket, db=self._doomed)
        if conv is not None:
            txn.put(b"c" + conv, ticket, db=self._doomed)
        return dead

    def _logged(self, txn: Any, conv_id: str) -> None:
        raw = txn.get(GEN_KEY, db=self._meta)
        gen = (U64.unpack(raw)[0] if raw else 0) + 1
        txn.put(GEN_KEY, U64.pack(gen), db=self._meta)
        txn.put(U64.pack(gen), conv_id.encode(), db=self._log)
        if gen > LOG_KEEP:
            txn.delete(U64.pack(gen - LOG_KEEP), db=self._log)
