"""Tiers and policy: admission, disk levels and the cascade."""

from stratastore.tiers.admission import Admission, Admitted, admit
from stratastore.tiers.disk import DiskLevel, LevelCounters, LevelRefused

__all__ = ["Admission", "DiskLevel", "LevelCounters", "LevelRefused", "Admitted", "admit"]
