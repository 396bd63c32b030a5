"""The ``Store``: the library API an inference engine links.

An engine calls :meth:`Store.park` when a slot is reused, :meth:`Store.restore` when a prompt
arrives (the deepest stored prefix into its K/V buffer, every disk page validated), and
:meth:`Store.save_session` / :meth:`Store.load_session` for explicit saves that capacity GC
never removes. Every method is thread-safe: the flow's one lock guards this process's state, and
no call holds it over disk I/O or hashing (a park takes it once, a restore twice). Disk writes
of parks go through the write queue's background thread (:mod:`stratastore.tiers.write_queue`),
so a park returns once the capture is handed over (a park given in the engine's own layout is
written within the call instead), and :meth:`close` flushes it. Every call passes a gate that
:meth:`close` shuts and waits on (:mod:`stratastore.tiers.calls`). Several processes may open
the same directories.

Errors belong to the call that caused them (DESIGN invariants): a background disk write that
fails is counted (``spill_errors``) and raised as a :class:`SpillError` by the next
:meth:`Store.flush` or :meth:`Store.close`, never by an unrelated ``lookup``/``restore``, which
never wait for a pending write (a park in flight is served from its capture in memory,
``Restored.source == "pending"``). A park is validated before it is acknowledged
(:class:`~stratastore.tiers.tiered.InvalidConversation`); every call on a closed store raises
:class:`StoreClosed`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from stratastore.chain import Checkpoint, Conversation, as_media, as_tokens
from stratastore.config import StoreConfig
from stratastore.errors import ConfigError
from stratastore.format import ModelFingerprint
from stratastore.metrics.counters import reported
from stratastore.metrics.counts import Counts
from stratastore.metrics.histogram import Histogram
from stratastore.metrics.monitor import Throttle, publish_snapshot
from stratastore.metrics.prometheus import prometheus_text
from stratastore.metrics.speeds import Speeds, slot_name
from stratastore.restore import Destination, flat_bytes
from stratastore.tiers.calls import Calls
from stratastore.tiers.captures import park_snapshot
from stratastore.tiers.checks import (
    batch_caps,
    batch_requests,
    batch_slots,
    restore_cap,
    session_name,
)
from stratastore.tiers.describe import StoreDescription, info_line
from stratastore.tiers.device import kv_bytes
from stratastore.tiers.records import (
    BatchRestoreError,
    InvalidConversation,
    ParkReport,
    Restored,
    Snapshot,
    StoreClosed,
)
from stratastore.tiers.tiered import Tiers
from stratastore.tiers.write_queue import SpillError

__all__ = ["BatchRestoreError", "SpillError", "Store", "StoreClosed"]


class Store:
    """Open with :meth:`open`; use as a context manager or call :meth:`close`."""

    def __init__(self, tiers: Tiers, queue_depth: int) -> None:
        self._tiers = tiers
        self._lock = tiers.lock  #: the flow's: plans and accounts are made under it
        self._calls = Calls()  #: the calls in flight (close shuts the gate and waits)
        self._closing = threading.Lock()  #: held by the one close() that closes the levels
        self._levels_closed = False
        #: the Store's own counts (the counter table's rows), under a lock of their own
        self.counters = Counts("store")
        self._counting = threading.Lock()
        #: how long the engine's park, restore and flush calls took (the table's histograms)
        self.latency = {call: Histogram() for call in ("park", "restore", "flush")}
        #: what each engine slot's parks and restores moved, by level, over a recent window:
        #: a park to RAM as its call took, a park's disk write as the spill writer wrote it
        self.speeds = Speeds()
        self._writes = tiers.start_writes(
            queue_depth, lambda: self._publish(force=False), self._written
        )
        #: when the monitor's snapshot is written (at most once a second unless forced)
        self._snapshots = Throttle(1.0, lambda: self._tiers.monitor_dir is not None)

    @classmethod
    def open(
        cls,
        fingerprint: ModelFingerprint,
        config: StoreConfig | Mapping[str, Any] | str | None = None,
        *,
        probe: Callable[[], int] | None = None,
        spill_queue: int = 4,
        warn: Callable[[str], None] | None = None,
    ) -> Store:
        """``config``: a :class:`StoreConfig`, a mapping of settings, or a TOML file's path
        (what ``strata init`` writes); ``None`` for the defaults. ``probe`` returns the free
        RAM in bytes (default: the system's MemAvailable). Every line the store says is a
        record of the ``stratastore`` logger (warnings at WARNING, the admission lines at INFO:
        :mod:`stratastore.metrics.logs`), routed by the engine's handlers; ``warn``, when
        given, is called with each line too."""
        cfg = StoreConfig.of(config)
        if spill_queue < 1:
            raise ConfigError("spill_queue must be at least 1")
        return cls(Tiers(cfg, fingerprint, probe=probe, warn=warn), spill_queue)

    def _check_open(self, call: str) -> None:
        self._calls.check(call)

    def flush(self) -> None:
        """Wait until every queued disk write is committed (spec F-DUR), then report the disk
        writes that failed since the last report: :class:`SpillError` names each conversation
        whose acknowledged park did not land, and its cause. A failure is reported once: after
        a flush raised it, the next flush returns cleanly unless another write failed (the
        counter ``spill_errors`` keeps counting them all). :class:`StoreClosed` after close."""
        with self._calls.call("flush"), self.latency["flush"].time():
            self._writes.settle()  # every write waiting in the outbox, whoever placed it
            self._publish(force=False)
            self._writes.raise_errors()

    # -- the engine's calls -------------------------------------------------------------------
    def park(
        self,
        conv: Conversation,
        kv: npt.NDArray[Any] | Any,
        states: Mapping[int, bytes] | None = None,
        *,
        pin: bool = False,
        slot: int | str | None = None,
    ) -> ParkReport:
        """Keep a conversation leaving its slot: RAM, else disk, else discard (counted).
        ``states`` maps checkpoint lengths to the running state saved there (hybrid and
        recurrent models). The store keeps ``conv`` and ``kv`` (the capture) until they are
        copied or written, and may trim ``conv``'s checkpoints (retention) or tokens (the
        prefix that fits), and cut ``kv``'s pages in place at a checkpoint it keeps that the
        capture was not cut at (``conv.cuts`` says where): do not reuse either.

        Retention runs across the parks of one conversation id: the checkpoints kept
        are those the previous park kept that are still prefixes of these tokens, plus the new
        ones, added one at a time under ``checkpoints``/``retention``; pass the newest
        checkpoint or the whole list, with cuts or none, alike (``conv.checkpoints`` says what
        was kept; every one kept is a point a restore can end at). With
        ``park_truncate`` a snapshot that fails the RAM budget, or the parking floor
        with no disk level to take it, parks its deepest checkpoint prefix that fits (the
        report's ``tokens``). ``pin=True`` pins the RAM entry: another park never truncates or
        evicts it (it is refused or truncated itself instead) until the entry is restored whole
        or parked again (without ``pin``); a park that goes to disk is not pinned.

        Everything that can be checked is checked before the park is acknowledged: a bad
        conversation id (not a string, not UTF-8 encodable, over 4096 bytes, or a saved
        session's name), checkpoints or cuts outside the tokens, a K/V of the wrong size, too
        many tokens or items for a manifest (spec F-CHAIN-2) raise
        :class:`~stratastore.tiers.tiered.InvalidConversation` and nothing is stored. A disk
        write that fails later is reported by :meth:`flush`/:meth:`close` (:class:`SpillError`).

        ``kv`` may be the engine's own layout, a :class:`~stratastore.restore.LayerKV` or
        :class:`~stratastore.restore.PagedKV` (its pool and a block table), or any source with
        page views (:class:`~stratastore.restore.PageViews`, runs of pages gathered at once
        where it has :class:`~stratastore.restore.GathersPages`): when parks go to
        disk with no remote level or system-prompt cache, it is streamed from there (gathered,
        hashed and written chunk by chunk, never copied whole), durable when this returns
        (``disk``; ``discard`` if the level refused it; an I/O error raises here); else the
        store gathers a copy. That memory is free when this returns, either way.

        ``kv`` may be device memory: a numba device array, or any object with
        ``__cuda_array_interface__`` (a torch CUDA tensor, a CuPy array), C-contiguous (else
        ``InvalidConversation``: it is never copied to make it so). Once the checks above pass,
        each segment's pages are hashed on the device, the K/V is copied to the host once, and
        the sidecars get the device's digests: never hashed on the host (nor twice), whether
        written now or from the RAM level later. The device array may be reused on return.
        The engine's layout on a device, a :class:`~stratastore.restore.DevicePagedKV` (either
        paged layout: ``kv_first``) or :class:`~stratastore.restore.DeviceLayerKV`, is gathered
        into the stored layout on the device first (one copy of the capture there, freed on
        return), then parked as device memory is.

        ``slot``: the engine slot the conversation leaves (an integer, or a name of up to 64
        letters, digits and ``_.:-``), for the per-slot speeds of ``stats()["speeds"]`` and
        ``strata monitor`` (:mod:`stratastore.metrics.speeds`); optional."""
        self._check_open("park")
        where = slot_name(slot, "park")
        start = time.perf_counter()
        with self.latency["park"].time():
            if not isinstance(pin, bool):
                raise InvalidConversation(f"park: pin must be True or False, not {pin!r}")
            if states is not None and not isinstance(states, Mapping):
                raise InvalidConversation(
                    "park: states must map checkpoint lengths to bytes, not "
                    f"{type(states).__name__}"
                )
            snap = park_snapshot(conv, kv, states, self._tiers.fp, self._tiers.streams())
            snap.slot = where
            with self._calls.call("park"):  # close waits for it (even one waiting for another)
                report = self._tiers.park(snap, pin=pin)
                streamed = snap.capture is not None and report.where == "disk"  # in this call
                if streamed:
                    self._publish(force=False)  # as the spill writer does after a write
            self._fill_prompt_cache()  # its pinned prefix, once per distinct prefix
        if report.where != "disk" or streamed:  # else it counts when its write lands (_written)
            took, tb = time.perf_counter() - start, self._tiers.tb
            self.speeds.record("park", where, report.where, report.tokens, report.tokens * tb, took)
        return report

    def _fill_prompt_cache(self) -> None:
        """Write what the parks chose for the system-prompt cache, as a call in flight: close
        waits for it, and after close nothing is written."""
        with contextlib.suppress(StoreClosed), self._calls.call("park"):
            self._tiers.fill_prompt_cache()

    def _written(self, snap: Snapshot, seconds: float) -> None:
        """A park's disk write landed (on the spill writer's thread): its slot's disk speed."""
        if snap.slot is not None and not snap.kept and (n := len(snap.conv.tokens)):  # a park
            self.speeds.record("park", snap.slot, "disk", n, n * self._tiers.tb, seconds)

    def lookup(
        self,
        prompt: Sequence[int] | npt.NDArray[np.integer],
        media: Mapping[int, bytes] | None = None,
    ) -> tuple[str, int] | None:
        """``(source, tokens)`` of the deepest stored prefix of ``prompt``, or ``None``;
        ``source`` is ``"ram"``, ``"pending"`` (a park whose disk write is in flight),
        ``"disk"``, ``"prompt_cache"`` (the system-prompt cache) or ``"remote"`` (the shared
        remote level, asked only when the local levels do not hold the whole prompt).
        ``media`` maps the token position of each picture in ``prompt`` to its 32-byte digest
        (as in :class:`~stratastore.chain.Conversation`; spec F-KEY-7): a prefix matches only
        with the same pictures at the same positions."""
        self._check_open("lookup")
        tokens = as_tokens(prompt, "lookup: prompt")
        pictures = as_media(media, len(tokens), "lookup: media")
        with self._calls.call("lookup"):
            here, ask = self._tiers.lookup_here(tokens, pictures)
            if not ask:  # held whole here, or no remote level: never waits on one
                return (here.source.name, here.length) if here else None
            found = self._tiers.find_remote(tokens, pictures)  # network: without the lock
            hit = self._tiers.lookup(tokens, pictures, found)
        return (hit[0], hit[1].length) if hit else None

    def restore(
        self,
        prompt: Sequence[int] | npt.NDArray[np.integer],
        out: npt.NDArray[Any] | Destination,
        media: Mapping[int, bytes] | None = None,
        *,
        max_tokens: int | None = None,
        slot: int | str | None = None,
    ) -> Restored:
        """Copy the deepest stored prefix of ``prompt`` into ``out``: the engine's K/V buffer
        for this conversation in the page layout of spec F-SEG-4 (at least
        ``len(prompt) * token_bytes`` bytes; ``max_tokens`` of them when capped), or a
        destination in the engine's own layout (:class:`~stratastore.restore.LayerKV`,
        :class:`~stratastore.restore.PagedKV` with a block table). Every disk page is
        validated before any byte is applied; a damaged image restores its deepest valid prefix
        (the ladder). Returns how many tokens ``out`` now holds; the engine prefills the rest.
        ``out`` is written in place: one that cannot be (not C-contiguous, Fortran-ordered,
        read-only) is refused with :class:`~stratastore.restore.DestinationRefused` before
        anything runs. ``out`` may be device memory (a numba device array, anything with
        ``__cuda_array_interface__``, :class:`~stratastore.restore.DeviceLayerKV`,
        :class:`~stratastore.restore.DevicePagedKV`): the pages are then validated on the GPU
        and only validated pages are copied in (:mod:`stratastore.restore.device`).
        ``media``: the prompt's pictures, as in :meth:`lookup`.

        ``max_tokens`` caps the restore: the deepest resume point at or below it (default: the
        deepest stored prefix, which may be the whole prompt). An engine that needs the last
        prompt token's logits passes ``len(prompt) - 1`` so that it always has a token to
        compute (docs/engine.md). A park whose disk write is still in flight is served from its
        capture (``source == "pending"``); nothing waits for another conversation's write.
        ``slot``: the engine slot it restores into, for the per-slot speeds (as in
        :meth:`park`)."""
        self._check_open("restore")
        where = slot_name(slot, "restore")
        tokens = as_tokens(prompt, "restore: prompt")
        pictures = as_media(media, len(tokens), "restore: media")
        cap = restore_cap(max_tokens, "restore")
        flat: npt.NDArray[np.uint8] | Destination = (  # a view, never a copy: in place or refused
            flat_bytes(out, "Store.restore out") if isinstance(out, np.ndarray) else out
        )
        start = time.perf_counter()
        with self.latency["restore"].time(), self._calls.call("restore"):
            r = self._tiers.restore(tokens, flat, pictures, cap)
        took = time.perf_counter() - start
        self.speeds.record("restore", where, r.source, r.tokens, r.tokens * self._tiers.tb, took)
        self._count("tokens_reread", len(tokens) - r.tokens)
        return r

    def _count(self, key: str, n: int = 1) -> None:
        """Count on the Store's own counts (their lock, not the flow's)."""
        with self._counting:
            self.counters[key] += n

    def restore_many(
        self,
        requests: Sequence[
            tuple[Sequence[int] | npt.NDArray[np.integer], npt.NDArray[Any] | Destination]
        ],
        media: Sequence[Mapping[int, bytes] | None] = (),
        *,
        max_tokens: int | Sequence[int | None] | None = None,
        slots: Sequence[int | str | None] | None = None,
    ) -> list[Restored]:
        """:meth:`restore` for several prompts submitted together (one destination each): their
        disk reads share one batched read agenda, read-ahead, validation and copy overlapping
        across requests (:mod:`stratastore.restore.agenda`); with ``batch_agenda`` off
        (``STRATA_BATCH_AGENDA=0``) each request is read on its own, in order, after every
        destination is checked. Each request keeps the contract of
        :meth:`restore`. When some requests fail (the ladder turned off and an image damaged,
        an I/O error), the others still complete and :class:`BatchRestoreError` is raised,
        carrying every request's result. ``media[i]``, when given, is request ``i``'s pictures
        (as in :meth:`lookup`). ``max_tokens``: as in :meth:`restore`, one cap for every
        request or a list with one (or ``None``) per request. ``slots``: each request's engine
        slot, for the per-slot speeds (as in :meth:`park`); each request counts its share of
        the call's time, by its bytes."""
        self._check_open("restore_many")
        reqs, pictures = batch_requests(requests, media)
        names = batch_slots(slots, len(reqs))
        caps = batch_caps(max_tokens, len(reqs))
        start = time.perf_counter()
        with self.latency["restore"].time(), self._calls.call("restore_many"):
            got = self._tiers.restore_many(reqs, pictures, caps)
        took = time.perf_counter() - start
        self.speeds.record_batch(got, names, took, self._tiers.tb)
        self._count(
            "tokens_reread",
            sum(
                len(tokens) - (0 if isinstance(r, Exception) else r.tokens)
                for (tokens, _), r in zip(reqs, got, strict=True)
            ),
        )
        if any(isinstance(r, Exception) for r in got):
            raise BatchRestoreError(got)
        return [r for r in got if not isinstance(r, Exception)]

    def save_session(
        self,
        name: str,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        kv: npt.NDArray[Any],
        checkpoints: Sequence[int] = (),
    ) -> None:
        """Save a conversation under ``name`` (durable when this returns; never evicted).
        Session names and conversation ids are one namespace (spec F-CHAIN-4): the name of a
        parked conversation is refused (:class:`~stratastore.tiers.tiered.InvalidConversation`)."""
        self._check_open("save_session")
        toks = as_tokens(tokens, f"save_session {name!r}", InvalidConversation)
        data = kv_bytes(kv, f"save_session {name!r}")
        bad = [
            c
            for c in checkpoints
            if isinstance(c, bool)
            or not isinstance(c, (int, np.integer))
            or not 0 <= c <= len(toks)
        ]
        if isinstance(checkpoints, (str, bytes)) or bad:
            raise InvalidConversation(
                f"save_session {name!r}: checkpoints must be token lengths (ints) within its "
                f"{len(toks)} tokens; got {bad[:1] or checkpoints!r}"
            )
        lengths = sorted({*map(int, checkpoints), len(toks)} - {0})
        conv = Conversation(name, toks, [Checkpoint(n) for n in lengths], cuts=[0, *lengths[:-1]])
        with self._calls.call("save_session"):  # the lock for the checks, not the write
            self._tiers.save_session(Snapshot(conv, data))

    def load_session(self, name: str, out: npt.NDArray[Any]) -> Conversation:
        self._check_open("load_session")
        name = session_name(name, "load_session")
        with self._calls.call("load_session"):  # the lock to find and account, not to read
            return self._tiers.load_session(name, flat_bytes(out, "Store.load_session out"))

    def delete_session(self, name: str) -> bool:
        self._check_open("delete_session")
        name = session_name(name, "delete_session")
        with self._calls.call("delete_session"):  # the shared catalog's: no flow lock
            return self._tiers.delete_session(name)

    # -- state --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The counters and what each level holds (the rows of ``docs/operations.md``'s counter
        table): only those of what the store has configured, an absent counter being absent,
        not 0 (a RAM-only store reports no disk or pending hit); the latency histograms of
        ``park``, ``restore`` and ``flush``. :class:`StoreClosed` after close."""
        return self._stats("stats")

    def _stats(self, call: str | None) -> dict[str, Any]:
        """:meth:`stats`; ``call`` names the public call to refuse on a closed store (``None``:
        close's own last snapshot, taken before the levels close)."""
        gate = self._calls.call(call) if call is not None else contextlib.nullcontext()
        with gate:
            doc = self._tiers.stats()  # (under the flow's lock)
        doc.update(
            tokens_reread=self.counters["tokens_reread"],
            **self._writes.counts,
            monitor_errors=self.counters["monitor_errors"],
        )
        doc["spill_queue"] = self._writes.waiting
        doc.update((f"{call}_seconds", h.as_stats()) for call, h in self.latency.items())
        doc["speeds"] = self.speeds.table()
        return reported(doc, self._tiers.owners)

    def describe(self) -> StoreDescription:
        """A read-only snapshot of the store: each level (name, directory, budget, bytes used,
        entries), the RAM level (budget, used, slots, the conversations it holds), the parks
        waiting for their disk write, the park target and why, the last admission, and the
        counters (:class:`~stratastore.tiers.describe.StoreDescription`). Nothing in it
        changes with the store. :class:`StoreClosed` after close."""
        with self._calls.call("describe"), self._lock:
            return self._tiers.describe()

    def info_line(self) -> str:
        """One line for a log (the engine's INFO fields): the park target and its source, each
        level (entries, bytes, budget; a disk level's folder), parks by destination, discards,
        hits by source, tokens restored, re-read and held, and the last admission."""
        return info_line(self._stats("info_line"))

    def prometheus(self) -> str:
        """The counters in the Prometheus text exposition format."""
        return prometheus_text(self._stats("prometheus"))

    def publish(self, *, force: bool = True) -> bool:
        """Write the counters where ``strata monitor`` reads them (``strata-index/monitor.json``
        of the last disk level, or of the system-prompt cache's folder in a store with no disk
        level); without ``force`` at most once a second. Called by the disk
        writer after each write, on flush and on close. Best effort: a failed write is counted
        (``monitor_errors``), never raised, as the engine's call must not fail for it. False
        when nothing was written (no disk level, too soon, or the write failed).
        :class:`StoreClosed` after close (which publishes a last time)."""
        with self._calls.call("publish"):  # close waits for it: never on closed levels
            return self._publish(force=force)

    def _publish(self, *, force: bool) -> bool:
        if not self._snapshots.due(force):
            return False
        try:  # best effort, on the spill writer's thread too: a failure never stops the writer
            publish_snapshot(self._tiers.monitor_dir, self._stats(None), self._tiers.cfg.file_mode)
        except Exception:
            self._count("monitor_errors")
            return False
        return True

    def close(self) -> None:
        """Write down what only the RAM level holds (``spill_on_close``, on by default, when a
        disk level exists; each admitted under the transient floor), flush the spill writer,
        then close every level; raise :class:`SpillError` for the disk writes that failed and
        were not reported yet. A second close only reports what failed since; a close interrupted
        before the levels closed (Ctrl-C while calls were in flight or while it waited for the
        writer) leaves them open under the running writer and is finished by the next, which
        writes everything acknowledged. Every other call after close raises
        :class:`StoreClosed`."""
        self._calls.shut()  # no new call from now on
        with self._closing:  # one closer; an interrupted close is resumed by the next
            if not self._levels_closed:
                self._calls.wait_idle()  # the calls in flight end first (their writes handed over)
                try:  # what only RAM holds goes down too (spill_on_close)
                    self._tiers.spill_ram_on_close()
                except Exception as e:  # reported below, after the writes already acknowledged
                    self._writes.record("(close: writing down the RAM level)", e)
                # every write the outbox holds, then the writer's last; a Ctrl-C here leaves
                # the levels open under the running writer, for the next close to finish
                self._writes.stop()
                self._publish(force=True)
                with self._lock:
                    self._tiers.close()
                self._levels_closed = True
        self._writes.raise_errors()

    def __enter__(self) -> Store:
        self._check_open("__enter__")
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
