"""Retention across parks: the checkpoints a conversation keeps from one park to the next (the
200-turn edit table through the Store).

An engine parks a growing conversation turn after turn under one id, each park's tokens
extending the previous one's and one more checkpoint at the new turn's end. The 200-turn edit table
(0, 1K, 3K, 8K, 43K and the root kept of 200 turns) comes from applying retention *each time a
checkpoint is added*, to the chain the engine kept so far; applied to one park's list alone, the
same policy thins a different set (0/1K/6K/24K/72K for ``spread``). :class:`RetainedChains`
remembers, per conversation, what the previous park kept and applies the policy incrementally, as
the reference engine does in its own memory. The rule for a park of tokens ``T`` with the
passed checkpoints ``P``:

* a checkpoint is identified by its length and its prefix (a digest of ``T[:length]`` and the
  media in it), so an edit that changes a prefix makes it another checkpoint;
* **kept**: the checkpoints kept at the previous park that are still prefixes of ``T`` (the
  passed object where ``P`` has the same length, for its flags; else the remembered one). An
  engine may pass only its newest checkpoint, or its whole list: both give the same chain;
* **dropped earlier**: a passed checkpoint a previous park of this branch had considered and not
  kept stays dropped (an engine that passes its whole list every time);
* **new**: every other passed checkpoint (and the deepest passed one, when it is not kept: it is
  the engine's current resume point); added one at a time in ascending order, each followed by
  dropping victims while over ``count`` (:func:`~.retention.add_checkpoint`);
* nothing remembered (the first park, a new process, or a conversation forgotten for
  ``capacity``): the chain the store holds for the id (RAM, else the disk catalog's manifest)
  stands in for the previous park; its checkpoints that are prefixes of ``T`` are kept, and the
  passed checkpoints within its tokens count as considered. With nothing stored either, every
  passed checkpoint is new: on a whole list that is the edit table's simulation in one go.

An edit (``T`` does not extend the previous tokens) is the same rule: what the previous park
kept below the edit survives, and the checkpoints past the edit are new. Memory per conversation
is a digest per checkpoint length considered on its current branch, for at most ``capacity``
conversations (least recently parked forgotten first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from stratastore.chain.model import Checkpoint, Conversation
from stratastore.chain.retention import Policy, add_checkpoint, enforce_count
from stratastore.errors import ConfigError

__all__ = ["RetainedChains", "prefix_digests"]

#: the chain the store holds for a conversation id, asked only when nothing is remembered
Stored = Callable[[], Conversation | None] | None


def prefix_digests(conv: Conversation, lengths: Iterable[int]) -> dict[int, bytes]:
    """The digest of ``conv``'s prefix ``[0, n)`` (its token ids and the media in it) for each
    ``n`` of ``lengths`` within its tokens; one pass over the tokens, whatever the lengths."""
    tokens = np.ascontiguousarray(conv.tokens, dtype=np.uint32)
    toks, pics = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    media = sorted(conv.media.items())
    out: dict[int, bytes] = {}
    pos = m = 0
    for n in sorted({x for x in lengths if 0 <= x <= len(tokens)}):
        toks.update(tokens[pos:n].data)
        while m < len(media) and media[m][0] < n:
            pics.update(media[m][0].to_bytes(8, "little") + media[m][1])
            m += 1
        pos = n
        out[n] = toks.copy().digest() + pics.copy().digest()
    return out


@dataclass
class _Memory:
    """What one conversation's previous park left: the checkpoints it kept (copies, ascending)
    and the digest at every length considered on its branch (the kept ones included)."""

    kept: list[Checkpoint]
    seen: dict[int, bytes]

    @classmethod
    def of_stored(cls, stored: Conversation, passed: Iterable[int]) -> _Memory:
        """A stored chain standing in for the previous park (see the module's docstring)."""
        lengths = {c.length for c in stored.checkpoints} | set(passed)
        return cls([replace(c) for c in stored.checkpoints], prefix_digests(stored, lengths))


class RetainedChains:
    """Per-conversation retention memory: :meth:`apply` at each park (see the module's
    docstring). Not thread-safe (its owner serialises parks)."""

    def __init__(self, count: int, policy: Policy, capacity: int = 4096) -> None:
        if count < 1 or capacity < 1:
            raise ConfigError("retained chains: count and capacity must be at least 1")
        self.count, self.policy, self.capacity = count, policy, capacity
        self._memory: OrderedDict[str, _Memory] = OrderedDict()

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self._memory

    def kept(self, conv_id: str) -> list[int]:
        """The lengths the last park of ``conv_id`` kept (empty when none is remembered)."""
        mem = self._memory.get(conv_id)
        return [c.length for c in mem.kept] if mem else []

    def apply(self, conv: Conversation, stored: Stored = None) -> list[Checkpoint]:
        """Set ``conv.checkpoints`` to the chain it keeps at this park and remember it; returns
        the passed checkpoints that were not kept (their running states can go). ``stored``
        gives the chain the store holds for the id, asked only when nothing is remembered.
        A kept checkpoint the park's K/V was not cut at is the caller's to make a segment
        bound (a checkpoint ends a segment, spec F-SEG-7: the park re-lays the capture)."""
        passed = list(conv.checkpoints)
        mem = self._memory.pop(conv.conv_id, None)
        if mem is None and stored is not None and (held := stored()) is not None:
            mem = _Memory.of_stored(held, (c.length for c in passed))
        mem = mem or _Memory([], {})
        digests = prefix_digests(conv, [*mem.seen, *(c.length for c in passed)])
        on_branch = {n for n, d in mem.seen.items() if digests.get(n) == d}
        chain = self._chain(mem, on_branch, passed)
        conv.checkpoints = chain
        seen = on_branch | {c.length for c in passed}
        self._memory[conv.conv_id] = _Memory(
            [replace(c) for c in chain], {n: digests[n] for n in seen}
        )
        while len(self._memory) > self.capacity:
            self._memory.popitem(last=False)
        kept = {c.length for c in chain}
        return [c for c in passed if c.length not in kept]

    def _chain(
        self, mem: _Memory, on_branch: set[int], passed: list[Checkpoint]
    ) -> list[Checkpoint]:
        """Kept (still on the branch), then each new one added and the count held."""
        by_length = {c.length: c for c in passed}
        chain = [by_length.get(c.length, c) for c in mem.kept if c.length in on_branch]
        kept = {c.length for c in chain}
        newest = passed[-1].length if passed else None
        for c in passed:
            if c.length not in kept and (c.length not in on_branch or c.length == newest):
                add_checkpoint(chain, c, self.count, self.policy)
        enforce_count(chain, self.count, self.policy)  # a count lowered since they were kept
        return chain
