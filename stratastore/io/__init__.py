"""The io layer: the only code that touches store files (DESIGN layer 2, spec F-DUR).

``files`` holds the primitives, ``durable`` the write protocol, ``relocate`` rename-or-copy,
``faults`` the injection seam every durability test targets.
"""

from . import faults, files
from .durable import DurableFile, durable_write
from .errors import StrataIOError
from .relocate import relocate_file

__all__ = ["DurableFile", "StrataIOError", "durable_write", "faults", "files", "relocate_file"]
