"""Tiers and policy: admission, and the disk levels' cascade the conversation flow runs on (the
cascade itself is :mod:`stratastore.levels.cascade`, shared with the chunk store)."""

from stratastore.levels.cascade import DiskLevel, LevelCounters, LevelRefused, open_cascade
from stratastore.tiers.admission import Admission, Admitted, admit

__all__ = [
    "Admission",
    "DiskLevel",
    "LevelCounters",
    "LevelRefused",
    "Admitted",
    "admit",
    "open_cascade",
]
