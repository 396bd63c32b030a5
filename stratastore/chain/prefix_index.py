"""Prefix lookup: the deepest stored point whose tokens (and media) are exactly a prefix of a
prompt, across every stored conversation of a model.

A radix tree over token sequences: each edge holds a run of token ids (a numpy uint32 slice) and
the media digests at positions inside it; children are keyed by their first (token, media)
symbol. Matching an edge is one vectorised comparison, so a lookup costs a few numpy calls per
branch point on the prompt's path plus a linear scan of the matched tokens: no per-token hashing.
Equal prefixes of different conversations share their edges; each conversation ends on a node
boundary. Trees are kept per model fingerprint digest: another model never hits.

Two kinds of resume point:

* a *checkpoint*: the exact length where a conversation saved a resume point (hybrid and
  recurrent models can only resume there: they need the running state saved at that length);
* a *page* (attention-only layouts): any whole K/V page boundary at or below the end of the
  match, since the K/V of every stored conversation covers its whole length; pages start at the
  conversation's segment cuts.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from stratastore.chain.model import Conversation, Tokens, as_tokens, page_floor

__all__ = ["Match", "PrefixIndex"]

Symbol = tuple[int, bytes | None]


@dataclass(frozen=True, slots=True)
class Match:
    """Where a prompt resumes: ``length`` tokens of ``conv_id``'s stored state are restorable
    (``via`` a checkpoint or a whole page); ``matched`` tokens of the prompt equal a stored
    prefix (``length <= matched``)."""

    conv_id: str
    length: int
    matched: int
    via: Literal["checkpoint", "page"]


class _Node:
    __slots__ = (
        "children",
        "ckpt_lengths",
        "ckpts",
        "convs",
        "longest",
        "max_conv",
        "max_extent",
        "media",
        "parent",
        "start",
        "tokens",
    )

    def __init__(
        self, tokens: Tokens, start: int, media: dict[int, bytes], parent: _Node | None
    ) -> None:
        self.tokens = tokens
        self.start = start
        self.media = media
        self.parent = parent
        self.children: dict[Symbol, _Node] = {}
        self.convs: dict[str, int] = {}  #: conversations covering this edge -> their length
        self.ckpts: dict[int, dict[str, None]] = {}  #: checkpoint length -> conversations
        self.ckpt_lengths: list[int] = []  #: sorted keys of ckpts
        self.max_extent = 0
        self.max_conv = ""
        #: (-extent, conv) of every conversation added, a heap: the longest in O(log n) when
        #: the longest leaves (entries of conversations gone or changed are skipped lazily)
        self.longest: list[tuple[int, str]] = []

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def symbol(self) -> Symbol:
        return (int(self.tokens[0]), self.media.get(self.start))

    def add_conv(self, conv_id: str, extent: int) -> None:
        self.convs[conv_id] = extent
        heapq.heappush(self.longest, (-extent, conv_id))
        if extent > self.max_extent:
            self.max_extent, self.max_conv = extent, conv_id

    def drop_conv(self, conv_id: str) -> None:
        del self.convs[conv_id]
        if conv_id == self.max_conv:
            heap = self.longest
            while heap and self.convs.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)  # gone, or re-added with another extent
            self.max_extent, self.max_conv = (-heap[0][0], heap[0][1]) if heap else (0, "")
        if len(self.longest) > 2 * len(self.convs) + 16:  # keep the stale entries bounded
            self.longest = [(-e, c) for c, e in self.convs.items()]
            heapq.heapify(self.longest)

    def add_ckpt(self, length: int, conv_id: str) -> None:
        if length not in self.ckpts:
            self.ckpts[length] = {}
            bisect.insort(self.ckpt_lengths, length)
        self.ckpts[length][conv_id] = None

    def drop_ckpt(self, length: int, conv_id: str) -> None:
        holders = self.ckpts.get(length)
        if holders is None:
            return
        holders.pop(conv_id, None)
        if not holders:
            del self.ckpts[length]
            self.ckpt_lengths.remove(length)

    def deepest_ckpt(self, limit: int) -> tuple[int, str] | None:
        i = bisect.bisect_right(self.ckpt_lengths, limit)
        if i == 0:
            return None
        length = self.ckpt_lengths[i - 1]
        return length, next(iter(self.ckpts[length]))


def _media_mismatch(
    edge: _Node, media: Mapping[int, bytes], media_pos: Sequence[int], lo: int, hi: int
) -> int:
    """First position in [lo, hi) where the edge's and the prompt's media differ, else hi."""
    first = hi
    for p, d in edge.media.items():
        if lo <= p < first and media.get(p) != d:
            first = p
    i = bisect.bisect_left(media_pos, lo)
    while i < len(media_pos) and media_pos[i] < first:
        p = media_pos[i]
        if edge.media.get(p) != media[p]:
            first = p
            break
        i += 1
    return first


def _match_len(
    edge: _Node, tokens: Tokens, media: Mapping[int, bytes], media_pos: Sequence[int], pos: int
) -> int:
    """How many symbols of ``edge`` equal the prompt's from ``pos`` (the edge starts at pos)."""
    k = min(len(edge.tokens), len(tokens) - pos)
    neq = edge.tokens[:k] != tokens[pos : pos + k]
    i = int(neq.argmax()) if k and neq.any() else k
    if edge.media or media_pos:
        i = _media_mismatch(edge, media, media_pos, pos, pos + i) - pos
    return i


