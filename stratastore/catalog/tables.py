"""The shared catalog of a store: one set of LMDB tables every process reads and writes in
transactions (spec F-CAT; DESIGN "one catalog for every process").

It lives in the environment of the last disk level's ``strata-index/`` (the directory that holds
the manifests, F-CHAIN-4), beside that level's segment index. A change one process commits is
seen by the next call of every other: each keeps its lookup tree in step by reading the change
log from the generation it last saw (:meth:`Catalog.changes_since`), never by listing
directories or comparing timestamps. Like the index it is derived state: rebuilt from the
manifests when absent and reconciled on open (:mod:`stratastore.catalog.recovery`).

The tables and their rows are :mod:`stratastore.catalog.rows`; what the catalog answers,
:mod:`stratastore.catalog.reads`; this module makes its decisions.

Every decision is one write transaction, so two processes never both act on one conversation:
a park registers its keys before it writes a segment (nothing it depends on can be removed
meanwhile), a removal dooms the keys and the manifest it is about to delete (no park may reuse
them until it is done), and a park of a conversation waits for another one in flight.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratastore.catalog.chains import conv_id_key, cut_manifest, manifest_keys
from stratastore.catalog.reads import CatalogReads
from stratastore.catalog.rows import (
    F_SESSION,
    GEN_KEY,
    HEAD,
    KEY,
    SCHEMA,
    SCHEMA_KEY,
    TICKET,
    U64,
    pending_row,
)
from stratastore.errors import StrataError
from stratastore.format.manifest import ChainManifest, encode_manifest
from stratastore.io.system import process_alive, process_start, this_process
from stratastore.levels.backend import TableEnvironment

__all__ = ["Catalog", "CatalogBusy", "NameTaken", "Removal", "ticket_pid"]

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


class Catalog(CatalogReads):
    """The catalog tables in ``index``'s environment (the last level's). Thread-safe as LMDB
    is; the Store serialises its own calls."""

    def __init__(self, index: TableEnvironment) -> None:
        super().__init__(index)
        self.pid = this_process()
        self.start = process_start(self.pid)
        #: finishes the work a dead process left in flight (recovery's ``finish_ticket``; the
        #: default only releases it, leaving the files for the next open)
        self.on_dead: Callable[[bytes], None] = self.clear_ticket

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
