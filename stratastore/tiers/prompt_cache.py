"""The system-prompt cache: the pinned prefixes that many conversations share, kept on disk in a
folder and a budget of their own.

A conversation's pinned checkpoints (its root, the end of the system prompt, and whatever else
the engine pins) mark prefixes that other conversations start with too. Each park copies the
deepest pinned prefix of its capture here, once per distinct prefix (``prompt_cache_dir`` and
``prompt_cache_mib``; off when either is empty or 0, like every level), so a new conversation
with the same system prompt restores it even when nothing else holds it: its parks were
discarded under a low-RAM window, or the conversation levels' GC removed them. The folder is a
store of its own (its segments, sidecars, chain manifests and catalog, spec F-DIR): the
conversation levels' cascade and GC never touch it, and its own budget removes its oldest
entry first, whole. ``strata fsck DIR`` checks it as the store it is.

Its hits are a restore source (:class:`PromptCacheSource`) after the disk levels, read and
validated as a disk hit is (spec F-SC-3, the ladder on damage), admitted as a disk-bound read
under the transient floor when the parking floor does not hold (``system-prompt-cache hit under
the transient RAM floor ...``), and counted as its own (``hits_prompt_cache``,
``prompt_cache_hits_refused``; its folder, budget, entries and bytes in ``Store.stats()``'s
``levels["prompt_cache"]``, the INFO line, the monitor and Prometheus).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from stratastore.catalog import Catalog
from stratastore.catalog.gc import Collector
from stratastore.chain import Checkpoint, Conversation, Match
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError, StrataError
from stratastore.format import Level, ModelFingerprint
from stratastore.io import files, pathnames
from stratastore.levels.backend import SegmentBackend
from stratastore.levels.cascade import DiskLevel
from stratastore.levels.registry import open_level, scheme_of
from stratastore.metrics.counts import Counts
from stratastore.metrics.logs import Voice
from stratastore.restore import Outcome
from stratastore.tiers.admission import MIB, Admission
from stratastore.tiers.disk_read import DiskReader
from stratastore.tiers.levels import attach_catalog
from stratastore.tiers.lookup import Read, SourceName
from stratastore.tiers.records import Restored, Snapshot
from stratastore.tiers.sources import DiskSource, removed_by_gc
from stratastore.tiers.view import DiskView
from stratastore.tiers.writer import DiskWriter

__all__ = ["NAME", "PromptCache", "PromptCacheSource", "open_prompt_cache"]

#: the cache's name in ``Store.stats()["levels"]``, the INFO line, the monitor and Prometheus
NAME = "prompt_cache"
#: the conversation id an entry is filed under: this prefix and the prefix's segment key
ENTRY_PREFIX = "system-prompt-"


def _local(path: str) -> str:
    """A local folder's path as given, or as a ``file://`` URL gives it."""
    return path[len("file://") :] if path.lower().startswith("file://") else path


def open_prompt_cache(
    cfg: StoreConfig, fp: ModelFingerprint, warn: Callable[[str], None]
) -> PromptCache | None:
    """The system-prompt cache of ``cfg``, or ``None`` when it is off (``prompt_cache_dir``
    empty or ``prompt_cache_mib`` 0; one without the other is said, as for a level). Its
    directory must not be a disk level's (each is a store of its own), and its parent must
    exist unless ``create_dirs``."""
    d, mib = cfg.prompt_cache_dir, cfg.prompt_cache_mib
    if bool(d) != (mib > 0):
        warn(
            f"the system-prompt cache is OFF: prompt_cache_dir={d!r} with prompt_cache_mib="
            f"{mib}; it needs both (set its budget in MiB, or clear its directory)"
        )
        return None
    if not d:
        return None
    scheme = scheme_of(d)
    if scheme not in ("", "file"):  # named by its scheme alone: a URL may carry a credential
        raise ConfigError(
            f"prompt_cache_dir names {scheme}://...: the system-prompt cache is a local folder; "
            "give a directory path"
        )
    d = _local(d)
    real = files.realpath(d)
    for spec in cfg.disk_levels():
        if not spec.dir:
            continue
        other = files.realpath(_local(spec.dir))
        if pathnames.commonpath([real, other]) in (real, other):
            raise ConfigError(
                f"prompt_cache_dir={d!r} and the {spec.name} level's directory "
                f"{spec.dir!r} are one inside the other (or the same); give the system-prompt "
                "cache a directory of its own, apart from every level (it is a store of its own)"
            )
    if not cfg.create_dirs and (parent := files.missing_parent(d)) is not None:
        raise ConfigError(
            f"prompt_cache_dir={d!r}: its parent directory {parent} does not exist (a disk "
            f"not mounted, or a typo); mount or create {parent}, correct the setting, or set "
            "create_dirs = true to make the missing directories"
        )
    store = open_level(d, fp, Level.COLD, {"file_mode": cfg.file_mode})
    try:
        level = DiskLevel(NAME, store, mib * MIB, when_full="evict")
        catalog, gc, writer, _ = attach_catalog(
            [level],
            fp.digest(),
            fp.token_bytes,
            store.path,
            cfg.file_mode,
            lambda line: warn(f"system-prompt cache: {line}"),
        )
    except BaseException:
        store.close()
        raise
    return PromptCache(cfg, fp, level, catalog, gc, writer, warn)


