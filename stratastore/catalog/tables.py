"""The shared catalog of a store: one set of LMDB tables every process reads and writes in
transactions (spec F-CAT; DESIGN "one catalog for every process").

It lives in the environment of the last disk level's ``strata-index/`` (the directory that holds
the manifests, F-CHAIN-4), beside that level's segment index. A change one process commits is
seen by the next call of every other: each keeps its lookup tree in step by reading the change
log from the generation it last saw (:meth:`Catalog.changes_since`), never by listing
directories or comparing timestamps. Like the index it is derived state: rebuilt from the
manifests when absent and reconciled on open (:mod:`stratastore.catalog.recovery`).

Every decision is one write transaction, so two processes never both act on one conversation:
a park registers its keys before it writes a segment (nothing it depends on can be removed
meanwhile), a removal dooms the keys and the manifest it is about to delete (no park may reuse
them until it is done), and a park of a conversation waits for another one in flight.

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

Every answer (:meth:`Catalog.get`, :meth:`Catalog.owners`, ...) is one read transaction, so it is
what some commit left, never half of one.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratastore.catalog.chains import conv_id_key, cut_manifest, evictable, manifest_keys
from stratastore.errors import StrataError
from stratastore.format.manifest import ChainManifest, decode_manifest, encode_manifest
from stratastore.io.system import process_alive, process_start, this_process
from stratastore.levels.backend import TableEnvironment

__all__ = ["Catalog", "CatalogBusy", "NameTaken", "Removal", "ticket_pid"]

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


WAIT_S = 60.0  #: the longest a park waits for another process's work on its conversation
_nonce = itertools.count(time.time_ns())
#: the tickets this process has handed out and not finished: a ticket of this very process
#: (pid and start time) that is not here was left by work that failed or by an earlier open
_live: set[bytes] = set()


class NameTaken(StrataError):
    """A name is the other namespace's: a session's name parked as a conversation, or a
    conversation's id saved as a session (spec F-CHAIN-4)."""


class CatalogBusy(StrataError):
    """Another live process held a conversation or a segment this call needs for longer than
    :data:`WAIT_S`; the message names the process."""


@dataclass(frozen=True, slots=True)
class Removal:
    """A removal the catalog decided (:meth:`Catalog.shorten`): the caller makes the files match
    (writes ``manifest`` over the conversation's file, or unlinks it when None; deletes the
    ``dead`` keys from every level), then calls :meth:`Catalog.finish`."""

    conv_id: str
    manifest: bytes | None
    dead: tuple[bytes, ...]
    ticket: bytes
    freed_tokens: int


def ticket_pid(ticket: bytes) -> int:
    """The process a ticket of work in flight belongs to."""
    return int(TICKET.unpack(ticket)[1])


