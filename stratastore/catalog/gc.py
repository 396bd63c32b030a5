"""Garbage collection that knows chains (spec F-CAT-4): what capacity and age GC remove is
decided in one catalog transaction, then carried out on the files.

The unit GC removes is a conversation's tail: the oldest conversation (by its manifest's
``sealed_at_ns``) is cut to its pinned prefix (F-CHAIN-6), or removed whole when it has none;
a saved session is never touched (F-CHAIN-5). A segment is deleted only when no manifest names
it any more (its reference count in the catalog is zero) and no park in flight registered it,
so a segment a live manifest needs in the middle of its chain is never deleted, and a segment
shared by several conversations goes with the last of them. A park registers its keys before it
writes (:meth:`~stratastore.catalog.Catalog.begin`), so GC never removes a park's own segments
or the prefix it extends; when nothing can be freed the level refuses and the park is
discarded and counted, never acknowledged.

Carrying a removal out (:meth:`Collector.carry_out`): rewrite or unlink the manifest file
first, then delete the dead keys from every level, then release the catalog's dooms (a crash
between leaves the dooms, which the next open or the next park that meets them finishes,
F-CAT-7).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stratastore.catalog.chains import pinned_length
from stratastore.catalog.tables import Catalog, Removal
from stratastore.format.manifest import ChainManifest
from stratastore.format.naming import chain_name
from stratastore.io import durable_write, guard, pathnames
from stratastore.levels.backend import SegmentBackend

__all__ = ["CANDIDATES", "Collector"]

#: how many of the oldest conversations capacity GC looks at for one that frees the level
CANDIDATES = 32


class Collector:
    """Removes conversations' tails, and unreadable segments (:meth:`discard`), for the levels
    of one store."""

    def __init__(
        self,
        catalog: Catalog,
        levels: Callable[[], Sequence[SegmentBackend]],
        manifest_dir: str,
        file_mode: int,
    ) -> None:
        self.catalog = catalog
        self.levels = levels
        self.manifest_dir = manifest_dir
        self.file_mode = file_mode
        self.removed = 0  #: conversations removed whole
        self.cut = 0  #: conversations cut to their pinned prefix (or before damage)

    def carry_out(self, r: Removal) -> None:
        """Make the files match a removal the catalog decided, then release its dooms."""
        try:
            if r.conv_id:
                path = pathnames.join(self.manifest_dir, chain_name(r.conv_id))
                if r.manifest is None:
                    guard.remove_store_file(path, missing_ok=True)
                else:
                    durable_write(path, r.manifest, mode=self.file_mode)  # F-DIR-9
            for key in r.dead:
                for level in self.levels():  # the cascade's order: a key moves down, not up
                    level.delete(key)
        finally:
            self.catalog.finish(r)

    def free_oldest(
        self, *, before_ns: int | None = None, level: SegmentBackend | None = None
    ) -> int:
        """Shorten the oldest conversation GC may touch: sealed before ``before_ns`` (age GC),
        or, for ``level`` (capacity GC), the oldest of the first :data:`CANDIDATES` whose
        shortening deletes a segment ``level`` holds (one whose segments all live in another
        level would free nothing there). The tokens freed; 0 when there was none."""
        for conv_id in self.catalog.oldest(before_ns, limit=CANDIDATES):
            if level is not None and not any(
                k in level for k in self.catalog.would_free(conv_id, pinned_length)
            ):
                continue
            r = self.catalog.shorten(conv_id, pinned_length)
            if r is None:
                continue
            self.carry_out(r)
            if r.manifest is None:
                self.removed += 1
            else:
                self.cut += 1
            return max(r.freed_tokens, 1)
        return 0

    def discard(self, key: bytes) -> bool:
        """An unreadable segment leaves: every conversation that names it is cut to the prefix
        before it (F-CHAIN-3, so that no segment after a hole stays behind), in any case; the
        segment itself is then deleted from every level, unless a park in flight names it
        (then False: it goes once that park has committed and GC meets it again)."""
        self.cut_before(key)
        r = self.catalog.doom_unnamed(key)
        if r is None:
            return False
        self.carry_out(r)
        return True

    def cut_before(self, key: bytes) -> None:
        """Cut every conversation that names ``key`` to the prefix before it (F-CHAIN-3)."""
        for conv_id in self.catalog.named_by(key):

            def keep(m: ChainManifest, key: bytes = key) -> int:
                starts = [s for s, _, k in m.segments if k == key]
                states = [c.length - 1 for c in m.checkpoints if c.state_key == key]
                return max(0, min(starts + states, default=len(m.tokens)))

            r = self.catalog.shorten(conv_id, keep, sessions=True)
            if r is not None:
                self.carry_out(r)
                self.cut += 1
