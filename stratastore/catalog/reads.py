"""What the shared catalog answers (spec F-CAT): each answer one read transaction, so it is
what some commit left, never half of one. The decisions are
:class:`~stratastore.catalog.tables.Catalog`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratastore.catalog.chains import conv_id_key, cut_manifest, manifest_keys
from stratastore.catalog.rows import (
    F_SESSION,
    GEN_KEY,
    HEAD,
    KEY,
    SCHEMA,
    SCHEMA_KEY,
    U64,
    CatalogRows,
    pending_conv,
)
from stratastore.format.manifest import ChainManifest

__all__ = ["CatalogReads"]


class CatalogReads(CatalogRows):
    """The catalog's reads; see the module."""

    # -- reading ------------------------------------------------------------------------------
    def built(self) -> bool:
        raw = self._read(lambda t: t.get(SCHEMA_KEY, db=self._meta))
        return raw is not None and int.from_bytes(raw, "big") == SCHEMA

    def changes_since(self, gen: int) -> tuple[int, set[str] | None]:
        """The generation now and the conversations changed after ``gen`` (None: the log no
        longer reaches back that far, reload everything). O(changes), one read transaction."""

        def run(txn: Any) -> tuple[int, set[str] | None]:
            raw = txn.get(GEN_KEY, db=self._meta)
            now = U64.unpack(raw)[0] if raw else 0
            if now == gen:
                return now, set()
            cur = txn.cursor(db=self._log)
            if now < gen or not cur.first() or U64.unpack(cur.key())[0] > gen + 1:
                return now, None
            changed: set[str] = set()
            if cur.set_range(U64.pack(gen + 1)):
                changed.update(bytes(v).decode() for v in cur.iternext(keys=False))
            return now, changed

        out: tuple[int, set[str] | None] = self._read(run)
        return out

    def get(self, conv_id: str) -> ChainManifest | None:
        raw = self._read(lambda t: t.get(conv_id_key(conv_id), db=self._convs))
        return self._decode(conv_id, raw) if raw is not None else None

    def is_session(self, name: str) -> bool | None:
        """True for a saved session, False for a conversation, None when neither is stored."""
        raw = self._read(lambda t: t.get(conv_id_key(name), db=self._convs))
        return None if raw is None else bool(raw[0] & F_SESSION)

    def all(self) -> list[ChainManifest]:
        def run(txn: Any) -> list[tuple[str, bytes]]:
            return [(bytes(k).hex(), bytes(v)) for k, v in txn.cursor(db=self._convs)]

        rows: list[tuple[str, bytes]] = self._read(run)
        return [self._decode(cid, raw) for cid, raw in rows]

    def __len__(self) -> int:
        return int(self._read(lambda t: t.stat(self._convs)["entries"]))

    def by_digest(self, digest: bytes) -> ChainManifest | None:
        """The entry whose :func:`conv_id_key` is ``digest`` (a manifest file's name)."""
        raw = self._read(lambda t: t.get(digest, db=self._convs))
        return self._decode(digest.hex(), raw) if raw is not None else None

    def named_by(self, key: bytes) -> list[str]:
        """The conversations whose manifests name ``key``."""

        def run(txn: Any) -> list[str]:
            out = []
            for owner in self._owners(txn, key):
                raw = txn.get(owner, db=self._convs) if len(owner) == KEY else None
                if raw is not None:
                    out.append(self._decode(owner.hex(), raw).conv_id)
            return out

        got: list[str] = self._read(run)
        return got

    def owners(self, key: bytes) -> int:
        """How many manifests and parks in flight name ``key`` (its reference count)."""
        return len(self._read(lambda t: self._owners(t, key)))

    def oldest(self, before_ns: int | None = None, limit: int = 8) -> list[str]:
        """Up to ``limit`` conversations GC may shorten, oldest first (sealed before
        ``before_ns`` when given). O(log n + limit)."""

        def run(txn: Any) -> list[str]:
            out = []
            for k, v in txn.cursor(db=self._ages):
                if before_ns is not None and U64.unpack(k[:8])[0] >= before_ns:
                    break
                out.append(bytes(v).decode())
                if len(out) >= limit:
                    break
            return out

        got: list[str] = self._read(run)
        return got

    def would_free(self, conv_id: str, keep: Callable[[ChainManifest], int]) -> list[bytes]:
        """The keys :meth:`shorten` with ``keep`` would delete now: those past the cut that no
        other conversation or park names. O(keys x log n), a read transaction."""
        cid = conv_id_key(conv_id)

        def run(txn: Any) -> list[bytes]:
            raw = txn.get(cid, db=self._convs)
            if raw is None:
                return []
            m = self._decode(conv_id, raw)
            cut = cut_manifest(m, keep(m))
            gone = manifest_keys(m) - (manifest_keys(cut) if cut is not None else set())
            return [k for k in gone if self._sole_owner(txn, k, cid)]

        out: list[bytes] = self._read(run)
        return out

    def in_flight(self) -> list[tuple[bytes, bytes | None]]:
        """``(ticket, C)`` of every park in flight and ``(ticket, None)`` of every removal in
        flight (recovery finishes those of processes that are gone)."""

        def run(txn: Any) -> list[tuple[bytes, bytes | None]]:
            rows: list[tuple[bytes, bytes | None]] = [
                (bytes(k), pending_conv(v)) for k, v in txn.cursor(db=self._pending)
            ]
            rows += [(bytes(v), None) for v in txn.cursor(db=self._doomed).iternext(keys=False)]
            return rows

        out: list[tuple[bytes, bytes | None]] = self._read(run)
        return out

    def parking_conv(self, ticket: bytes) -> bytes | None:
        """The C of the park ``ticket`` registered, or None when it is not a park in flight."""
        row = self._read(lambda t: t.get(ticket, db=self._pending))
        return pending_conv(row) if row is not None else None

    def doomed_by(self, ticket: bytes) -> tuple[list[bytes], list[bytes]]:
        """The keys and the conversations (C) a removal in flight holds."""

        def run(txn: Any) -> tuple[list[bytes], list[bytes]]:
            keys: list[bytes] = []
            convs: list[bytes] = []
            for k, v in txn.cursor(db=self._doomed):
                if bytes(v) == ticket:
                    (keys if k[:1] == b"k" else convs).append(bytes(k[1:]))
            return keys, convs

        out: tuple[list[bytes], list[bytes]] = self._read(run)
        return out

    def raw_by_digest(self, digest: bytes) -> bytes | None:
        """The manifest bytes of the entry whose :func:`conv_id_key` is ``digest``."""
        raw = self._read(lambda t: t.get(digest, db=self._convs))
        return bytes(raw[HEAD.size :]) if raw is not None else None

    def stamps(self) -> dict[bytes, bytes]:
        """C -> the stamp of the file each entry was committed from (recovery compares them)."""

        def run(txn: Any) -> dict[bytes, bytes]:
            return {
                bytes(k): HEAD.unpack(bytes(v[: HEAD.size]))[2]
                for k, v in txn.cursor(db=self._convs)
            }

        out: dict[bytes, bytes] = self._read(run)
        return out
