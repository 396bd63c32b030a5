"""Writing a snapshot down: its segments into the first disk level, then its manifest, then its
commit in the shared catalog (spec F-CHAIN-3, F-CAT-5).

Order: register the keys in the catalog (from here no process's GC removes them, and a park of
the same conversation elsewhere waits), put each segment the levels do not hold yet (making room
first: the cascade, the last level's GC), write the manifest with the durable protocol (the
commit record), commit it in the catalog (which dooms what the previous version alone named),
and delete what was doomed. A level that refuses withdraws the registration: the segments only
this park named go, and the park is reported refused, never acknowledged on disk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from stratastore.catalog import Catalog
from stratastore.catalog.gc import Collector
from stratastore.errors import StrataError
from stratastore.format import KeyMismatch
from stratastore.format.keys import state_key
from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, encode_manifest
from stratastore.format.naming import chain_name
from stratastore.io.durable import durable_write_in
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.cascade import DiskLevel, LevelRefused
from stratastore.tiers.records import Snapshot

__all__ = ["DiskWriter"]

_SLACK = 8192  #: a sidecar and a header beside the pages, as make_room counts a segment


class DiskWriter:
    def __init__(
        self,
        levels: Sequence[DiskLevel],
        catalog: Catalog,
        gc: Collector,
        root: bytes,
        token_bytes: int,
        manifest_dir: str,
        file_mode: int,
        warn: Callable[[str], None],
    ) -> None:
        self.levels = levels
        self.level = levels[0]
        self.catalog = catalog
        self.gc = gc
        self.root = root
        self.tb = token_bytes
        self.manifest_dir = manifest_dir
        self.file_mode = file_mode
        self.warn = warn
        self.last_refusal = ""

    def holder(self, key: bytes) -> SegmentBackend | None:
        """The level that holds ``key`` now (the first, in the cascade's order)."""
        for lvl in self.levels:
            if key in lvl.store:
                return lvl.store
        return None

    def write(
        self, snap: Snapshot, *, session: bool = False, on_put: Callable[[int], None] | None = None
    ) -> bool:
        """Write ``snap`` down (see the module's docstring); False when a level refused it
        (:attr:`last_refusal` says why). A segment whose ``(start, end)`` is in
        ``snap.page_hashes`` (a park from device memory) is put with those digests, not hashed
        again; the others are hashed by the level as they are written. Raises
        :class:`~stratastore.catalog.NameTaken` when its id is the other namespace's.
        ``on_put(n)``: called after each put with the bytes the level now counts for it (the
        size :meth:`refusal` reserved for it), so a reservation is released as it lands."""
        conv = snap.conv
        specs = conv.segment_keys(self.root)
        ends = {s.end: s.key for s in specs}
        states = {n: b for n, b in sorted(snap.states.items()) if n in ends and b}
        skeys = {n: state_key(ends[n]) for n in states}  # F-KEY-5
        ticket = self.catalog.begin(
            conv.conv_id, {s.key for s in specs} | set(skeys.values()), session=session
        )
        try:
            for i, seg in enumerate(specs):
                if self.holder(seg.key) is None:
                    self.level.make_room((seg.end - seg.start) * self.tb + _SLACK)
                    toks = conv.tokens[seg.start : seg.end]
                    put = self.level.store.put_kv(  # digests from the device: not hashed again
                        seg.parent,
                        toks,
                        snap.payload(seg.start, seg.end, self.tb),
                        token_start=seg.start,
                        media=seg.media,
                        page_hashes=snap.page_hashes.get((seg.start, seg.end)),
                    )
                    if on_put is not None:
                        on_put((seg.end - seg.start) * self.tb + _SLACK)
                    if put.key != seg.key:  # one derivation: a difference is a bug, never data
                        raise KeyMismatch(
                            f"conversation {conv.conv_id}",
                            f"segment {i} (tokens [{seg.start}, {seg.end}))",
                            seg.key,
                            put.key,
                        )
            for n, blob in states.items():
                if self.holder(skeys[n]) is None:
                    self.level.make_room(len(blob) + _SLACK)
                    self.level.store.put_state(ends[n], blob, token_pos=n)
                    if on_put is not None:
                        on_put(len(blob) + _SLACK)
            m = ChainManifest(
                conv.conv_id,
                self.root,
                conv.tokens.copy(),
                tuple(
                    ManifestCheckpoint(c.length, c.pinned, c.tail, skeys.get(c.length))
                    for c in conv.checkpoints
                ),
                tuple(sorted(conv.media.items())),
                tuple((s.start, s.end, s.key) for s in specs),
                time.time_ns(),
                session,
            )
            raw = encode_manifest(m)
        except LevelRefused as e:
            self._withdraw(ticket, conv.conv_id)
            self.last_refusal = str(e)
            self.warn(f"conversation {conv.conv_id} not written to disk: {e}")
            return False
        except BaseException:
            self._withdraw(ticket, conv.conv_id)
            raise
        try:
            stamp = durable_write_in(
                self.manifest_dir, chain_name(conv.conv_id), raw, mode=self.file_mode
            )  # F-DIR-9
        except BaseException:
            self._settle(ticket, conv.conv_id)
            raise
        try:
            removal = self.catalog.commit(ticket, m, raw, stamp)
        except BaseException:  # the manifest is durable: whoever meets the ticket commits it
            self.catalog.orphan(ticket)
            raise
        self.gc.carry_out(removal)
        return True

    def _settle(self, ticket: bytes, conv_id: str) -> None:
        """After the manifest's write failed: its file may hold the old version, nothing, or
        the new one (the rename done, the directory's fsync or the stamp failed), and a
        withdrawal would then leave a manifest naming deleted segments. So the park is finished
        from the file, as a dead process's is (F-CAT-7): committed when the file holds the new
        manifest, else withdrawn. When that fails too, the ticket is left for whoever meets it
        (the next park of the conversation, the next open), its segments kept until then."""
        self.catalog.orphan(ticket)
        try:
            self.catalog.on_dead(ticket)
        except StrataError as e:
            self.warn(f"conversation {conv_id}: finishing its failed write failed too: {e}")

    def _withdraw(self, ticket: bytes, conv_id: str) -> None:
        """Take back a park's registration after a failure, so that nothing of this process
        stays in flight (a later park of the conversation would wait on it). Best effort: a
        second failure is said (the ticket is then left for whoever meets it, F-CAT-7), and the
        first error is the one raised."""
        try:
            self.gc.carry_out(self.catalog.abort(ticket))
        except StrataError as e:
            self.catalog.orphan(ticket)
            self.warn(f"conversation {conv_id}: withdrawing its write failed too: {e}")

    def refusal(self, snap: Snapshot, pending_bytes: int, reject: bool) -> int | str:
        """The bytes ``snap`` will take in the disk levels, or why they will refuse it: a
        segment larger than the first level's whole budget (any ``when_full``), or, with
        ``when_full=reject`` (``reject``), more than the levels have free beside the
        ``pending_bytes`` of writes already waiting. The same per-entry sizes as :meth:`write`'s
        ``make_room`` calls. O(segments): ``used()`` is a counter."""
        level = self.level
        largest = max((e - s for s, e in snap.conv.boundaries()), default=0) * self.tb + _SLACK
        if largest > level.budget:
            return (
                f"{level.name} level: a segment of {largest:,} bytes is larger than its whole "
                f"budget ({level.budget:,} bytes); raise that level's budget"
            )
        states = sum(_SLACK + len(b) for b in snap.states.values() if b)
        if not reject:
            return snap.nbytes + states  # an upper bound; the last level makes room
        need = states + sum(
            _SLACK + (e - s) * self.tb
            for s, e, k in snap.conv.segments(self.root)
            if self.holder(k) is None
        )
        free = -pending_bytes + sum(max(0, lvl.budget - lvl.used()) for lvl in self.levels)
        if need > free:
            return (
                f"the disk levels are full ({need:,} bytes needed, {max(free, 0):,} free "
                "beside the writes waiting) and when_full=reject; raise their budget or set "
                "when_full=evict"
            )
        return need