class PromptCache:
    """The system-prompt cache (see the module): :meth:`fill` from a park, :meth:`source` for
    the restore flow, :meth:`stats` for ``Store.stats()``. The flow's lock guards its
    bookkeeping; :meth:`fill` writes without it."""

    def __init__(
        self,
        cfg: StoreConfig,
        fp: ModelFingerprint,
        level: DiskLevel,
        catalog: Catalog,
        gc: Collector,
        writer: DiskWriter,
        warn: Callable[[str], None],
    ) -> None:
        self.cfg, self.fp, self.level, self.catalog, self.gc = cfg, fp, level, catalog, gc
        self.writer, self.warn = writer, warn
        self.root = fp.digest()
        self.view = DiskView(catalog, self.root)
        #: its own counters (the counter table's rows it keeps); the ladder's are the flow's
        self.counters = Counts("prompt cache")
        self.filling: set[str] = set()  #: entries a park is writing now
        self.refused: set[str] = set()  #: entries larger than the budget (said once)
        #: segments a restore found damaged: dropped before the next fill rewrites them
        self.damaged: set[bytes] = set()

    @property
    def path(self) -> str:
        return self.level.store.path

    def holder(self, key: bytes) -> SegmentBackend | None:
        return self.level.store if key in self.level.store else None

    def close(self) -> None:
        self.level.store.close()

    def entry(self, snap: Snapshot) -> Snapshot | None:
        """The entry ``snap`` fills, or ``None``: its deepest pinned prefix (a pinned
        checkpoint past 0; for a capture with running states, a hybrid model, the deepest with
        a state, as a hybrid model resumes only there), when the cache does not hold it whole
        and undamaged already, no other park is writing it, and it fits the cache's budget.
        Under the flow's lock; the capture's layout is final (retention has cut it)."""
        conv = snap.conv
        pinned = [c.length for c in conv.checkpoints if c.pinned and c.length > 0]
        if snap.states:
            pinned = [n for n in pinned if n in snap.states]
        n = max(pinned, default=0)
        if n == 0:
            return None
        self.view.sync()
        media = {p: d for p, d in conv.media.items() if p < n}
        held = self.view.lookup(conv.tokens[:n], media, None)
        if held is not None and held.length >= n and not self._damaged(held.conv_id):
            return None
        key = conv.checkpoint_keys(self.root)[n]
        cid = ENTRY_PREFIX + key.hex()[:32]
        if cid in self.filling or cid in self.refused:
            return None
        nbytes = n * self.fp.token_bytes + sum(len(b) for b in snap.states.values())
        if nbytes > self.level.budget:
            self.refused.add(cid)  # said once
            self.counters["prompt_cache_fill_errors"] += 1
            self.warn(
                f"system-prompt cache: a pinned prefix of {n:,} tokens ({nbytes:,} bytes) is "
                f"larger than its whole budget ({self.level.budget:,} bytes); raise "
                "prompt_cache_mib to keep it"
            )
            return None
        self.filling.add(cid)
        prefix = Conversation(
            cid,
            conv.tokens[:n].copy(),
            [Checkpoint(n)],  # not pinned: the cache's own budget may remove it whole
            media,
            [c for c in conv.cuts if c < n] or [0],
        )
        states = {n: snap.states[n]} if n in snap.states else {}
        hashes = {seg: h for seg, h in snap.page_hashes.items() if seg[1] <= n}
        kv = snap.kv[: n * self.fp.token_bytes]
        return Snapshot(prefix, kv, states, page_hashes=hashes)

    def _damaged(self, cid: str) -> bool:
        """Whether entry ``cid`` names a segment a restore found damaged."""
        dc = self.view.get(cid)
        return dc is not None and any(k in self.damaged for _, _, k in dc.segments)

    def fill(self, entry: Snapshot, lock: AbstractContextManager[Any]) -> bool:
        """Write ``entry`` (of :meth:`entry`) down and hold the budget (I/O: without the flow's
        ``lock``, taken only for the bookkeeping); the damaged segments a restore found go
        first (the chains naming them are cut, then they are deleted), so the entry is written
        whole again. A write that fails is said and counted, never raised: the park it came
        from stands."""
        try:
            with lock:
                damaged, self.damaged = self.damaged, set()
            for key in damaged:
                self.level.discard(key)
            done = self.writer.write(entry)
            self.level.enforce_budget()
        except StrataError as e:
            done = False
            self.warn(f"system-prompt cache: {entry.conv.conv_id} not written: {e}")
        finally:
            with lock:
                self.filling.discard(entry.conv.conv_id)
        with lock:
            self.counters["prompt_cache_fills" if done else "prompt_cache_fill_errors"] += 1
        return done

    def stats(self) -> dict[str, object]:
        """Its table of ``Store.stats()["levels"]``."""
        return {
            "dir": self.path,
            "entries": len(self.level.store),
            "bytes": self.level.store.used(),
            "budget": self.level.budget,
            "evictions": self.level.counters.disk_evictions,
        }

    def source(self, admission: Admission, warn: Voice) -> PromptCacheSource:
        """Its restore source, reading through a disk reader of its own (whose counts are the
        flow's figures of these reads: tokens restored, misses, the ladder's)."""
        reader = DiskReader(self.cfg, self.fp, [self.level], self.holder, warn)
        return PromptCacheSource(self, reader, admission, warn)


