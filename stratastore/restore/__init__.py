"""The restore path (DESIGN layer 6): two passes, the prefix ladder, destinations."""

from .agenda import restore_batch
from .destinations import Destination, FlatKV, LayerKV, PagedKV, pack_pages
from .two_pass import Job, Outcome, Piece, RestoreFailed, two_pass_restore

__all__ = [
    "Destination",
    "FlatKV",
    "Job",
    "LayerKV",
    "Outcome",
    "PagedKV",
    "Piece",
    "RestoreFailed",
    "restore_batch",
    "pack_pages",
    "two_pass_restore",
]
