"""What a read that failed does: a copy that failed validation (damage, spec F-SC-3) is a miss,
counted, logged and removed from its level so that the next put writes it again, but only
while it is still the copy read; any other failure (an I/O error, a level that cannot be
reached, the store closing) is a miss, counted and logged, and the page stays. A listed copy
whose data file is gone is damage too, found by a read or, without reading, by a put
(:meth:`ReadFailures.holds_whole`); its level sets it aside as ``strata fsck --repair`` does
(spec F-DUR-7)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from stratastore.chunks.reads import ConditionalDelete, DataCheck
from stratastore.chunks.room import ChunkRoom
from stratastore.errors import StrataError
from stratastore.format import IndexRecord
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.errors import SegmentNotFound

__all__ = ["ReadFailures"]

log = logging.getLogger("stratastore.chunks")


class ReadFailures:
    """The failed reads of one chunk store: ``name`` is how log lines name a page,
    ``count(counter)`` adds one to a store counter (``damaged``, ``read_errors``),
    ``closed()`` says whether the store is closed (its reads then fail quietly and remove
    nothing), ``room`` marks a page being removed so that a pin of it fails meanwhile."""

    def __init__(
        self,
        name: str,
        room: ChunkRoom,
        count: Callable[[str], None],
        closed: Callable[[], bool],
    ) -> None:
        self.name = name
        self._room = room
        self._count = count
        self._closed = closed

    def holds_whole(self, skey: bytes) -> bool:
        """Whether some level holds the page (its index or listing) and, where the level can
        tell without reading (:class:`~stratastore.chunks.reads.DataCheck`: a stat of the data
        file), with its data. A copy whose data file is gone is damage, :meth:`damaged` as a
        read that met it (counted, logged, set aside if still the copy looked at), and no
        copy a put may call present."""
        for lvl in self._room.levels:
            store = lvl.store
            if skey not in store:
                continue
            if not isinstance(store, DataCheck):
                return True
            try:
                identity = store.record(skey)
            except SegmentNotFound:
                continue  # moved down or deleted meanwhile: the next level may have it
            missing = store.missing_data(skey)
            if missing is None:
                return True
            self.damaged(store, skey, missing, identity, None)
        return False

    def read_error(self, skey: bytes, e: StrataError) -> None:
        """A read that failed for another reason than the page's own copy: a miss, counted
        in ``read_errors`` and logged (quietly once the store is closed); the page stays."""
        self._count("read_errors")
        if self._closed():
            log.info("stratastore: %s %s was not read: closed", self.name, skey.hex()[:16])
            return
        log.warning(
            "stratastore: %s %s could not be read (%s: %s): a miss; it is kept",
            self.name,
            skey.hex()[:16],
            type(e).__name__,
            e,
        )

    def damaged(
        self,
        store: SegmentBackend,
        skey: bytes,
        e: BaseException,
        identity: IndexRecord | None,
        sealed_at_ns: int | None,
    ) -> None:
        """Count (``damaged``) and log a copy that failed validation and remove it from
        ``store``, only if it is still the copy read (its index record still ``identity``, the
        one before it was opened, and sealed when the reader said): a copy stored again
        meanwhile, by this process or another, is never removed. Under the level's commit lock
        where the level has one (:class:`~stratastore.chunks.reads.ConditionalDelete`); a
        directory level sets a sidecar whose data file is gone aside into
        ``strata-quarantine/`` instead of unlinking it (spec F-DUR-7)."""
        self._count("damaged")
        log.warning(
            "stratastore: %s %s is damaged (%s: %s): never delivered; it is removed so that "
            "the next put writes it again",
            self.name,
            skey.hex()[:16],
            type(e).__name__,
            e,
        )
        if self._closed():
            return

        def still_the_copy_read() -> bool:
            try:
                rec: IndexRecord | None = store.record(skey)
            except SegmentNotFound:
                rec = None
            if rec != identity:
                return False
            return sealed_at_ns is None or (rec is not None and rec.sealed_at_ns == sealed_at_ns)

        with self._room.deleting(skey, unless_pinned=False):
            try:
                if isinstance(store, ConditionalDelete):
                    store.delete_if(skey, still_the_copy_read)
                elif still_the_copy_read():
                    store.delete(skey)
            except StrataError as d:
                log.error(
                    "stratastore: the damaged %s %s could not be removed from %s: %s; run "
                    "strata fsck on it",
                    self.name,
                    skey.hex()[:16],
                    store.path,
                    d,
                )
