"""The tiers working together: RAM level, disk levels, admission, park targets and counters.

:class:`Tiers` is the policy core of :class:`~stratastore.Store`: it decides where each park
goes (RAM -> disk -> discard, seed 000), keeps RAM captures in the pre-reserved arena, writes
disk parks as content-addressed segments into the first disk level (warm when configured, else
cold) and runs the cascade after every write, finds the deepest resume point across RAM and
disk, and restores it into the caller's buffer with every disk page validated.

A conversation on disk is committed by its chain manifest (spec F-CHAIN), written after its
segments into the last level's directory; every process builds its disk lookup index from the
manifests and picks up new ones when that directory changes, so conversations parked by one
process are found and restored by another. Explicitly saved sessions are manifests flagged as
such: their segments are exempt from capacity GC. Not thread-safe by itself (the Store
serialises calls).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..chain import (
    Checkpoint,
    Conversation,
    Match,
    PrefixIndex,
    as_media,
    as_tokens,
    enforce_count,
)
from ..chain.parking import ConversationCache, SizeModel
from ..config import StoreConfig
from ..errors import ConfigError, StrataError
from ..format import ChecksumMismatch, FormatError, KeyMismatch, Level, ModelFingerprint
from ..format.manifest import (
    MAX_CONV_ID,
    MAX_ITEMS,
    MAX_MANIFEST_BYTES,
    MAX_TOKENS,
    ChainManifest,
    ManifestCheckpoint,
    decode_manifest,
    encode_manifest,
    verify_manifest_keys,
)
from ..format.naming import chain_name, is_chain_name
from ..format.sidecar import MAX_PAGES
from ..io import durable_write, files, guard
from ..io.errors import StrataIOError
from ..restore import (
    Destination,
    DestinationRefused,
    FlatKV,
    Job,
    Outcome,
    Piece,
    as_destination,
    restore_batch,
)
from ..store import SegmentStore
from .admission import MIB, Admission, Placement
from .arena import DEFAULT_CHUNK, Allocation, Arena
from .disk import DiskLevel, LevelRefused

__all__ = [
    "MAX_STATE_BYTES",
    "InvalidConversation",
    "ParkReport",
    "Restored",
    "Snapshot",
    "SpillRefused",
    "Tiers",
]

#: the largest running state a restore reads back (a bound on what a sidecar can make it allocate)
MAX_STATE_BYTES = 1 << 32


class InvalidConversation(ConfigError):
    """A park or a session save that cannot be stored as given (a bad id, checkpoints or cuts
    outside the tokens, a K/V of the wrong size, a name taken in the other namespace); raised
    before anything is acknowledged or stored. The message names the conversation and the fix."""


class SpillRefused(StrataError):
    """A disk level refused the background write of an acknowledged park (full with
    ``when_full=reject``, an entry larger than its budget, or its id became a session's name)."""


@dataclass
class Snapshot:
    """A conversation and its K/V (``len(tokens) * token_bytes`` bytes, spec F-SEG-4 layout)."""

    conv: Conversation
    kv: npt.NDArray[np.uint8]
    #: running state saved at checkpoints (hybrid/recurrent models): checkpoint length -> bytes
    states: dict[int, bytes] = field(default_factory=dict)
    pending: int = 0  #: bytes reserved for it in the disk levels while it waits in the outbox


@dataclass(frozen=True, slots=True)
class ParkReport:
    where: Literal["ram", "disk", "discard"]
    floor: str  #: which RAM floor admitted it ("parking", "transient", "none")
    tokens: int  #: tokens kept (0 for a discard)


@dataclass(frozen=True, slots=True)
class Restored:
    source: Literal["ram", "disk", "none"]
    tokens: int
    conv_id: str | None = None
    state: bytes | None = None  #: the running state at ``tokens``, when one was saved there


@dataclass
class _DiskConv:
    conv: Conversation
    segments: list[tuple[int, int, bytes]] = field(default_factory=list)
    session: bool = False
    state_keys: dict[int, bytes] = field(default_factory=dict)  #: checkpoint length -> key


class Tiers:
    def __init__(
        self,
        cfg: StoreConfig,
        fp: ModelFingerprint,
        *,
        probe: Callable[[], int] | None = None,
        legacy_admission: bool = False,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.fp = fp
        self.root = fp.digest()
        self.tb = fp.token_bytes
        self.warn = warn or (lambda msg: print(f"stratastore: {msg}", file=sys.stderr))
        self.admission = Admission(cfg, probe, legacy=legacy_admission)
        self._check_levels()
        # the arena first: an impossible ram_mib fails before any level is opened
        self.arena = (Arena(cfg.ram_mib * MIB + cfg.slots * DEFAULT_CHUNK,
                            setting=f"ram_mib={cfg.ram_mib} (with slots={cfg.slots})")
                      if cfg.ram_mib else None)  # fmt: skip
        self.cold: DiskLevel | None = None
        self.warm: DiskLevel | None = None
        try:
            self.cold = self._level("cold", cfg.cold_dir, cfg.cold_mib, cfg.cold_max_age_s,
                                    Level.COLD, None) if cfg.cold_on else None  # fmt: skip
            self.warm = self._level("warm", cfg.warm_dir, cfg.warm_mib, cfg.warm_max_age_s,
                                    Level.WARM, self.cold) if cfg.warm_on else None  # fmt: skip
        except BaseException:
            if self.cold is not None:
                self.cold.store.close()
            if self.arena is not None:
                self.arena.close()
            raise
        self.write_level = self.warm or self.cold
        last = self.cold or self.warm
        self.manifest_dir = last.store.path if last is not None else None
        self._manifest_mtime = -1
        #: manifest file name -> (its mtime when loaded, its conversation id)
        self._manifest_seen: dict[str, tuple[int | None, str]] = {}
        self.skipped_manifests: list[tuple[str, str]] = []
        for lvl in (self.warm, self.cold):
            if lvl is not None:
                lvl.pinned = self._pinned_keys
        self.ram = ConversationCache(self.root, SizeModel(self.tb),
                                     budget_bytes=cfg.ram_mib * MIB, slots=cfg.slots,
                                     min_tokens=cfg.min_tokens, min_free_bytes=0,
                                     truncate=cfg.park_truncate)  # fmt: skip
        self.ram.on_evict = self._ram_evicted
        self.ram.on_shrink = self._ram_shrunk
        self._allocs: dict[str, Allocation] = {}
        self._states: dict[str, dict[int, bytes]] = {}  #: RAM entries' running states
        self.damaged: list[bytes] = []  #: segment keys a restore found damaged (for fsck)
        self.disk_index = PrefixIndex()
        self._disk: dict[str, _DiskConv] = {}
        self.counters: dict[str, int] = dict.fromkeys(
            ["parks_ram", "parks_disk", "discards", "mirrors", "evict_spills", "hits_ram",
             "hits_disk", "disk_hits_refused", "tokens_restored", "restore_misses",
             "ladder_restores", "spills_refused"], 0)  # fmt: skip
        #: with ``defer_spills`` the disk writes of parks wait in ``outbox`` for the caller (the
        #: Store's spill writer) instead of happening inside ``park``
        self.defer_spills = False
        self.outbox: list[Snapshot] = []
        self.last_refusal = ""  #: why the last disk write was refused (LevelRefused)
        #: outbox snapshots not written yet: bytes reserved for them, and their ids
        self._pending_bytes = 0
        self._pending_ids: dict[str, int] = {}
        self.last_admission = "none yet"
        self.target, self.target_source = self._resolve_target()
        try:
            self.refresh()
        except BaseException:  # a failed open leaves nothing open (LMDB: once per process)
            self.close()
            raise

    def _check_levels(self) -> None:
        """Start-up checks of the disk levels (issue 11 items 8, 9). A level is on only with a
        directory *and* a budget (seed 000: "empty / 0 = off", a level is switched off by its own
        budget); one without the other is said loudly here, never silently absent. One
        directory for both levels is refused: the first move down would lock itself."""
        cfg = self.cfg
        for name, d, mib in (("warm", cfg.warm_dir, cfg.warm_mib),
                             ("cold", cfg.cold_dir, cfg.cold_mib)):  # fmt: skip
            if bool(d) != (mib > 0):
                self.warn(
                    f"the {name} level is OFF: {name}_dir={d!r} with {name}_mib={mib}; a level "
                    f"needs both (set {name}_mib to its budget in MiB, or clear {name}_dir)"
                )
        # realpath resolves symlinks: two names of one directory are one directory (the only
        # filesystem look-up of the policy layer, before anything is opened)
        same = cfg.warm_on and cfg.cold_on and (
            os.path.realpath(cfg.warm_dir) == os.path.realpath(cfg.cold_dir))  # fmt: skip
        if same:
            raise ConfigError(
                f"warm_dir={cfg.warm_dir!r} and cold_dir={cfg.cold_dir!r} are the same directory "
                f"({os.path.realpath(cfg.cold_dir)}); give the warm level a directory of its own "
                "(or clear warm_dir for a cold level only)"
            )

    def _level(self, name: str, path: str, mib: int, age: int, level: Level,
               nxt: DiskLevel | None) -> DiskLevel:  # fmt: skip
        store = SegmentStore.open(path, self.fp, level=level, file_mode=self.cfg.file_mode)
        try:
            return DiskLevel(name, store, mib * MIB, max_age_s=age,
                             when_full=self.cfg.when_full, next_level=nxt)  # fmt: skip
        except BaseException:
            store.close()
            raise

    def _resolve_target(self) -> tuple[Literal["ram", "disk"], str]:
        cfg = self.cfg
        if cfg.park == "ram":
            return "ram", "configured"
        if self.write_level is None:
            self.warn(f"park={cfg.park} needs a disk level (cold_dir and cold_mib); parking "
                      "stays in RAM")  # fmt: skip
            return "ram", "no disk level"
        if cfg.park == "disk":
            return "disk", "configured"
        # a snapshot per slot: a full context when the engine says how long, else a slot's share
        per_slot = (cfg.context_tokens * self.tb if cfg.context_tokens
                    else cfg.ram_mib * MIB // cfg.slots)  # fmt: skip
        need = cfg.slots * per_slot + self.admission.parking_floor
        target: Literal["ram", "disk"] = "disk" if self.admission.probe() < need else "ram"
        self.warn(f"park target auto -> {target}")
        return target, "auto"

    def close(self) -> None:
        for lvl in (self.warm, self.cold):
            if lvl is not None:
                lvl.store.close()
        if self.arena is not None:
            self.arena.close()

    # -- parking ------------------------------------------------------------------------------
    def park(self, snap: Snapshot) -> ParkReport:
        """Place a snapshot: RAM under the parking floor, else disk under the transient floor,
        else discard (counted). The caller must not change ``snap`` afterwards."""
        self._check(snap)
        # retention: at most cfg.checkpoints per conversation, the policy choosing who leaves
        snap.conv.checkpoints = list(snap.conv.checkpoints)
        for gone in enforce_count(snap.conv.checkpoints, self.cfg.checkpoints,
                                  self.cfg.retention):  # fmt: skip
            snap.states.pop(gone.length, None)
        disk = self.write_level is not None
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=self.target == "ram"
                                 and self.arena is not None, disk=disk)  # fmt: skip
        self.last_admission = f"{p.where}/{p.floor}"
        if p.where == "ram" and self._park_ram(snap):
            if self.cfg.spill_on == "park" and disk and self._spill(snap):
                self.counters["mirrors"] += 1
            return ParkReport("ram", p.floor, len(snap.conv.tokens))
        if p.where != "discard" and disk and self._spill(snap):
            self.counters["parks_disk"] += 1
            return ParkReport("disk", p.floor if p.where == "disk" else "parking",
                              len(snap.conv.tokens))  # fmt: skip
        self.counters["discards"] += 1
        return ParkReport("discard", "none", 0)

    def _check(self, snap: Snapshot, call: str = "park") -> None:
        """Refuse, before anything is acknowledged or stored, what could not be written as a
        chain manifest and its segments (spec F-CHAIN-1, F-CHAIN-2): the id (a non-empty string,
        UTF-8 encodable, at most MAX_CONV_ID bytes: the manifest name derives from it, F-CHAIN-4),
        the tokens (at most MAX_TOKENS), checkpoints and cuts ascending within the tokens, at
        most MAX_ITEMS of each, the K/V's size, and the running states. The checkpoints and cuts
        are checked again here because the engine may have changed them after construction."""
        conv = snap.conv
        if not isinstance(conv, Conversation):
            raise InvalidConversation(f"{call}: expected a Conversation, got "
                                      f"{type(conv).__name__}")  # fmt: skip
        cid = conv.conv_id
        if not isinstance(cid, str) or not cid:
            raise InvalidConversation(
                f"{call}: conversation id {cid!r} must be a non-empty string (it names the "
                "conversation's manifest, spec F-CHAIN-4); pass str(id)"
            )
        try:
            size = len(cid.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise InvalidConversation(
                f"{call}: conversation id {cid!r} cannot be encoded as UTF-8 ({e.reason}); use "
                "an id of valid text"
            ) from None
        if size > MAX_CONV_ID:
            raise InvalidConversation(
                f"{call}: conversation id {cid[:32]!r}... is {size:,} bytes in UTF-8, over the "
                f"{MAX_CONV_ID:,}-byte limit of a manifest (spec F-CHAIN-1); use a shorter id "
                "(a hash of it)"
            )
        conv.tokens = as_tokens(conv.tokens, f"{call}: conversation {cid!r}", InvalidConversation)
        n = len(conv.tokens)
        what = f"{call}: conversation {cid!r}"
        if n > MAX_TOKENS:
            raise InvalidConversation(f"{what}: {n:,} tokens is over the {MAX_TOKENS:,} a "
                                      "manifest holds (spec F-CHAIN-1)")  # fmt: skip
        lengths = [c.length for c in conv.checkpoints]
        if (not lengths or lengths != sorted(set(lengths)) or lengths[0] < 0
                or lengths[-1] > n):  # fmt: skip
            raise InvalidConversation(
                f"{what}: checkpoints {lengths[:8]} must ascend, root first, within its {n:,} "
                "tokens"
            )
        cuts = conv.cuts or [0]
        if cuts[0] != 0 or cuts != sorted(set(cuts)) or cuts[-1] > n:
            raise InvalidConversation(
                f"{what}: segment cuts {cuts[:8]} must ascend from 0 and stay within its {n:,} "
                "tokens (a cut is where a segment starts)"
            )
        conv.cuts = list(cuts)
        conv.media = as_media(conv.media, n, f"{what}: media", InvalidConversation)
        bounds = conv.boundaries()
        if max(len(lengths), len(conv.media), len(bounds)) > MAX_ITEMS:
            raise InvalidConversation(f"{what}: over {MAX_ITEMS:,} checkpoints, media or "
                                      "segments (spec F-CHAIN-1); cut it coarser")  # fmt: skip
        longest = max((e - s for s, e in bounds), default=0)
        if -(-longest // self.fp.page_tokens) > MAX_PAGES:
            raise InvalidConversation(
                f"{what}: a segment of {longest:,} tokens is over the {MAX_PAGES:,} pages of "
                f"{self.fp.page_tokens} tokens a sidecar holds (spec F-SC-6); add cuts"
            )
        if snap.kv.nbytes != n * self.tb:
            raise InvalidConversation(
                f"{what}: K/V is {snap.kv.nbytes} bytes, its {n} tokens need {n * self.tb} "
                f"({self.tb} a token for {self.fp.describe()})"
            )
        for length, blob in snap.states.items():
            if (not isinstance(length, int) or not isinstance(blob, (bytes, bytearray, memoryview))
                    or len(blob) > MAX_STATE_BYTES):  # fmt: skip
                raise InvalidConversation(
                    f"{what}: a running state must map a checkpoint length (int) to at most "
                    f"{MAX_STATE_BYTES:,} bytes; got {type(length).__name__} -> "
                    f"{type(blob).__name__}"
                )
        # the view as of the last refresh: the park path stays free of directory scans; the
        # spill writer looks again before it writes (write_disk_now)
        if call == "park" and self._is_session(cid, refresh=False):
            raise InvalidConversation(
                f"{what}: the id is a saved session's name; sessions and conversations share "
                "one namespace (spec F-CHAIN-4): park under another id, or delete_session() it"
            )

    def _is_session(self, name: str, *, refresh: bool = True) -> bool:
        """Whether ``name`` is a saved session's (after a refresh of the manifests' view)."""
        if refresh:
            self.refresh()
        dc = self._disk.get(name)
        return dc is not None and dc.session

    def _is_conversation(self, name: str) -> bool:
        """Whether ``name`` is a parked conversation's id: in RAM, waiting for its disk write,
        or on disk (not a session)."""
        if name in self.ram.entries or name in self._pending_ids:
            return True
        self.refresh()
        dc = self._disk.get(name)
        return dc is not None and not dc.session

    def _park_ram(self, snap: Snapshot) -> bool:
        assert self.arena is not None
        conv_id = snap.conv.conv_id
        if conv_id in self._allocs:
            self._release(conv_id)
        out = self.ram.park(snap.conv)
        if out.parked_tokens is None:
            return False
        nbytes = out.parked_tokens * self.tb
        alloc = self.arena.alloc(nbytes)
        if alloc is None:  # chunk rounding left the arena short: treat as a RAM refusal
            self.ram.take(conv_id)
            return False
        self.arena.write(alloc, snap.kv[:nbytes])
        self._allocs[conv_id] = alloc
        self._states[conv_id] = {n: s for n, s in snap.states.items()
                                 if n <= out.parked_tokens}  # fmt: skip
        self.counters["parks_ram"] += 1
        return True

    def _release(self, conv_id: str) -> None:
        self._states.pop(conv_id, None)
        alloc = self._allocs.pop(conv_id)
        assert self.arena is not None
        self.arena.release(alloc)

    def _ram_evicted(self, conv: Conversation) -> None:
        alloc = self._allocs[conv.conv_id]
        if self.cfg.spill_on == "evict" and self.write_level is not None:
            kv = np.empty(alloc.nbytes, dtype=np.uint8)
            assert self.arena is not None
            self.arena.read_into(alloc, kv)
            if self._spill(Snapshot(conv, kv, dict(self._states.get(conv.conv_id, {})))):
                self.counters["evict_spills"] += 1
        self._release(conv.conv_id)

    def _ram_shrunk(self, conv: Conversation) -> None:
        alloc = self._allocs[conv.conv_id]
        assert self.arena is not None
        keep = len(conv.tokens) * self.tb
        kv = np.empty(keep, dtype=np.uint8)
        self.arena.read_into(alloc, kv, keep)
        self.arena.release(alloc)
        new = self.arena.alloc(keep)
        assert new is not None  # a shrink only frees chunks
        self.arena.write(new, kv)
        self._allocs[conv.conv_id] = new
        states = self._states.get(conv.conv_id, {})
        self._states[conv.conv_id] = {n: s for n, s in states.items() if n <= len(conv.tokens)}

    def _spill(self, snap: Snapshot) -> bool:
        """Write ``snap`` to disk, or with ``defer_spills`` hand it to the spill writer. A
        deferred write is checked first against what the levels can take, so that a park the
        disk is certain to refuse is reported a discard now rather than ``disk`` (issue 11
        item 9); what the check cannot foresee is reported by the writer (write_disk_now)."""
        if not self.defer_spills:
            return self._write_disk(snap)
        need = self._refusal(snap)
        if isinstance(need, str):
            self.counters["spills_refused"] += 1
            self.warn(f"conversation {snap.conv.conv_id} not written to disk: {need}")
            return False
        snap.pending = need
        self._pending_bytes += need
        self._pending_ids[snap.conv.conv_id] = self._pending_ids.get(snap.conv.conv_id, 0) + 1
        self.outbox.append(snap)
        return True

    def _refusal(self, snap: Snapshot) -> int | str:
        """The bytes ``snap`` will take in the disk levels, or why they will refuse it: a
        segment larger than the write level's whole budget (any ``when_full``), or, with
        ``when_full=reject``, more than the levels have free beside the writes already
        waiting (the warm level degrades into the cold one, which rejects when full). The
        same per-entry sizes as the writer's ``make_room`` calls."""
        level = self.write_level
        assert level is not None
        tb = self.tb
        largest = max((e - s for s, e in snap.conv.boundaries()), default=0) * tb + 8192
        if largest > level.budget:
            return (f"{level.name} level: a segment of {largest:,} bytes is larger than its whole "
                    f"budget ({level.budget:,} bytes); raise {level.name}_mib")  # fmt: skip
        states = sum(8192 + len(b) for b in snap.states.values() if b)
        if self.cfg.when_full != "reject":
            return snap.kv.nbytes + states  # an upper bound; the last level makes room
        need = states + sum(8192 + (e - s) * tb for s, e, k in snap.conv.segments(self.root)
                            if self._holder(k) is None)  # fmt: skip
        free = -self._pending_bytes
        lvl: DiskLevel | None = level
        while lvl is not None:
            free += max(0, lvl.budget - lvl.used())
            lvl = lvl.next
        if need > free:
            return (f"the disk levels are full ({need:,} bytes needed, {max(free, 0):,} free "
                    "beside the writes waiting) and when_full=reject; raise their budget or set "
                    "when_full=evict")  # fmt: skip
        return need

    def take_outbox(self) -> list[Snapshot]:
        out, self.outbox = self.outbox, []
        return out

    def write_disk_now(self, snap: Snapshot) -> None:
        """Write a snapshot to disk at once (what the Store's spill writer calls). A write the
        disk level refuses is the capture lost after all: it counts as a discard and a refused
        spill, and raises :class:`SpillRefused` (the Store reports it to ``flush``/``close``);
        an I/O error propagates as it is. A park whose id became a saved session's name (in
        another process) since it was acknowledged is refused the same way, so that it never
        replaces the session's manifest (spec F-CHAIN-4)."""
        cid = snap.conv.conv_id
        try:
            if self._is_session(cid):
                why = (f"its id {cid!r} is now a saved session's name (sessions and "
                       "conversations share one namespace); the session is kept")  # fmt: skip
            elif self._write_disk(snap):
                return
            else:
                why = self.last_refusal or "the disk level refused it"
        finally:
            self._pending_bytes = max(0, self._pending_bytes - snap.pending)
            snap.pending = 0
            left = self._pending_ids.get(cid, 0) - 1
            if left > 0:
                self._pending_ids[cid] = left
            else:
                self._pending_ids.pop(cid, None)
        self.counters["discards"] += 1
        self.counters["spills_refused"] += 1
        raise SpillRefused(f"conversation {cid!r} was not written to disk: {why}")

    def _write_disk(self, snap: Snapshot, *, session: bool = False) -> bool:
        """Write the snapshot's segments into the write level, then its manifest (the commit
        record, spec F-CHAIN-3), then run the cascade.

        Keys, sidecars and the manifest come from one derivation (``conv.segment_keys``): each
        segment is put with its own media, so its sidecar carries them and it is filed under
        the key the manifest names (spec F-KEY-2, F-KEY-7, F-CHAIN-2)."""
        level = self.write_level
        assert level is not None
        conv = snap.conv
        specs = conv.segment_keys(self.root)
        segments = [(s.start, s.end, s.key) for s in specs]
        try:
            for i, seg in enumerate(specs):
                if self._holder(seg.key) is None:
                    level.make_room(4096 + (seg.end - seg.start) * self.tb + 4096)
                    put = level.store.put_kv(seg.parent, conv.tokens[seg.start : seg.end],
                                             snap.kv[seg.start * self.tb : seg.end * self.tb],
                                             token_start=seg.start, media=seg.media)  # fmt: skip
                    if put.key != seg.key:  # one derivation: a difference is a bug, never data
                        raise KeyMismatch(f"conversation {conv.conv_id}",
                                          f"segment {i} (tokens [{seg.start}, {seg.end}))",
                                          seg.key, put.key)  # fmt: skip
            ends = {end: key for _, end, key in segments}
            state_keys = {}
            for length, blob in sorted(snap.states.items()):
                if length not in ends or not blob:
                    continue  # a state belongs at a checkpoint (a segment boundary)
                level.make_room(2 * 4096 + len(blob))
                state_keys[length] = level.store.put_state(ends[length], blob,
                                                           token_pos=length).key  # fmt: skip
        except LevelRefused as e:
            self.last_refusal = str(e)
            self.warn(f"conversation {conv.conv_id} not written to disk: {e}")
            return False
        copy = Conversation(conv.conv_id, conv.tokens.copy(), list(conv.checkpoints),
                            dict(conv.media), list(conv.cuts))  # fmt: skip
        manifest = ChainManifest(
            conv.conv_id, self.root, copy.tokens,
            tuple(ManifestCheckpoint(c.length, c.pinned, c.tail, state_keys.get(c.length))
                  for c in copy.checkpoints),
            tuple(sorted(copy.media.items())), tuple(segments), time.time_ns(), session,
        )  # fmt: skip
        assert self.manifest_dir is not None
        name = chain_name(conv.conv_id)
        path = os.path.join(self.manifest_dir, name)
        durable_write(path, encode_manifest(manifest), mode=self.cfg.file_mode)  # F-DIR-9
        self._remember(_DiskConv(copy, segments, session, state_keys))
        self._manifest_seen[name] = (files.mtime_ns(path), conv.conv_id)
        self._collect()
        return True

    def _remember(self, dc: _DiskConv) -> None:
        if dc.conv.conv_id in self._disk:
            self._forget(dc.conv.conv_id)
        self._disk[dc.conv.conv_id] = dc
        self.disk_index.add(self.root, dc.conv)

    def _forget(self, conv_id: str) -> None:
        self._disk.pop(conv_id)
        self.disk_index.remove(conv_id)
        self._manifest_seen.pop(chain_name(conv_id), None)

    def _pinned_keys(self) -> set[bytes]:
        """Keys capacity GC leaves alone: every segment of a saved session, and the segments up
        to a pinned checkpoint (the system-prompt cache: a root shared by many conversations is
        stored once and kept)."""
        keys = set()
        for dc in self._disk.values():
            pinned_to = max((c.length for c in dc.conv.checkpoints if c.pinned), default=0)
            for _, end, k in dc.segments:
                if dc.session or end <= pinned_to:
                    keys.add(k)
        return keys

    def _collect(self) -> None:
        """The capacity GC of every level, then drop the manifests of conversations whose first
        segment is gone (nothing of them can be restored any more)."""
        for lvl in (self.warm, self.cold):
            if lvl is not None:
                lvl.enforce_budget()
                lvl.enforce_age()
        for conv_id, dc in list(self._disk.items()):
            if dc.segments and self._holder(dc.segments[0][2]) is None:
                self._forget(conv_id)
                assert self.manifest_dir is not None
                guard.remove_store_file(os.path.join(self.manifest_dir, chain_name(conv_id)),
                                        missing_ok=True)  # fmt: skip

    def refresh(self) -> None:
        """Catch up with the manifests another process wrote, replaced (a conversation parked
        again) or removed (its segments gone) since the last look."""
        if self.manifest_dir is None:
            return
        mtime = files.mtime_ns(self.manifest_dir)
        # directory timestamps are coarse (a few ms): an entry added within the same tick as
        # the last look leaves the time unchanged, so a recent time is always looked at again
        if mtime == self._manifest_mtime and time.time_ns() - mtime > 2_000_000_000:
            return
        self._manifest_mtime = mtime
        names = {n for n in files.listdir(self.manifest_dir) if is_chain_name(n)}
        for name in set(self._manifest_seen) - names:  # removed elsewhere
            conv_id = self._manifest_seen.pop(name)[1]
            if conv_id in self._disk:
                self._forget(conv_id)
        for name in sorted(names):
            path = os.path.join(self.manifest_dir, name)
            try:
                stamp = files.mtime_ns(path)
            except StrataIOError:
                continue  # removed while we looked
            if self._manifest_seen.get(name, (None, ""))[0] == stamp:
                continue
            self._load_manifest(name, path, stamp)

    def _load_manifest(self, name: str, path: str, stamp: int) -> None:
        """Index the conversation a manifest commits, or refuse the manifest: one that does
        not decode (F-CHAIN-1, F-CHAIN-2), was written for another model (F-FP-5), sits
        under another conversation's file name (F-CHAIN-4), or whose segment keys are not its
        own tokens' and media's (F-CHAIN-2) is listed in ``skipped_manifests`` and never
        served; what the file held before is forgotten."""
        try:
            m = decode_manifest(files.read_file(path, MAX_MANIFEST_BYTES), name)
        except (FormatError, ChecksumMismatch, StrataIOError) as e:
            self._refuse_manifest(name, stamp, str(e))
            return
        if m.model != self.root:
            self._refuse_manifest(name, stamp, "written for another model")
            return
        if name != chain_name(m.conv_id):  # a copy under another's name would replace it
            self._refuse_manifest(name, stamp, f"holds conversation {m.conv_id!r}, whose file "
                                  f"is {chain_name(m.conv_id)} (F-CHAIN-4)")  # fmt: skip
            return
        try:  # keys that are not its tokens' would serve another prefix's K/V (F-CHAIN-2)
            verify_manifest_keys(m, self.root, name)
        except KeyMismatch as e:
            self._refuse_manifest(name, stamp, str(e))
            self.warn(str(e))
            return
        conv = Conversation(m.conv_id, m.tokens,
                            [Checkpoint(c.length, pinned=c.pinned, tail=c.tail)
                             for c in m.checkpoints] or [Checkpoint(0)],
                            dict(m.media), [s for s, _, _ in m.segments] or [0])  # fmt: skip
        keys = {c.length: c.state_key for c in m.checkpoints if c.state_key}
        self._remember(_DiskConv(conv, list(m.segments), m.session, keys))
        self._manifest_seen[name] = (stamp, m.conv_id)

    def _refuse_manifest(self, name: str, stamp: int, why: str) -> None:
        previous = self._manifest_seen.get(name, (None, ""))[1]
        if previous in self._disk:  # the file was replaced: its old conversation is gone
            self._forget(previous)
        self._manifest_seen[name] = (stamp, "")
        self.skipped_manifests.append((name, why))

    # -- lookup and restore -------------------------------------------------------------------
    def lookup(self, prompt: npt.NDArray[np.integer] | list[int],
               media: Mapping[int, bytes] | None = None) -> tuple[str, Match] | None:  # fmt: skip
        """The deepest resume point for ``prompt`` (with ``media``: position -> digest of each
        picture in it; a stored prefix matches only where its pictures match too, spec
        F-KEY-4): ``("ram" | "disk", match)``."""
        self.refresh()
        page = self.fp.page_tokens if self.cfg.page_resume else None
        best: tuple[str, Match] | None = None
        for source, index in (("ram", self.ram.index), ("disk", self.disk_index)):
            m = index.lookup(self.root, prompt, media, page_tokens=page)
            if m is not None and (best is None or m.length > best[1].length):
                best = (source, m)
        return best

    def restore(self, prompt: npt.NDArray[np.integer] | list[int],
                out: npt.NDArray[np.uint8] | Destination,
                media: Mapping[int, bytes] | None = None) -> Restored:  # fmt: skip
        """Restore the deepest stored prefix of ``prompt`` (and its ``media``, as in
        :meth:`lookup`) into ``out``: a flat buffer in the stored page layout (at least
        ``len(prompt) * token_bytes``) or a :class:`~stratastore.restore.Destination`; returns
        how many tokens it holds now."""
        got = self.restore_many([(prompt, out)], [media])[0]
        if isinstance(got, Exception):
            raise got
        return got

    def restore_many(
        self, requests: Sequence[tuple[npt.NDArray[np.integer] | list[int],
                                       npt.NDArray[np.uint8] | Destination]],
        media: Sequence[Mapping[int, bytes] | None] = (),
    ) -> list[Restored | Exception]:  # fmt: skip
        """:meth:`restore` for several prompts at once, each into its own destination: the
        lookups and RAM hits run in order, then the disk hits share one batched read agenda
        (:mod:`stratastore.restore.agenda`). Returns, per request, its :class:`Restored` or the
        error that request alone raised. A destination too small, or one that cannot be written
        in place, raises :class:`~stratastore.restore.DestinationRefused` before anything runs.
        ``media[i]``, when given, is request ``i``'s pictures (see :meth:`lookup`)."""
        dests = []
        for i, (prompt, out) in enumerate(requests):
            what = "out" if len(requests) == 1 else f"out #{i}"
            dest = as_destination(self.fp, out, what)  # refused here, before any lookup or take
            if dest.capacity() < len(prompt):
                raise DestinationRefused(
                    f"restore: the destination holds {dest.capacity():,} tokens ({what}); a prompt "
                    f"of {len(prompt):,} tokens needs room for all of them "
                    f"({len(prompt) * self.tb:,} bytes, {self.tb} a token); pass one that large"
                )
            dests.append(dest)
        results: list[Restored | Exception | None] = [None] * len(requests)
        pending: list[tuple[int, _DiskConv, Job]] = []
        for i, ((prompt, _), dest) in enumerate(zip(requests, dests, strict=True)):
            hit = self.lookup(prompt, media[i] if i < len(media) else None)
            if hit is None:
                self.counters["restore_misses"] += 1
                results[i] = Restored("none", 0)
                continue
            source, m = hit
            if source == "ram":
                results[i] = self._restore_ram(m, dest)
                continue
            p: Placement = self.admission.admit(m.length * self.tb, stays_in_ram=False,
                                                disk=True)  # fmt: skip
            if p.where == "discard":
                self.counters["disk_hits_refused"] += 1
                results[i] = Restored("none", 0)
                continue
            dc = self._disk[m.conv_id]
            pending.append((i, dc, self._disk_job(dc, m.length, dest)))
        outcomes = restore_batch([job for _, _, job in pending])
        for (i, dc, job), o in zip(pending, outcomes, strict=True):
            results[i] = o if isinstance(o, Exception) else self._disk_restored(dc, job, o)
        return [r if r is not None else RuntimeError("restore request did not run")
                for r in results]  # fmt: skip

    def _restore_ram(self, m: Match, dest: Destination) -> Restored:
        self._read_ram(m.conv_id, m.length, dest)
        state = self._states.get(m.conv_id, {}).get(m.length)
        if m.length == len(self.ram.entries[m.conv_id].conv.tokens):
            # the prompt continues that very conversation: it is mounted live, so the RAM
            # copy is the slot's now; a prefix shared with another one leaves it in place
            self.ram.take(m.conv_id)
            self._release(m.conv_id)
        self.counters["hits_ram"] += 1
        self.counters["tokens_restored"] += m.length
        return Restored("ram", m.length, m.conv_id, state)

    def _read_ram(self, conv_id: str, length: int, dest: Destination) -> None:
        """Copy ``[0, length)`` of a RAM entry (stored page layout) into ``dest``."""
        alloc = self._allocs[conv_id]
        assert self.arena is not None
        if isinstance(dest, FlatKV):
            self.arena.read_into(alloc, dest.buf, length * self.tb)
            return
        kv = np.empty(length * self.tb, dtype=np.uint8)
        self.arena.read_into(alloc, kv, length * self.tb)
        for start, end in self.ram.entries[conv_id].conv.boundaries():  # no need to hash keys
            if start >= length:
                break
            end = min(end, length)
            dest.write_pages(start, end - start, kv[start * self.tb : end * self.tb],
                             self.fp.page_tokens)  # fmt: skip

    def _state_at_or_below(self, dc: _DiskConv, limit: int) -> tuple[int, bytes | None]:
        """The deepest checkpoint at or below ``limit`` whose saved state reads back valid."""
        for length in sorted(dc.state_keys, reverse=True):
            if length > limit:
                continue
            key = dc.state_keys[length]
            store = self._holder(key)
            if store is None:
                continue
            try:
                blob = store.get_bytes(key, max_bytes=MAX_STATE_BYTES)
            except StrataError:
                continue
            return length, blob
        return 0, None

    def _disk_job(self, dc: _DiskConv, length: int, dest: Destination) -> Job:
        """The two-pass restore of ``[0, length)`` (spec F-SC-3): validate every page first,
        then apply; on damage the ladder applies the deepest resume point below it."""
        pieces = [Piece(s, e, k, self._holder(k)) for s, e, k in dc.segments if s < length]
        return Job(pieces, length, dest, self.fp, self._ladder_point(dc), self.cfg.ladder,
                   self.cfg.restore_chunk_mib * MIB)  # fmt: skip

    def _read_disk(self, dc: _DiskConv, length: int, dest: Destination) -> int:
        """Run one disk job now; the tokens it left in ``dest``, all validated."""
        job = self._disk_job(dc, length, dest)
        out = restore_batch([job])[0]
        if isinstance(out, Exception):
            raise out
        self._account_read(dc, job, out)
        return out.tokens

    def _disk_restored(self, dc: _DiskConv, job: Job, out: Outcome) -> Restored:
        """Account a finished disk restore of a prompt, and find its running state."""
        self._account_read(dc, job, out)
        got, state = out.tokens, None
        if dc.state_keys:  # a hybrid model resumes only where a readable state was saved
            got, state = self._state_at_or_below(dc, got)
        self.counters["hits_disk"] += 1
        self.counters["tokens_restored"] += got
        return Restored("disk", got, dc.conv.conv_id, state)

    def _account_read(self, dc: _DiskConv, job: Job, out: Outcome) -> None:
        """Level hits, and the ladder: count it, warn, remember the damaged keys for fsck."""
        for lvl in (self.warm, self.cold):  # a level counts a hit for each restore it served
            if lvl is not None and any(p.store is lvl.store and p.start < out.tokens
                                       for p in job.pieces):  # fmt: skip
                lvl.counters.hits += 1
        if out.laddered:
            self.counters["ladder_restores"] += 1
            self.damaged.extend(k for k in out.damaged if k not in self.damaged)
            self.warn(f"conversation {dc.conv.conv_id}: restored {out.tokens:,} of "
                      f"{out.wanted:,} tokens: {out.reason}")  # fmt: skip

    def _ladder_point(self, dc: _DiskConv) -> Callable[[int], int]:
        """The deepest point a restore may stop at below damage at token ``bad``: a whole page
        for attention-only layouts (``page_resume``), else the deepest checkpoint."""

        def resume_at(bad: int) -> int:
            ckpt = max((c.length for c in dc.conv.checkpoints if c.length <= bad), default=0)
            if self.cfg.page_resume:
                return max(ckpt, dc.conv.page_floor(bad, self.fp.page_tokens))
            return ckpt

        return resume_at

    # -- sessions (explicit save/load: never removed by capacity GC) --------------------------
    def save_session(self, snap: Snapshot) -> None:
        """Write ``snap`` to disk as a named session (its conv_id is the name). Session names
        and conversation ids share one namespace, the manifest name (spec F-CHAIN-4): the id of
        a parked conversation (in RAM, waiting for its disk write, or on disk) is refused, as
        :meth:`park` refuses a session's name, so neither can replace the other."""
        self._check(snap, "save_session")
        if self._is_conversation(snap.conv.conv_id):
            raise InvalidConversation(
                f"save_session: {snap.conv.conv_id!r} is the id of a parked conversation; "
                "sessions and conversations share one namespace (spec F-CHAIN-4): save the "
                "session under another name"
            )
        p = self.admission.admit(snap.kv.nbytes, stays_in_ram=False, disk=True)
        if self.write_level is None or p.where == "discard":
            raise StrataError(
                f"session {snap.conv.conv_id} cannot be saved: "
                + ("no disk level is configured (set cold_dir and cold_mib)"
                   if self.write_level is None else p.describe())
            )  # fmt: skip
        if not self._write_disk(snap, session=True):
            raise StrataError(f"session {snap.conv.conv_id}: the disk level refused it")

    def load_session(self, name: str, out: npt.NDArray[np.uint8]) -> Conversation:
        """Restore a saved session into ``out``; its conversation (tokens, checkpoints). An
        ``out`` that cannot be written in place is refused before anything else runs."""
        dest = FlatKV(self.fp, out, read_direct=True)
        self.refresh()
        dc = self._disk.get(name)
        if dc is None or not dc.session:
            raise StrataError(f"no saved session named {name!r}; save_session() writes one")
        n = len(dc.conv.tokens)
        if out.nbytes < n * self.tb:
            raise DestinationRefused(
                f"session {name!r} needs {n * self.tb:,} bytes ({n:,} tokens), out has "
                f"{out.nbytes:,}; pass a buffer that large"
            )
        p = self.admission.admit(n * self.tb, stays_in_ram=False, disk=True)
        if p.where == "discard":
            raise StrataError(f"session {name!r} cannot be restored now: {p.describe()}")
        got = self._read_disk(dc, n, dest)
        if got < n:
            raise StrataError(f"session {name!r}: only {got} of {n} tokens are readable")
        return dc.conv

    def delete_session(self, name: str) -> bool:
        dc = self._disk.get(name)
        if dc is None or not dc.session:
            return False
        self._forget(name)
        assert self.manifest_dir is not None
        guard.remove_store_file(os.path.join(self.manifest_dir, chain_name(name)),
                                missing_ok=True)  # fmt: skip
        self._collect()
        return True

    def _holder(self, key: bytes) -> SegmentStore | None:
        for lvl in (self.warm, self.cold):
            if lvl is not None and key in lvl.store:
                return lvl.store
        return None

    # -- state --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        levels: dict[str, Any] = {
            "ram": {"entries": len(self.ram.entries), "bytes": self.ram.used,
                    "budget": self.ram.budget, **self.ram.counters},
        }  # fmt: skip
        for lvl in (self.warm, self.cold):
            if lvl is not None:
                st = lvl.store.stats()
                levels[lvl.name] = {"dir": lvl.store.path, "entries": st.entries,
                                    "bytes": st.disk_bytes, "budget": lvl.budget,
                                    **lvl.counters.as_dict()}  # fmt: skip
        held = sum(len(e.conv.tokens) for e in self.ram.entries.values())
        held += sum(len(dc.conv.tokens) for dc in self._disk.values())
        return {"park_target": self.target, "park_target_source": self.target_source,
                **self.counters, "held_tokens": held, "admission": self.last_admission,
                "damaged_segments": [k.hex() for k in self.damaged],
                "unreadable_manifests": [n for n, _ in self.skipped_manifests],
                "free_ram": self.admission.probe(), "levels": levels}  # fmt: skip
