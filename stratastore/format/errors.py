"""Typed errors of the pure format layer (format-spec/SPEC.md, clauses F-*)."""

from __future__ import annotations

from stratastore.errors import StrataError

__all__ = [
    "ChecksumMismatch",
    "FormatError",
    "IncompatibleFingerprint",
    "KeyMismatch",
    "KeyRequired",
    "NotAuthenticated",
    "UnsupportedVersion",
]


class FormatError(StrataError):
    """Bytes that do not parse as the structure they claim to be (truncated, garbage, bad size)."""


class UnsupportedVersion(FormatError):
    """A newer major version or an unknown required feature: this reader must refuse it."""


class KeyRequired(UnsupportedVersion):
    """A keyed sidecar (spec F-KEYED-3) read by a reader given no level key: it cannot check
    it, so it refuses it (as a reader of an older version refuses the required feature)."""


class KeyMismatch(FormatError):
    """A recorded key is not the key its own content derives (spec F-CHAIN-2, F-CHAIN-6,
    F-KEY-2): a record that would make a reader serve another prefix's K/V or state as this
    one's. ``what`` names the item (a segment and its token range, or a checkpoint's state),
    ``recorded`` is the key the record names, ``derived`` the key its content derives (empty
    when nothing can derive one, e.g. a state at a length where no segment ends).
    """

    def __init__(self, obj: str, what: str, recorded: bytes, derived: bytes) -> None:
        self.obj = obj
        self.what = what
        self.recorded = recorded
        self.derived = derived
        got = f"its content derives {derived.hex()[:16]}..." if derived else "nothing derives it"
        super().__init__(
            f"{obj}: {what} is recorded under key {recorded.hex()[:16]}..., but {got} "
            "(spec F-CHAIN-2); the record is refused: park the conversation again, or run "
            "`strata fsck --repair --yes` to quarantine it"
        )


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
        want, got = _differing_hex(expected, actual)
        super().__init__(
            f"{where}: BLAKE3 mismatch (expected {want}, got {got}); the stored bytes are "
            "damaged: delete this segment and store it again"
        )


def _differing_hex(a: bytes, b: bytes, *, least: int = 16, past: int = 8) -> tuple[str, str]:
    """``a`` and ``b`` in hex, each cut (``...``) after ``least`` digits or ``past`` digits
    past their first difference, whichever is later: two digests never read the same."""
    ha, hb = a.hex(), b.hex()
    first = next(
        (i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y), min(len(ha), len(hb))
    )
    n = max(least, first + past)

    def cut(h: str) -> str:
        return h if len(h) <= n else h[:n] + "..."

    return cut(ha), cut(hb)


class IncompatibleFingerprint(StrataError):
    """Bytes written for another model (geometry, dtype, page size or model identity differ)."""


class NotAuthenticated(ChecksumMismatch):
    """A sidecar a keyed level does not accept (spec F-KEYED-5): written without a key, or
    keyed by a key that is not one of the level's. Damage for a reader (a miss, the ladder),
    like any digest that does not match; the message names the key ids, never a key."""

    def __init__(self, obj: str, why: str) -> None:
        self.obj = obj
        self.expected = b""
        self.actual = b""
        self.page = None
        StrataError.__init__(
            self,
            f"{obj}: {why}; a keyed level accepts only sidecars keyed by one of its keys "
            "(spec F-KEYED-5): the segment is not delivered. If the level's keys were "
            "rotated, add the old key to key_file after the new one",
        )
