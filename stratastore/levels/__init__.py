"""Levels as backends: the segment-backend protocol every level implements, and its parts.
The local directory store (``stratastore.levels.local.SegmentStore``) is the first implementation.
May import format/, io/, store/ and errors; never tiers/, restore/ or the surfaces."""

from stratastore.levels.backend import OpenSegment, Relocated, SegmentBackend, relocate_by_copy

__all__ = ["OpenSegment", "Relocated", "SegmentBackend", "relocate_by_copy"]
