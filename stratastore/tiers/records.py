"""The records the tiers pass around and return (a snapshot to park, a park's report, a
restore's result) and the errors of the park path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt

from stratastore.chain import Conversation
from stratastore.errors import ConfigError, StrataError
from stratastore.levels.sealing import Payload
from stratastore.restore.gather import EngineCapture

__all__ = [
    "MAX_STATE_BYTES",
    "BatchRestoreError",
    "InvalidConversation",
    "ParkReport",
    "Placement",
    "Restored",
    "Snapshot",
    "SpillRefused",
    "StoreClosed",
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
    """A conversation and its K/V (``len(tokens) * token_bytes`` bytes, spec F-SEG-4 layout).

    ``page_hashes`` maps a segment's ``(start, end)`` tokens to the ``(pages, 32)`` BLAKE3
    digests of ``kv[start * token_bytes : end * token_bytes]`` in pages of ``page_bytes`` from
    ``start``: what a park from device memory brings (hashed there), so the disk
    writer puts those segments without hashing them again. An entry is a fact about the bytes
    of ``kv`` alone, whatever conversation they are written under, so it holds for as long as
    a copy of the capture keeps them (a prefix truncated at or past ``end``); a segment with no
    entry (a host park, a segment whose bounds retention or truncation changed) is hashed as
    it is written. Every copy of the capture carries the entries its bytes still cover
    (:meth:`detached`, the RAM level's capture)."""

    conv: Conversation
    kv: npt.NDArray[np.uint8]
    #: running state saved at checkpoints (hybrid/recurrent models): checkpoint length -> bytes
    states: dict[int, bytes] = field(default_factory=dict)
    pending: int = 0  #: bytes reserved for it in the disk levels while it waits in the outbox
    #: a segment's (start, end) tokens -> its pages' digests, computed on the device
    page_hashes: dict[tuple[int, int], npt.NDArray[np.uint8]] = field(default_factory=dict)
    #: a copy the store made of its own accord (``remote_keep_local``), not a park anyone was
    #: told of: a write of it that fails is said and counted, never reported as a lost park
    kept: bool = False
    #: the engine slot of a park bound for disk (``park(slot=)``): its write counts in the
    #: per-slot speeds; ``None`` for a write that is no park of its own (a RAM park's mirror,
    #: a RAM eviction, what close writes down)
    slot: str | None = None
    #: the K/V still in the engine's own layout (a park given a LayerKV or PagedKV, written to
    #: disk within the call, streamed from there); ``kv`` is then empty
    capture: EngineCapture | None = None

    @property
    def nbytes(self) -> int:
        """The capture's bytes (``kv``'s, or those still in the engine's layout)."""
        return self.capture.nbytes if self.capture is not None else self.kv.nbytes

    def payload(self, start: int, end: int, token_bytes: int) -> Payload:
        """What a disk write puts for the segment of tokens ``[start, end)``: a slice of
        ``kv``, or the segment's pages in the engine's layout (gathered as they are written)."""
        if self.capture is not None:
            return self.capture.segment(start, end)
        return self.kv[start * token_bytes : end * token_bytes]

    def detached(self) -> Snapshot:
        """The same capture with a conversation of its own (its checkpoints, cuts and media
        copied; the token and K/V arrays shared: nothing writes them): what the spill writer
        takes, so that the RAM level shrinking its entry in place (park truncation) changes neither
        what is written nor what a restore of the park in flight delivers. Its device digests
        (``page_hashes``) go with it."""
        c = self.conv
        conv = Conversation(
            c.conv_id, c.tokens, [replace(x) for x in c.checkpoints], dict(c.media), list(c.cuts)
        )
        return Snapshot(
            conv,
            self.kv,
            dict(self.states),
            page_hashes=dict(self.page_hashes),
            kept=self.kept,
            slot=self.slot,
        )


@dataclass(frozen=True, slots=True)
class ParkReport:
    where: Literal["ram", "disk", "discard"]
    floor: str  #: which RAM floor admitted it ("parking", "transient", "none")
    tokens: int  #: tokens kept (0 for a discard)


@dataclass(frozen=True, slots=True)
class Placement:
    """What a park placed under the flow's lock, for the write queue (:mod:`.write_queue`):
    its ``report``, and for a park written from the engine's memory within its call,
    ``stream`` (that write, run by the caller's thread without the lock; the report once it
    landed). The disk writes a park acknowledged (its own, RAM evictions) are not carried:
    they wait in the outbox until a hand-over takes them (:meth:`.write_queue.WriteQueue.
    submit`), so a call interrupted between its placement and its hand-over loses none."""

    report: ParkReport
    stream: Callable[[], ParkReport] | None = None


@dataclass(frozen=True, slots=True)
class Restored:
    #: where the prefix came from: the RAM level, a park whose disk write is still in flight
    #: (its capture, in memory), the disk levels (validated), the system-prompt cache
    #: (validated), the shared remote level (validated), or nowhere
    source: Literal["ram", "pending", "disk", "prompt_cache", "remote", "none"]
    tokens: int
    conv_id: str | None = None
    state: bytes | None = None  #: the running state at ``tokens``, when one was saved there


class BatchRestoreError(StrataError):
    """Some requests of :meth:`~stratastore.Store.restore_many` failed; ``results`` holds, per
    request, its :class:`Restored` (its destination was filled) or its error."""

    def __init__(self, results: list[Restored | Exception]) -> None:
        self.results = results
        failed = [f"#{i}: {r}" for i, r in enumerate(results) if isinstance(r, Exception)]
        super().__init__(
            f"{len(failed)} of {len(results)} restores failed ("
            + "; ".join(failed)
            + "); the others completed (see .results)"
        )


class StoreClosed(StrataError):
    """A call on a :class:`~stratastore.Store` after its ``close()``; open a new store to go on."""

    def __init__(self, call: str) -> None:
        super().__init__(
            f"store is closed: {call}() was called after close(); open a new Store "
            "(Store.open) to go on"
        )
