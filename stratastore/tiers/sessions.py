"""Explicitly saved sessions (spec F-CHAIN-5): a conversation written under a name, durable when
the save returns, never shortened by capacity or age GC in any process, restored whole or not at
all. Session names and conversation ids are one namespace, the manifest name (F-CHAIN-4): the
shared catalog refuses, in the transaction that registers a write, a name the other namespace
holds."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from stratastore.catalog import Catalog, CatalogBusy, NameTaken
from stratastore.catalog.gc import Collector
from stratastore.catalog.tables import WAIT_S
from stratastore.chain import Conversation
from stratastore.errors import StrataError
from stratastore.restore import DestinationRefused, FlatKV, restore_batch
from stratastore.tiers.admission import Admitted, log_admission
from stratastore.tiers.checks import check_snapshot
from stratastore.tiers.context import FlowContext
from stratastore.tiers.disk_read import DiskReader
from stratastore.tiers.records import InvalidConversation, Snapshot
from stratastore.tiers.view import DiskConv, DiskView
from stratastore.tiers.write_queue import WriteQueue
from stratastore.tiers.writer import DiskWriter

__all__ = ["Sessions"]


def _taken(name: str) -> str:
    return (
        f"save_session: {name!r} is the id of a parked conversation; sessions and "
        "conversations share one namespace (spec F-CHAIN-4): save the session under "
        "another name"
    )


class Sessions:
    """Saves and loads: each checks and is admitted under the flow's ``lock``, then writes or
    reads without it (no call holds the lock over disk I/O or hashing; a session's durable
    write is a park's, performed by the store's write queue in order with the parks' writes,
    beside this process's restores as beside another process's)."""

    def __init__(
        self,
        ctx: FlowContext,
        writer: DiskWriter | None,
        reader: DiskReader,
        view: DiskView,
        parked_here: Callable[[str], bool],
        writes: WriteQueue,
    ) -> None:
        self.lock, self.fp, self.admission, self.warn = ctx.lock, ctx.fp, ctx.admission, ctx.warn
        self.writer = writer
        self.reader = reader
        self.view = view
        self.parked_here = parked_here  #: in this process's RAM, or waiting for its disk write
        self.writes = writes  #: performs the save's write (in order with the parks' writes)

    def _log(self, p: Admitted, what: str, name: str) -> None:
        """The admission's log line, for an admission under the transient floor."""
        log_admission(self.warn, p, what, f"session {name!r}")

    def save(self, snap: Snapshot) -> None:
        """Write ``snap`` to disk as the session ``snap.conv.conv_id``; refuses the id of a
        parked conversation (:class:`InvalidConversation`). Durable when this returns."""
        with self.lock:
            name = self._admit_save(snap)
        writer = self.writer
        assert writer is not None
        taken = _taken(name)
        try:
            written = self.writes.perform(lambda: writer.write(snap, session=True))
        except NameTaken:
            raise InvalidConversation(taken) from None
        if not written:
            raise StrataError(f"session {name}: the disk level refused it: {writer.last_refusal}")

    def _admit_save(self, snap: Snapshot) -> str:
        """The checks of a save, and its admission (under the Store's lock)."""
        check_snapshot(snap, self.fp, "save_session")
        name = snap.conv.conv_id
        if self.parked_here(name):
            raise InvalidConversation(_taken(name))
        if self.writer is None:
            raise StrataError(
                f"session {name} cannot be saved: no disk level is configured "
                "(set cold_dir and cold_mib)"
            )
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=False, disk=True)
        if p.where == "discard":
            raise StrataError(f"session {name} cannot be saved: {p.describe()}")
        self._log(p, "session save", name)
        return name

    def load(self, name: str, out: npt.NDArray[np.uint8]) -> Conversation:
        """Restore a saved session into ``out``; its conversation (tokens, checkpoints). An
        ``out`` that cannot be written in place is refused before anything else runs. Found and
        admitted under the lock; read and validated without it, then accounted under it."""
        dest = FlatKV(self.fp, out, read_direct=True)
        with self.lock:
            dc = self._admit_load(name, out)
            n = len(dc.conv.tokens)
            job = self.reader.job(dc, n, dest)
        got = restore_batch([job])[0]
        if isinstance(got, Exception):
            raise got
        with self.lock:
            self.reader.account(dc, job, got)
        if got.tokens < n:
            raise StrataError(f"session {name!r}: only {got.tokens} of {n} tokens are readable")
        return dc.conv

    def _admit_load(self, name: str, out: npt.NDArray[np.uint8]) -> DiskConv:
        """The session ``name`` on disk, checked against ``out`` and admitted (under the lock)."""
        self.view.sync()
        dc = self.view.get(name)
        if dc is None or not dc.session:
            raise StrataError(f"no saved session named {name!r}; save_session() writes one")
        n = len(dc.conv.tokens)
        tb = self.fp.token_bytes
        if out.nbytes < n * tb:
            raise DestinationRefused(
                f"session {name!r} needs {n * tb:,} bytes ({n:,} tokens), out has "
                f"{out.nbytes:,}; pass a buffer that large"
            )
        p = self.admission.admit(n * tb, stays_in_ram=False, disk=True)
        if p.where == "discard":
            raise StrataError(f"session {name!r} cannot be restored now: {p.describe()}")
        self._log(p, "session restore", name)
        return dc

    def delete(self, name: str, catalog: Catalog | None, gc: Collector | None) -> bool:
        """Remove a saved session (its manifest, and the segments nothing else names); False
        when there is none by that name. Waits while another process saves or removes it."""
        if catalog is None or gc is None:
            return False
        deadline = time.monotonic() + WAIT_S
        while catalog.is_session(name) is True:
            r = catalog.shorten(name, lambda m: 0, sessions=True)
            if r is not None:
                gc.carry_out(r)
                return True
            if time.monotonic() > deadline:
                raise CatalogBusy(
                    f"session {name!r} has been busy in another process for over {WAIT_S:.0f} "
                    "s; retry, or stop that process if it hangs"
                )
            time.sleep(0.005)
        return False