class PromptCacheSource(DiskSource):
    """The system-prompt cache as a restore source: read as a disk hit is (its own folder,
    catalog view and reader, whole entries: no page resume), with its own counters."""

    name: SourceName = "prompt_cache"
    hit_name = "system-prompt-cache hit"

    def __init__(
        self, cache: PromptCache, reader: DiskReader, admission: Admission, warn: Voice
    ) -> None:
        super().__init__(
            cache.view, reader, admission, cache.fp.token_bytes, None, cache.holder, warn
        )
        self.cache = cache
        self.counts = reader.counts  #: the flow's counts of its reads (its own: ``cache``'s)

    def subject(self, m: Match) -> str:
        return f"{m.length:,} tokens of a system prompt"

    def refused(self) -> None:
        self.cache.counters["prompt_cache_hits_refused"] += 1

    def settle(
        self, read: Read, outcome: Outcome, found: Restored, asked: str
    ) -> tuple[Restored, list[bytes]]:
        """Level hits and the ladder (as a disk read), then its own hit; a read that
        delivered nothing (damage in its first page) is a miss. The damaged segments are
        dropped before the next park of the prefix writes it again (:meth:`PromptCache.fill`)."""
        removed = removed_by_gc(self.cache.view, self.cache.holder, read.dc)
        self.reader.account(read.dc, read.job, outcome, removed)
        self.cache.damaged.update(k for k in outcome.damaged if self.cache.holder(k))
        if found.tokens == 0:
            self.counts["restore_misses"] += 1
            return Restored("none", 0), []
        self.cache.counters["hits_prompt_cache"] += 1
        self.counts["tokens_restored"] += found.tokens
        return replace(found, source="prompt_cache"), []