class Catalog:
    """The catalog tables in ``index``'s environment (the last level's, F-CAT-1): their rows,
    what they answer and the decisions made on them (see the module). Thread-safe as LMDB is;
    the Store serialises its own calls. Every private method that takes ``txn`` runs inside the
    caller's transaction."""

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
        self.pid = this_process()
        self.start = process_start(self.pid)
        #: finishes the work a dead process left in flight (recovery's ``finish_ticket``; the
        #: default only releases it, leaving the files for the next open)
        self.on_dead: Callable[[bytes], None] = self.clear_ticket

    # -- transactions -------------------------------------------------------------------------
    def _write(self, fn: Callable[[Any], Any]) -> Any:
        return self.index.write_txn(fn)

    def _read(self, fn: Callable[[Any], Any]) -> Any:
        with self.index.read_txn() as txn:
            return fn(txn)

    def _decode(self, conv_id: str, raw: bytes) -> ChainManifest:
        return decode_manifest(bytes(raw[HEAD.size :]), f"catalog entry {conv_id!r}")

    # -- rows (each inside the caller's transaction) ------------------------------------------
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

    # -- tickets ------------------------------------------------------------------------------
    def new_ticket(self) -> bytes:
        ticket = TICKET.pack(0xFF, self.pid, self.start, next(_nonce))
        _live.add(ticket)
        return ticket

    def alive(self, ticket: bytes) -> bool:
        """Whether the process that made ``ticket`` still runs: its pid exists and started
        when the ticket says (a pid reused by another process, a restarted container's pid 1,
        is not it)."""
        _, pid, start, _ = TICKET.unpack(ticket)
        if (pid, start) == (self.pid, self.start):
            return ticket in _live
        return process_alive(pid) and (start == 0 or process_start(pid) == start)

    def doom_unnamed(self, key: bytes) -> Removal | None:
        """Doom ``key`` for deletion if nothing names it (no manifest, no park in flight) and no
        removal holds it; None otherwise. The caller deletes it, then finishes."""
        ticket = self.new_ticket()

        def run(txn: Any) -> tuple[bytes, ...] | None:
            if self._has_owner(txn, key) or txn.get(b"k" + key, db=self._doomed) is not None:
                return None
            return self._doom(txn, ticket, {key}, None)

        dead: tuple[bytes, ...] | None = self._write(run)
        if dead is None:
            _live.discard(ticket)
            return None
        return Removal("", None, dead, ticket, 0)

    # -- parks --------------------------------------------------------------------------------
    def begin(self, conv_id: str, keys: set[bytes], *, session: bool) -> bytes:
        """Register a park (or a session save) of ``conv_id`` naming ``keys``, before any of
        its segments is written: from here no process removes those keys. Waits while another
        process parks or removes that conversation or removes one of the keys (its files are
        going); raises :class:`NameTaken` when the name is the other namespace's."""
        ticket = self.new_ticket()
        cid = conv_id_key(conv_id)

        def run(txn: Any) -> bytes | None:
            raw = txn.get(cid, db=self._convs)
            if raw is not None and bool(raw[0] & F_SESSION) != session:
                raise NameTaken(conv_id)
            blocker = txn.get(b"c" + cid, db=self._doomed)
            if blocker is None:
                blocker = self._parking(txn, cid)
            if blocker is None:
                blocker = next((b for k in keys if (b := txn.get(b"k" + k, db=self._doomed))), None)
            if blocker is not None:
                return bytes(blocker)
            txn.put(ticket, pending_row(cid, keys), db=self._pending)
            for k in keys:
                txn.put(k + ticket, b"", db=self._members)
            return None

        self._wait(run, f"conversation {conv_id!r}")
        return ticket

    def _wait(self, attempt: Callable[[Any], bytes | None], what: str) -> None:
        """Retry ``attempt`` (a write transaction returning the blocking ticket, or None when it
        went through) until it goes through; a blocker whose process is gone is cleared."""
        deadline = time.monotonic() + WAIT_S
        delay = 0.001
        while (blocker := self._write(attempt)) is not None:
            pid = ticket_pid(blocker)
            if not self.alive(blocker):
                self.on_dead(blocker)
                continue
            if time.monotonic() > deadline:
                raise CatalogBusy(
                    f"{what} has been busy in process {pid} for over {WAIT_S:.0f} s (a park or "
                    "a removal in flight); if that process hangs, stop it and retry"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def commit(self, ticket: bytes, m: ChainManifest, raw: bytes, stamp: bytes) -> Removal:
        """Make ``m`` (whose file ``raw`` is durable now) the conversation's entry, replacing
        the one before; the keys no manifest names any more are doomed in the same transaction
        and returned for the caller to delete (then :meth:`finish`)."""
        cid = conv_id_key(m.conv_id)

        def run(txn: Any) -> tuple[bytes, ...]:
            old = txn.get(cid, db=self._convs)
            touched = set(self._drop_ticket(txn, ticket))
            if old is not None:
                touched |= self._unlink_conv(txn, m.conv_id, self._decode(m.conv_id, old))
            for k in manifest_keys(m):
                txn.put(k + cid, b"", db=self._members)
            self._put_conv(txn, m, raw, stamp)
            self._logged(txn, m.conv_id)
            return self._doom(txn, ticket, touched, None)

        dead: tuple[bytes, ...] = self._write(run)
        return Removal("", None, dead, ticket, 0)  # the file is the new one: leave it

    def abort(self, ticket: bytes) -> Removal:
        """Withdraw a park that did not commit: the keys only it named are doomed and returned
        (its segments, written or half-written, go)."""

        def run(txn: Any) -> tuple[bytes, ...]:
            return self._doom(txn, ticket, set(self._drop_ticket(txn, ticket)), None)

        dead: tuple[bytes, ...] = self._write(run)
        return Removal("", None, dead, ticket, 0)

    # -- removals -----------------------------------------------------------------------------
    def shorten(
        self,
        conv_id: str,
        keep: Callable[[ChainManifest], int],
        *,
        sessions: bool = False,
        touch_file: bool = True,
    ) -> Removal | None:
        """Cut ``conv_id`` to the prefix ``keep(manifest)`` tokens long (0: remove it), in one
        transaction: the conversation and the keys nothing names any more are doomed and
        returned (see :class:`Removal`). None when there is nothing to do: it is gone, being
        parked by another call, a session (unless ``sessions``), or ``keep`` keeps it all.
        Without ``touch_file`` the removal leaves the manifest file as it is (a file refused
        at open: fsck reports it)."""
        cid = conv_id_key(conv_id)
        ticket = self.new_ticket()

        def run(txn: Any) -> tuple[bytes | None, tuple[bytes, ...], int] | None:
            raw = txn.get(cid, db=self._convs)
            if raw is None or txn.get(b"c" + cid, db=self._doomed) is not None:
                return None
            m = self._decode(conv_id, raw)
            if (m.session and not sessions) or self._parking(txn, cid) is not None:
                return None
            cut = cut_manifest(m, keep(m))
            if cut is not None and len(cut.tokens) >= len(m.tokens):
                return None
            touched = self._unlink_conv(txn, conv_id, m)
            new: bytes | None = None
            if cut is not None:
                new = encode_manifest(cut)
                for k in manifest_keys(cut):
                    txn.put(k + cid, b"", db=self._members)
                self._put_conv(txn, cut, new, bytes(24))  # the file is rewritten after
            self._logged(txn, conv_id)
            freed = len(m.tokens) - (len(cut.tokens) if cut is not None else 0)
            return new, self._doom(txn, ticket, touched, cid if touch_file else None), freed

        got = self._write(run)
        if got is None:
            _live.discard(ticket)
            return None
        return Removal(conv_id if touch_file else "", got[0], got[1], ticket, got[2])

    def orphan(self, ticket: bytes) -> None:
        """This process gives up on ``ticket`` without finishing it (its catalog commit failed
        after its manifest became durable): its rows stay, protecting its segments, and the
        next park that meets it or the next open finishes it from the file (F-CAT-7)."""
        _live.discard(ticket)

    def finish(self, r: Removal) -> None:
        """A removal's files are gone (or rewritten): release its dooms."""
        self.clear_ticket(r.ticket)

    def clear_ticket(self, ticket: bytes) -> None:
        """Drop what ``ticket`` holds: its park's registrations, its removal's dooms."""
        _live.discard(ticket)

        def run(txn: Any) -> None:
            self._drop_ticket(txn, ticket)
            for k, v in list(txn.cursor(db=self._doomed)):
                if bytes(v) == ticket:
                    txn.delete(k, db=self._doomed)

        self._write(run)

    # -- rebuild and reconcile (stratastore.catalog.recovery drives these) ---------------------
    def replace_all(self, manifests: list[tuple[ChainManifest, bytes, bytes]]) -> bool:
        """Build the catalog from ``manifests`` in one transaction, unless another process
        built it first (then False: that one is the truth, F-CAT-2). Work in flight is kept:
        the parks' registrations are entered again, so that a rebuild while other processes
        run never leaves their segments unprotected."""

        def run(txn: Any) -> bool:
            raw = txn.get(SCHEMA_KEY, db=self._meta)
            if raw is not None and int.from_bytes(raw, "big") == SCHEMA:
                return False
            for db in (self._convs, self._members, self._ages, self._log):
                txn.drop(db, delete=False)
            for ticket, row in list(txn.cursor(db=self._pending)):
                tail = bytes(row[KEY:])
                for i in range(0, len(tail) - KEY + 1, KEY):
                    txn.put(tail[i : i + KEY] + bytes(ticket), b"", db=self._members)
            for m, data, stamp in manifests:
                for k in manifest_keys(m):
                    txn.put(k + conv_id_key(m.conv_id), b"", db=self._members)
                self._put_conv(txn, m, data, stamp)
            gen = txn.get(GEN_KEY, db=self._meta)
            txn.put(GEN_KEY, U64.pack((U64.unpack(gen)[0] if gen else 0) + 1), db=self._meta)
            txn.put(SCHEMA_KEY, SCHEMA.to_bytes(4, "big"), db=self._meta)
            return True

        built: bool = self._write(run)
        return built

    def reset(self) -> None:
        """Forget the conversations (a damaged catalog: it is derived, the next recovery
        rebuilds it from the manifests, F-CAT-2); the work in flight is kept (see
        :meth:`replace_all`)."""

        def run(txn: Any) -> None:
            for db in (self._convs, self._members, self._ages, self._log):
                txn.drop(db, delete=False)
            txn.delete(SCHEMA_KEY, db=self._meta)

        self._write(run)

    def put_file(self, m: ChainManifest, raw: bytes, stamp: bytes) -> Removal | None:
        """Enter a manifest file found on disk that the catalog lacks or holds another version
        of (a crash between a file's write and its commit; a store written before the catalog;
        a file changed behind its back): it replaces the entry, and what the entry alone named
        is doomed and returned. None while the conversation is being parked or removed."""
        cid = conv_id_key(m.conv_id)
        ticket = self.new_ticket()

        def run(txn: Any) -> tuple[bytes, ...] | None:
            if (
                txn.get(b"c" + cid, db=self._doomed) is not None
                or self._parking(txn, cid) is not None
            ):
                return None
            old = txn.get(cid, db=self._convs)
            touched = (
                self._unlink_conv(txn, m.conv_id, self._decode(m.conv_id, old))
                if old is not None
                else set()
            )
            for k in manifest_keys(m):
                txn.put(k + cid, b"", db=self._members)
            self._put_conv(txn, m, raw, stamp)
            self._logged(txn, m.conv_id)
            return self._doom(txn, ticket, touched, None)

        dead: tuple[bytes, ...] | None = self._write(run)
        if dead is None:
            _live.discard(ticket)
            return None
        return Removal("", None, dead, ticket, 0)

    def restamp(self, digest: bytes, raw: bytes, stamp: bytes) -> None:
        """The file of entry ``digest`` holds the entry's very bytes under a new stamp."""

        def run(txn: Any) -> None:
            row = txn.get(digest, db=self._convs)
            if row is not None and bytes(row[HEAD.size :]) == raw:
                flags, sealed, _ = HEAD.unpack(bytes(row[: HEAD.size]))
                txn.put(digest, HEAD.pack(flags, sealed, stamp) + raw, db=self._convs)

        self._write(run)
