"""The restore path (DESIGN layer 6): two passes, the prefix ladder, destinations."""

from .destinations import Destination, FlatKV, LayerKV, PagedKV
from .two_pass import Outcome, Piece, RestoreFailed, two_pass_restore

__all__ = [
    "Destination",
    "FlatKV",
    "LayerKV",
    "Outcome",
    "PagedKV",
    "Piece",
    "RestoreFailed",
    "two_pass_restore",
]
