"""The io layer: the only code that touches store files (DESIGN layer 2, spec F-DUR).

``files`` holds the primitives, ``guard`` the check every destructive operation passes (spec
F-DIR-8), ``modes`` the permission modes (F-DIR-9), ``durable`` the write protocol, ``relocate``
rename-or-copy, ``faults`` the injection seam every durability test targets.
"""

from stratastore.io import faults, files, guard, modes
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
    "relocate_file",
]
