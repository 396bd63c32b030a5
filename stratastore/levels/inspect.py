"""The one check of a committed directory segment that opening a store, fsck and ``strata
inspect`` share (spec F-SC, F-SEG, F-KEY-6).

:func:`inspect_segment` reads a segment's sidecar and, as far as it is asked to go, its data
file, and says what it found: the sidecar, the sizes of the two files and, for a damaged
segment, a :class:`SegmentDamage` naming the cause by its fsck finding
(:mod:`stratastore.levels.findings`). The checks, in order, each the last one when it fails:

1. the sidecar is read (at most ``MAX_SIDECAR_BYTES``) and decodes: ``SIDECAR_UNSUPPORTED``
   (a newer major version, F-COMPAT-1/2, or a keyed sidecar and no key), ``SIDECAR_UNAUTHENTICATED``
   (a keyed level's sidecar not keyed by one of its keys, F-KEYED-5), ``SIDECAR_CHECKSUM``
   (F-SC-2), ``SIDECAR_INVALID``
   (anything else, a failed read included); a model other than the caller's is refused with
   :class:`~stratastore.format.IncompatibleFingerprint` (the directory is another model's,
   F-DIR-6), not reported as damage;
2. its key is its name's: ``SIDECAR_KEY_MISMATCH`` (F-KEY-6);
3. the data file is there (``DATA_MISSING``), its header reads and decodes
   (``SEGMENT_HEADER_INVALID``, F-SEG-1), matches the sidecar (``SEGMENT_HEADER_MISMATCH``,
   F-SEG-2) and gives the file's size (``SEGMENT_SIZE_MISMATCH``, F-SEG-3);
4. its pages hash to the sidecar's digests (``PAGE_HASH_MISMATCH``, F-SC-3): the first and the
   last page, or every page. They are read with ``pread`` into memory this process owns
   (:class:`~stratastore.levels.reader.SegmentReader`), never mapped: a file truncated or failing
   meanwhile is damage, never a SIGBUS.

Opening a store stops after step 3 (no page is hashed, spec F-IDX-3) and raises the damage's
typed error (:attr:`SegmentDamage.error`: the one a reader of that file gets); fsck reports it
as a finding (:meth:`SegmentDamage.finding`). Nothing here writes, and the caller names the two
files (this module never builds a path: level implementations and io do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stratastore.errors import StrataError
from stratastore.format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    IndexRecord,
    KeyRequired,
    LevelKeys,
    ModelFingerprint,
    NotAuthenticated,
    Sidecar,
    UnsupportedVersion,
    data_name,
    decode_segment_header,
    decode_sidecar,
    sidecar_name,
)
from stratastore.format.sidecar import MAX_SIDECAR_BYTES
from stratastore.io import files
from stratastore.io.errors import ShortRead, StrataIOError
from stratastore.levels.findings import (
    DATA_MISSING,
    PAGE_HASH_MISMATCH,
    SEGMENT_HEADER_INVALID,
    SEGMENT_HEADER_MISMATCH,
    SEGMENT_SIZE_MISMATCH,
    SIDECAR_CHECKSUM,
    SIDECAR_INVALID,
    SIDECAR_KEY_MISMATCH,
    SIDECAR_UNAUTHENTICATED,
    SIDECAR_UNSUPPORTED,
    Finding,
    FindingKind,
)
from stratastore.levels.reader import SegmentReader, check_data

__all__ = ["Depth", "InspectedSegment", "SegmentDamage", "inspect_segment"]

#: how far :func:`inspect_segment` goes: the sidecar alone; also the data file's header and size
#: (what opening a store checks); also the first and the last page hashed (fsck); every page
#: hashed (fsck ``--deep``; a compressed segment is decoded only then)
Depth = Literal["sidecar", "header", "sample", "pages"]


@dataclass(frozen=True, slots=True)
class SegmentDamage:
    """Why a committed segment is not one a reader may use: ``kind`` (the finding that names
    the cause), ``path`` (the file at fault), ``detail`` (fsck's wording) and ``error`` (the
    typed error a reader of that file raises: a :class:`~stratastore.format.FormatError`,
    :class:`~stratastore.format.ChecksumMismatch`, :class:`~stratastore.io.errors.StrataIOError`,
    ...)."""

    kind: FindingKind
    path: str
    detail: str
    error: StrataError

    def finding(self) -> Finding:
        return self.kind.found(self.path, self.detail)


@dataclass(frozen=True, slots=True)
class InspectedSegment:
    """What :func:`inspect_segment` found: ``sidecar`` (None when it did not decode),
    ``sidecar_bytes`` and ``data_bytes`` (the files' sizes; 0 where not read) and ``damage``
    (None: whole as far as checked)."""

    key: bytes
    sidecar: Sidecar | None
    sidecar_bytes: int = 0
    data_bytes: int = 0
    damage: SegmentDamage | None = None

    def record(self) -> IndexRecord:
        """The index record derived from the segment (spec F-IDX-2); raises the damage's
        error for a damaged one."""
        if self.damage is not None:
            raise self.damage.error
        assert self.sidecar is not None
        return IndexRecord.from_sidecar(self.sidecar, self.sidecar_bytes, self.data_bytes)


def inspect_segment(
    key: bytes,
    sidecar_path: str,
    data_path: str,
    *,
    depth: Depth = "header",
    fingerprint: ModelFingerprint | None = None,
    data_listed: bool = True,
    sidecar: tuple[Sidecar, int] | None = None,
    by_path: bool = False,
    keys: LevelKeys | None = None,
    unchecked: bool = False,
) -> InspectedSegment:
    """Check the segment ``key`` whose sidecar and data file are at ``sidecar_path`` and
    ``data_path``, as far as ``depth`` (see the module for the checks, in order).

    ``fingerprint``: the model the caller serves; a sidecar of another model raises
    :class:`~stratastore.format.IncompatibleFingerprint`. ``data_listed=False``: the caller's
    listing holds no data file, ``DATA_MISSING`` without a read. ``sidecar``: the sidecar and
    its size, already read and checked by the caller through this function (a store's reads
    share that step): the check resumes at the data file. ``by_path``: errors name the files
    by their paths (fsck), else by their names (a store, whose errors name its directory).
    ``keys``: the level is keyed (spec F-KEYED), the sidecar must be keyed by one of them
    (``SIDECAR_UNAUTHENTICATED``); ``unchecked``: without ``keys``, a keyed sidecar is parsed
    without checking its trailer and its pages are not hashed (fsck without the key: it says
    so, ``KEYED_UNCHECKED``), else it is ``SIDECAR_UNSUPPORTED`` (no key to read it)."""
    side_label = sidecar_path if by_path else sidecar_name(key)
    data_label = data_path if by_path else data_name(key)
    if sidecar is None:
        got = _sidecar(key, sidecar_path, side_label, fingerprint, keys, unchecked)
        if got.damage is not None or depth == "sidecar":
            return got
        assert got.sidecar is not None
        sidecar = got.sidecar, got.sidecar_bytes
    sc, side_bytes = sidecar

    def damaged(kind: FindingKind, detail: str, error: StrataError) -> InspectedSegment:
        return InspectedSegment(
            key, sc, side_bytes, 0, SegmentDamage(kind, data_path, detail, error)
        )

    if not data_listed:
        detail = "the sidecar commits a data file that is gone"
        return damaged(DATA_MISSING, detail, FormatError(f"{data_label}: {detail}"))
    try:
        head, size = files.read_head(data_path, DATA_OFFSET)
        hdr = decode_segment_header(head, data_label)
    except StrataError as e:  # StrataIOError too
        return damaged(SEGMENT_HEADER_INVALID, str(e), e)
    try:
        check_data(sc, hdr, size)
    except FormatError as e:
        if not hdr.matches(sc):
            return damaged(SEGMENT_HEADER_MISMATCH, "header disagrees with its sidecar", e)
        return damaged(SEGMENT_SIZE_MISMATCH, f"{size} bytes, the header needs {hdr.file_bytes}", e)
    if depth in ("sample", "pages") and sc.authenticated:
        bad = _bad_page(data_path, sc, deep=depth == "pages")
        if bad is not None:
            return InspectedSegment(key, sc, side_bytes, size, bad)
    return InspectedSegment(key, sc, side_bytes, size)


def _sidecar(
    key: bytes,
    path: str,
    label: str,
    fingerprint: ModelFingerprint | None,
    keys: LevelKeys | None,
    unchecked: bool,
) -> InspectedSegment:
    """Steps 1 and 2: the sidecar at ``path`` read, decoded and checked against ``key``."""
    try:
        raw = files.read_file(path, MAX_SIDECAR_BYTES)
        sc = decode_sidecar(raw, label, keys=keys, unchecked=unchecked)
    except NotAuthenticated as e:
        return InspectedSegment(
            key, None, damage=SegmentDamage(SIDECAR_UNAUTHENTICATED, path, str(e), e)
        )
    except KeyRequired as e:  # a keyed sidecar and no key: not this reader's to judge
        return InspectedSegment(
            key, None, damage=SegmentDamage(SIDECAR_UNSUPPORTED, path, str(e), e)
        )
    except UnsupportedVersion as e:
        return InspectedSegment(
            key, None, damage=SegmentDamage(SIDECAR_UNSUPPORTED, path, str(e), e)
        )
    except ChecksumMismatch as e:
        return InspectedSegment(key, None, damage=SegmentDamage(SIDECAR_CHECKSUM, path, str(e), e))
    except StrataError as e:  # StrataIOError too: a link, a FIFO, a read that failed
        return InspectedSegment(key, None, damage=SegmentDamage(SIDECAR_INVALID, path, str(e), e))
    if fingerprint is not None:
        fingerprint.require_same(sc.fingerprint, label)
    if sc.key != key:
        error = FormatError(f"{label}: it holds key {sc.key.hex()}, not its name's")
        damage = SegmentDamage(SIDECAR_KEY_MISMATCH, path, f"it holds key {sc.key.hex()}", error)
        return InspectedSegment(key, sc, len(raw), damage=damage)
    return InspectedSegment(key, sc, len(raw))


def _bad_page(path: str, sc: Sidecar, *, deep: bool) -> SegmentDamage | None:
    """Step 4: the first bad page (every page with ``deep``, else the first and the last), read
    through a :class:`SegmentReader` (``pread``, never a mapping), so a file truncated or failing
    meanwhile is damage: ``SEGMENT_SIZE_MISMATCH`` when it ends early or no longer matches what
    was checked, ``PAGE_HASH_MISMATCH`` when its pages cannot be read (they cannot be validated),
    ``SEGMENT_HEADER_INVALID`` when its header changed into one that fails its checksum."""
    if sc.codec is not Codec.RAW and not deep:
        return None  # decoding a compressed segment is the deep check
    try:
        with SegmentReader(sc, path) as seg:
            bad = seg.first_bad_page(sample=not deep)
    except (ShortRead, FormatError) as e:
        return SegmentDamage(SEGMENT_SIZE_MISMATCH, path, f"changed while fsck read it: {e}", e)
    except StrataIOError as e:
        return SegmentDamage(PAGE_HASH_MISMATCH, path, f"its pages could not be read: {e}", e)
    except StrataError as e:
        return SegmentDamage(SEGMENT_HEADER_INVALID, path, f"changed while fsck read it: {e}", e)
    if bad < 0:
        return None
    detail = f"page {bad} fails BLAKE3 validation" + ("" if deep else " (sampled)")
    return SegmentDamage(PAGE_HASH_MISMATCH, path, detail, StrataError(f"{path}: {detail}"))
