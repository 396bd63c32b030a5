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

from ..catalog import Catalog, CatalogBusy, NameTaken
from ..catalog.gc import Collector
from ..catalog.tables import WAIT_S
from ..chain import Conversation
from ..errors import StrataError
from ..format import ModelFingerprint
from ..restore import DestinationRefused, FlatKV
from .admission import Admission
from .checks import check_snapshot
from .disk_read import DiskReader
from .records import InvalidConversation, Snapshot
from .view import DiskView
from .writer import DiskWriter

__all__ = ["Sessions"]


class Sessions:
    def __init__(self, fp: ModelFingerprint, admission: Admission, writer: DiskWriter | None,
                 reader: DiskReader, view: DiskView,
                 parked_here: Callable[[str], bool]) -> None:  # fmt: skip
        self.fp = fp
        self.admission = admission
        self.writer = writer
        self.reader = reader
        self.view = view
        self.parked_here = parked_here  #: in this process's RAM, or waiting for its disk write

    def save(self, snap: Snapshot) -> None:
        """Write ``snap`` to disk as the session ``snap.conv.conv_id``; refuses the id of a
        parked conversation (:class:`InvalidConversation`)."""
        check_snapshot(snap, self.fp, "save_session")
        name = snap.conv.conv_id
        taken = (f"save_session: {name!r} is the id of a parked conversation; sessions and "
                 "conversations share one namespace (spec F-CHAIN-4): save the session under "
                 "another name")  # fmt: skip
        if self.parked_here(name):
            raise InvalidConversation(taken)
        if self.writer is None:
            raise StrataError(f"session {name} cannot be saved: no disk level is configured "
                              "(set cold_dir and cold_mib)")  # fmt: skip
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=False, disk=True)
        if p.where == "discard":
            raise StrataError(f"session {name} cannot be saved: {p.describe()}")
        try:
            written = self.writer.write(snap, session=True)
        except NameTaken:
            raise InvalidConversation(taken) from None
        if not written:
            raise StrataError(f"session {name}: the disk level refused it: "
                              f"{self.writer.last_refusal}")  # fmt: skip

    def load(self, name: str, out: npt.NDArray[np.uint8]) -> Conversation:
        """Restore a saved session into ``out``; its conversation (tokens, checkpoints). An
        ``out`` that cannot be written in place is refused before anything else runs."""
        dest = FlatKV(self.fp, out, read_direct=True)
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
        got = self.reader.read(dc, n, dest)
        if got < n:
            raise StrataError(f"session {name!r}: only {got} of {n} tokens are readable")
        return dc.conv

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
