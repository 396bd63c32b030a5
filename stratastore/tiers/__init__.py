"""Tiers and policy (DESIGN layer 5): admission, disk levels and the cascade."""

from .admission import Admission, Placement, admit
from .disk import DiskLevel, LevelCounters, LevelRefused

__all__ = ["Admission", "DiskLevel", "LevelCounters", "LevelRefused", "Placement", "admit"]
