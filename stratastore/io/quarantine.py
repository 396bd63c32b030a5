"""Moving a damaged store file aside into its directory's ``strata-quarantine/`` (spec F-DIR-4),
never deleting it: what ``strata fsck --repair`` does with a damaged segment (FSCK.md), and what
a directory level does with a sidecar whose data file is gone (fsck's ``DATA_MISSING``, spec
F-DUR-7). One function, so the two follow one rule.
"""

from __future__ import annotations

from stratastore.format.naming import QUARANTINE_DIR
from stratastore.io import files, guard, modes, pathnames
from stratastore.io.relocate import relocate_file

__all__ = ["quarantine"]


def quarantine(path: str) -> str | None:
    """Move the store file ``path`` into its directory's ``strata-quarantine/`` (made with the
    mode the directory's own bits give its files, spec F-DIR-9), keeping its mode, durably
    (a rename, then both directories fsynced: F-DUR-4); a name already there gets a ``.N``
    suffix, so nothing quarantined is ever replaced. Returns where it went, or None when
    ``path`` was already gone. Refuses (spec F-DIR-8: :class:`~stratastore.io.NotAStoreName`,
    :class:`~stratastore.io.SymlinkRefused`, :class:`~stratastore.io.NotARegularFile`) a name
    that is not a store file, a link or a non-regular file, and a ``strata-quarantine`` that is
    a link."""
    if not guard.require_store_file(path, "quarantine"):
        return None  # already gone
    d = pathnames.dirname(path)
    # the directory's own bits, not a link's that names it (a level may be one, F-DIR-8)
    mode = modes.inherited_mode(files.permissions(pathnames.join(d, ".")))
    qdir = guard.store_subdir(d, QUARANTINE_DIR, mode=mode)
    dst = pathnames.join(qdir, pathnames.basename(path))
    n = 1
    while files.lexists(dst):
        dst = pathnames.join(qdir, f"{pathnames.basename(path)}.{n}")
        n += 1
    relocate_file(path, dst)
    return dst
