"""This process's lookup tree of the conversations on disk, kept in step with the shared catalog.

Before every lookup, park and session call the view reads the catalog's generation (one LMDB
read); when another process (or this one) changed something it reloads just the conversations
the change log names (:meth:`~stratastore.catalog.Catalog.changes_since`), or everything when
it fell further behind than the log reaches. No directory listing, no timestamp: a re-park or a
removal is seen by the next call of every process, whatever the filesystem's clock granularity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from stratastore.catalog import Catalog
from stratastore.chain import Checkpoint, Conversation, Match, PrefixIndex
from stratastore.format.manifest import ChainManifest

__all__ = ["DiskConv", "DiskView"]


@dataclass
class DiskConv:
    """A conversation on disk as a manifest commits it (spec F-CHAIN)."""

    conv: Conversation
    segments: list[tuple[int, int, bytes]] = field(default_factory=list)
    session: bool = False
    state_keys: dict[int, bytes] = field(default_factory=dict)  #: checkpoint length -> key

    @classmethod
    def of(cls, m: ChainManifest) -> DiskConv:
        conv = Conversation(
            m.conv_id,
            m.tokens,
            [Checkpoint(c.length, pinned=c.pinned, tail=c.tail) for c in m.checkpoints]
            or [Checkpoint(0)],
            dict(m.media),
            [s for s, _, _ in m.segments] or [0],
        )
        keys = {c.length: c.state_key for c in m.checkpoints if c.state_key}
        return cls(conv, list(m.segments), m.session, keys)


class DiskView:
    def __init__(self, catalog: Catalog | None, root: bytes) -> None:
        self.catalog = catalog
        self.root = root
        self.index = PrefixIndex()
        self.convs: dict[str, DiskConv] = {}
        self.gen = -1

    def sync(self) -> None:
        """Catch up with the catalog (see the module's docstring)."""
        if self.catalog is None:
            return
        gen, changed = self.catalog.changes_since(self.gen)
        if changed is None:  # first look, or further behind than the log: reload everything
            for conv_id in list(self.convs):
                self._forget(conv_id)
            for m in self.catalog.all():
                self._remember(DiskConv.of(m))
        else:
            for conv_id in changed:
                entry = self.catalog.get(conv_id)
                if entry is None:
                    self._forget(conv_id)
                else:
                    self._remember(DiskConv.of(entry))
        self.gen = gen

    def get(self, conv_id: str) -> DiskConv | None:
        return self.convs.get(conv_id)

    def lookup(
        self,
        prompt: npt.NDArray[np.integer] | list[int],
        media: Mapping[int, bytes] | None,
        page: int | None,
    ) -> Match | None:
        return self.index.lookup(self.root, prompt, media, page_tokens=page)

    def _remember(self, dc: DiskConv) -> None:
        self._forget(dc.conv.conv_id)
        self.convs[dc.conv.conv_id] = dc
        self.index.add(self.root, dc.conv)

    def _forget(self, conv_id: str) -> None:
        dc = self.convs.pop(conv_id, None)
        if dc is not None:
            self.index.remove(conv_id)
