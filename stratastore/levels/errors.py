"""Typed errors of the segment store."""

from __future__ import annotations

from stratastore.errors import StrataError

__all__ = ["SegmentNotFound", "StoreError"]


class StoreError(StrataError):
    """A store directory cannot be used as asked (wrong filesystem, bad index, bad argument)."""


class SegmentNotFound(StoreError, KeyError):
    """No committed segment has that key in this directory."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])
