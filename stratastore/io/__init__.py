"""The io layer: the only code that touches store files (spec F-DUR), and with
the level implementations the only caller of ``os``.

``files`` holds the primitives and the look-ups, ``guard`` the check every destructive operation
passes (spec F-DIR-8), ``modes`` the permission modes (F-DIR-9), ``durable`` the write protocol,
``relocate`` rename-or-copy, ``quarantine`` moving a damaged file aside, ``faults`` the
injection seam every durability test targets, ``pathnames`` the one way a path is joined or
split, ``system`` what the process and the machine are (memory, CPUs, processes, the
environment).
"""

from stratastore.io import faults, files, guard, modes, pathnames
from stratastore.io.durable import DurableFile, durable_write
from stratastore.io.errors import NotARegularFile, NotAStoreName, StrataIOError, SymlinkRefused
from stratastore.io.relocate import relocate_file

__all__ = [
    "DurableFile",
    "NotARegularFile",
    "NotAStoreName",
    "StrataIOError",
    "SymlinkRefused",
    "durable_write",
    "faults",
    "files",
    "guard",
    "modes",
    "pathnames",
    "relocate_file",
]
