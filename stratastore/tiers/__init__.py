"""Tiers and policy: admission, disk levels and the cascade."""

from stratastore.tiers.admission import Admission, Admitted, admit
from stratastore.tiers.disk import DiskLevel, LevelCounters, LevelRefused, open_cascade

__all__ = [
    "Admission",
    "DiskLevel",
    "LevelCounters",
    "LevelRefused",
    "Admitted",
    "admit",
    "open_cascade",
]