class _Tree:
    def __init__(self) -> None:
        self.root = _Node(np.empty(0, np.uint32), 0, {}, None)

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut ``node``'s edge after ``m`` symbols; returns the new upper node."""
        cut = node.start + m
        parent = node.parent
        assert parent is not None
        upper = _Node(
            node.tokens[:m], node.start, {p: d for p, d in node.media.items() if p < cut}, parent
        )
        parent.children[upper.symbol()] = upper
        node.tokens = node.tokens[m:]
        node.media = {p: d for p, d in node.media.items() if p >= cut}
        node.start = cut
        node.parent = upper
        upper.children[node.symbol()] = node
        for c, e in node.convs.items():
            upper.add_conv(c, e)
        for length in [x for x in node.ckpt_lengths if x <= cut]:
            upper.ckpts[length] = node.ckpts.pop(length)
            upper.ckpt_lengths.append(length)
            node.ckpt_lengths.remove(length)
        return upper

    def path(self, tokens: Tokens, media: Mapping[int, bytes]) -> list[_Node]:
        """The nodes covering ``tokens`` exactly, creating and splitting as needed."""
        media_pos = sorted(media)
        node, pos, out = self.root, 0, [self.root]
        while pos < len(tokens):
            child = node.children.get((int(tokens[pos]), media.get(pos)))
            if child is None:
                child = _Node(
                    tokens[pos:].copy(), pos, {p: d for p, d in media.items() if p >= pos}, node
                )
                node.children[child.symbol()] = child
            else:
                m = _match_len(child, tokens, media, media_pos, pos)
                if m < len(child.tokens):
                    child = self._split(child, m)
            out.append(child)
            pos, node = child.end, child
        return out

    def existing_path(self, tokens: Tokens, media: Mapping[int, bytes]) -> list[_Node]:
        node, pos, out = self.root, 0, [self.root]
        while pos < len(tokens):
            child = node.children[(int(tokens[pos]), media.get(pos))]
            out.append(child)
            pos, node = child.end, child
        return out


def _owner(path: list[_Node], length: int) -> _Node:
    """The node whose edge holds the checkpoint at ``length`` (start < length <= end)."""
    for node in path:
        if node.start < length <= node.end:
            return node
    return path[0]  # length 0: the tree root


@dataclass(frozen=True, slots=True)
class _Entry:
    """What was indexed for a conversation (a snapshot: the conversation may change later)."""

    model: bytes
    tokens: Tokens
    media: dict[int, bytes]
    lengths: list[int]
    cuts: list[int]


class PrefixIndex:
    """Stored conversations of one or more models, searchable by prompt prefix."""

    def __init__(self) -> None:
        self._trees: dict[bytes, _Tree] = {}
        self._convs: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._convs)

    def __contains__(self, conv_id: object) -> bool:
        return conv_id in self._convs

    def stored_tokens(self, conv_id: str) -> Tokens:
        """The tokens indexed for ``conv_id`` (what a hit on it is a prefix of)."""
        return self._convs[conv_id].tokens

    def add(self, model: bytes, conv: Conversation) -> None:
        """Index ``conv`` (its tokens, media and checkpoint lengths as they are now) under the
        model digest ``model``; re-adding an id replaces its previous entry."""
        if conv.conv_id in self._convs:
            self.remove(conv.conv_id)
        tree = self._trees.setdefault(model, _Tree())
        tokens = as_tokens(conv.tokens)
        path = tree.path(tokens, conv.media)
        for node in path:
            node.add_conv(conv.conv_id, len(tokens))
        lengths = conv.lengths()
        for length in lengths:
            _owner(path, length).add_ckpt(length, conv.conv_id)
        self._convs[conv.conv_id] = _Entry(
            model, tokens, dict(conv.media), lengths, list(conv.cuts)
        )

    def remove(self, conv_id: str) -> None:
        """Forget a conversation (a KeyError if it was not indexed)."""
        entry = self._convs.pop(conv_id)
        tree = self._trees[entry.model]
        path = tree.existing_path(entry.tokens, entry.media)
        for length in entry.lengths:
            _owner(path, length).drop_ckpt(length, conv_id)
        for node in reversed(path):
            node.drop_conv(conv_id)
            if not node.convs and node.parent is not None:
                del node.parent.children[node.symbol()]

    def lookup(
        self,
        model: bytes,
        prompt: Sequence[int] | npt.NDArray[np.integer],
        media: Mapping[int, bytes] | None = None,
        *,
        page_tokens: int | None = None,
    ) -> Match | None:
        """The deepest resume point for ``prompt`` under ``model``, or ``None``.

        Checkpoints are always candidates; with ``page_tokens`` (attention-only layouts) so is
        the last whole page at or below the end of the match. A point is returned only if every
        token (and media digest) before it equals the prompt's. A point of zero tokens (a
        checkpoint at 0, which every conversation of the model shares) restores nothing: it is
        no resume point, and the lookup is a miss (``None``).
        """
        tree = self._trees.get(model)
        if tree is None:
            return None
        tokens = as_tokens(prompt)
        media = media or {}
        media_pos = sorted(media)
        node, pos = tree.root, 0
        best = tree.root.deepest_ckpt(0)
        last, matched = tree.root, 0
        while pos < len(tokens):
            child = node.children.get((int(tokens[pos]), media.get(pos)))
            if child is None:
                break
            i = _match_len(child, tokens, media, media_pos, pos)
            last, matched = child, pos + i
            found = child.deepest_ckpt(matched)
            if found is not None:
                best = found
            if i < len(child.tokens):
                break
            pos, node = child.end, child
        result = Match(best[1], best[0], matched, "checkpoint") if best is not None else None
        if page_tokens and last.max_conv:
            cuts = self._convs[last.max_conv].cuts
            page = page_floor(cuts, min(matched, last.max_extent), page_tokens)
            if page > 0 and (result is None or page > result.length):
                result = Match(last.max_conv, page, matched, "page")
        return result if result is not None and result.length > 0 else None
