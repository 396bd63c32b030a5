"""Typed errors of the pure format layer (format-spec/SPEC.md, clauses F-*)."""

from __future__ import annotations

from ..errors import StrataError

__all__ = [
    "ChecksumMismatch",
    "FormatError",
    "IncompatibleFingerprint",
    "UnsupportedVersion",
]


class FormatError(StrataError):
    """Bytes that do not parse as the structure they claim to be (truncated, garbage, bad size)."""


class UnsupportedVersion(FormatError):
    """A newer major version or an unknown required feature: this reader must refuse it."""


class ChecksumMismatch(StrataError):
    """A BLAKE3 digest differs from the one recorded for the object.

    ``expected`` and ``actual`` are the two digests; ``page`` is the page index when the object
    is a page, else ``None``.
    """

    def __init__(self, obj: str, expected: bytes, actual: bytes, page: int | None = None) -> None:
        self.obj = obj
        self.expected = expected
        self.actual = actual
        self.page = page
        where = f"{obj} page {page}" if page is not None else obj
        super().__init__(
            f"{where}: BLAKE3 mismatch (expected {expected.hex()[:16]}..., got "
            f"{actual.hex()[:16]}...); the stored bytes are damaged: delete this segment "
            "and store it again"
        )


class IncompatibleFingerprint(StrataError):
    """Bytes written for another model (geometry, dtype, page size or model identity differ)."""
