"""Reading a committed segment into memory the caller owns (spec F-SC-3; DESIGN "Delivered
means validated").

A :class:`SegmentReader` holds a segment's data file open, checked against its sidecar, and
``pread``s the stored payload into buffers the caller owns. Data files are never mapped: a file
truncated, replaced or failing under a reader is a typed error at the read
(:class:`~stratastore.io.errors.ShortRead`, :class:`~stratastore.io.errors.StrataIOError`),
never a SIGBUS at a later access. Validation hashes the bytes in that memory (RAW pages staged a
chunk at a time in :data:`~stratastore.levels.staging.STAGING`, compressed pages decoded one at a
time) and delivers only pages that match their sidecar digests: the bytes hashed are the bytes
delivered; each page is hashed with its sidecar's own hasher (``sidecar.hasher``: plain
BLAKE3, or the key of the keyed level that checked the sidecar, spec F-KEYED). The store's
reads (``SegmentStore.get_into``, ``view``, ``verify``), the restore's read pass and fsck's
page check all read through it.

:func:`open_checked` is how every read above the level seam opens a segment (the restore's read
pass, its running-state read, a chunk store's read, the generic relocation): whatever a backend
answers, its sidecar is checked (its fields, its model, its key, its kind and token range: spec
F-READ-1 steps 7 and 8) before a byte of the segment is read, so a backend that answers one key
with another key's segment, valid as that is, delivers nothing of it (DESIGN "Trust that does
not depend on the backend"). Its pages are then hashed against that sidecar as they are read.

:class:`PayloadReader` is what every backend's reader shares (the protocol
:class:`~stratastore.levels.backend.OpenSegment`): range checks (:class:`OutOfRange`), decoding
and validation over one positional read that each backend implements (``pread`` here).
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Generator
from types import TracebackType
from typing import TYPE_CHECKING, Self

import numpy as np
import numpy.typing as npt
import zstandard

import numba_kernels
from stratastore.format import (
    DATA_OFFSET,
    ChecksumMismatch,
    Codec,
    FormatError,
    Kind,
    ModelFingerprint,
    SegmentHeader,
    Sidecar,
    data_name,
    decode_segment_header,
)
from stratastore.io import files, read_ahead
from stratastore.levels.errors import StoreError
from stratastore.levels.staging import STAGING

if TYPE_CHECKING:
    from stratastore.levels.backend import OpenSegment, SegmentBackend

__all__ = [
    "OutOfRange",
    "PayloadReader",
    "SegmentReader",
    "check_answer",
    "check_data",
    "copy_validated",
    "decoded_pages",
    "first_bad_page",
    "get_checked_bytes",
    "open_checked",
    "payload_bytes",
    "require_valid",
    "validate_stored",
]


def check_answer(
    sc: Sidecar,
    key: bytes,
    fingerprint: ModelFingerprint,
    where: str,
    *,
    kind: Kind | None = None,
    tokens: tuple[int, int] | None = None,
) -> None:
    """Check the sidecar a level at ``where`` answered for segment ``key`` before any of its
    bytes is read (spec F-READ-1): its fields (step 7, F-SC-6), then its identity (step 8): the
    model ``fingerprint``, the key (F-KEY-6), and, when given, its ``kind`` and its token range
    ``tokens`` (``[start, end)``, what the manifest or the checkpoint says it holds). Every
    mismatch is a :class:`FormatError`: damage in that level (a miss, a ladder stop), never the
    caller's mistake; another model's segment too, in a level opened for this model."""
    obj = f"segment {key.hex()[:16]} in {where}"
    sc.validate(obj)
    if sc.fingerprint != fingerprint:
        raise FormatError(
            f"{obj}: the level answered with a segment of {sc.fingerprint.describe()}, not of "
            f"{fingerprint.describe()} (damaged or misplaced: strata fsck finds it)"
        )
    if sc.key != key:
        raise FormatError(
            f"{obj}: the level answered with a sidecar that names segment {sc.key.hex()[:16]} "
            "(damaged or misplaced, spec F-KEY-6: strata fsck finds it)"
        )
    if kind is not None and sc.kind is not kind:
        raise FormatError(
            f"{obj} is a {sc.kind.name} segment where a {kind.name} one was asked for "
            "(damaged or misplaced)"
        )
    if tokens is not None and (sc.token_start, sc.token_end) != tokens:
        raise FormatError(
            f"{obj} holds tokens [{sc.token_start}, {sc.token_end}), its manifest says "
            f"[{tokens[0]}, {tokens[1]})"
        )


def open_checked(
    backend: SegmentBackend,
    key: bytes,
    fingerprint: ModelFingerprint,
    *,
    kind: Kind | None = None,
    tokens: tuple[int, int] | None = None,
) -> OpenSegment:
    """``backend.open_reader(key)`` with the answer checked above the seam
    (:func:`check_answer`; closed again when it fails): what every read that delivers a
    segment's bytes opens it with, whatever the backend. Raises what ``open_reader`` raises
    (:class:`~stratastore.levels.errors.SegmentNotFound` for a key not held) and
    :class:`FormatError` for an answer that is not the segment asked for."""
    seg = backend.open_reader(key)
    try:
        check_answer(seg.sidecar, key, fingerprint, backend.path, kind=kind, tokens=tokens)
    except BaseException:
        seg.close()
        raise
    return seg


def get_checked_bytes(
    backend: SegmentBackend,
    key: bytes,
    fingerprint: ModelFingerprint,
    *,
    max_bytes: int,
    kind: Kind | None = None,
    tokens: tuple[int, int] | None = None,
) -> bytes:
    """The validated payload of segment ``key`` as bytes, read above the seam: opened by
    :func:`open_checked`, every page hashed in this process's memory before it is copied out
    (:func:`copy_validated`; spec F-SC-3). :class:`StoreError` before allocating a payload over
    ``max_bytes``."""
    with open_checked(backend, key, fingerprint, kind=kind, tokens=tokens) as seg:
        return payload_bytes(seg, max_bytes)


def payload_bytes(seg: OpenSegment, max_bytes: int) -> bytes:
    """The validated payload of the open segment ``seg`` as bytes (:func:`copy_validated`);
    :class:`StoreError` before allocating one over ``max_bytes``."""
    sc = seg.sidecar
    if sc.payload_bytes > max_bytes:
        raise StoreError(
            f"segment {sc.key.hex()} holds {sc.payload_bytes:,} bytes, over the "
            f"{max_bytes:,} this read allows"
        )
    out = bytearray(sc.payload_bytes)
    copy_validated(seg, memoryview(out), True)
    return bytes(out)


def check_data(sc: Sidecar, hdr: SegmentHeader, size: int) -> None:
    """Check a data file's header against its sidecar (spec F-SEG-2) and its size against its
    header (F-SEG-3); raises :class:`FormatError`."""
    name = data_name(sc.key)
    if not hdr.matches(sc):
        raise FormatError(f"{name}: header does not match its sidecar (spec F-SEG-2)")
    if size != hdr.file_bytes:
        raise FormatError(
            f"{name}: {size} bytes, its header needs {hdr.file_bytes} (truncated or padded)"
        )


class OutOfRange(StoreError, IndexError):
    """A read of bytes past the end of a segment's stored payload (or before its start)."""


class PayloadReader:
    """A committed segment open for reads of its *stored payload* (RAW: the pages; ZSTD: the
    frames, spec F-SEG-4) into memory the caller owns; the base of every backend's reader.

    A backend implements :meth:`_read_at` (fill a byte view from an offset of the stored
    payload, all of it or a typed error) and :meth:`close`; the reads the restore path and the
    store's validated reads use (:meth:`read_into`, :meth:`readv_into`, :meth:`pages`,
    :meth:`copy_validated`, :meth:`first_bad_page`) are built here on it. Ranges are checked
    against the sidecar's ``stored_bytes`` first (:class:`OutOfRange`).
    """

    sidecar: Sidecar

    def _read_at(self, view: memoryview, offset: int) -> None:
        raise NotImplementedError

    def _readv_at(self, views: list[memoryview], offset: int) -> None:
        for v in views:
            self._read_at(v, offset)
            offset += v.nbytes

    def _check_range(self, offset: int, nbytes: int) -> None:
        if offset < 0 or offset + nbytes > self.sidecar.stored_bytes:
            raise OutOfRange(
                f"segment {self.sidecar.key.hex()}: bytes [{offset}, {offset + nbytes}) are "
                f"outside its {self.sidecar.stored_bytes} stored bytes"
            )

    def read_into(self, buf: npt.NDArray[np.uint8] | memoryview, offset: int = 0) -> None:
        """Fill all of ``buf`` with the stored payload from byte ``offset`` (RAW: the pages;
        ZSTD: the frames); not validated. :class:`OutOfRange` past the end."""
        view = buf if isinstance(buf, memoryview) else buf.data
        self._check_range(offset, view.nbytes)
        self._read_at(view, offset)

    def readv_into(self, bufs: list[memoryview], offset: int = 0) -> None:
        """Fill ``bufs`` in turn (a scatter read) with the stored payload from byte ``offset``."""
        self._check_range(offset, sum(b.nbytes for b in bufs))
        self._readv_at(bufs, offset)

    def advise(self, offset: int, nbytes: int) -> None:
        """A hint that stored bytes ``[offset, offset + nbytes)`` (clipped to the payload) are
        read soon: a reader over a kernel's page cache has them read into it meanwhile, off the
        calling thread (:mod:`stratastore.io.read_ahead`: the restore's read-ahead), so the
        read finds them there. Never raises; the base does nothing."""

    def stored(self) -> npt.NDArray[np.uint8]:
        """The whole stored payload, in new memory."""
        out = np.empty(self.sidecar.stored_bytes, dtype=np.uint8)
        self.read_into(out)
        return out

    def pages(self, pages: int | None = None) -> npt.NDArray[np.uint8]:
        """The first ``pages`` pages (default all), not validated, in new memory: read for RAW,
        decompressed for ZSTD (a frame that does not decode left as zeros)."""
        sc = self.sidecar
        n = sc.page_count if pages is None else max(0, min(pages, sc.page_count))
        nbytes = (n - 1) * sc.page_bytes + sc.page_len(n - 1) if n else 0
        if sc.codec is not Codec.RAW:
            return _decode_prefix(sc, self.stored(), n, nbytes)
        out = np.empty(nbytes, dtype=np.uint8)
        self.read_into(out)
        return out

    def copy_validated(self, dst: memoryview, verify: bool) -> None:
        """Fill ``dst`` (``payload_bytes`` long) with the pages; with ``verify`` only pages that
        match their digests reach it (raises :class:`ChecksumMismatch` at the first that
        does not)."""
        copy_validated(self, dst, verify)

    def first_bad_page(self, *, sample: bool = False) -> int:
        """The first page that fails its sidecar digest, or -1, read into memory this process
        owns (a RAW segment staged a chunk at a time). ``sample`` checks only the first and the
        last page of a RAW segment (fsck's quick mode); a compressed one is decoded whole."""
        sc = self.sidecar
        if sc.codec is not Codec.RAW:
            return first_bad_page(sc, self.stored())
        if not sample:
            return _first_bad_raw(self)
        for i in sorted({0, sc.page_count - 1}):
            page = np.empty(sc.page_len(i), dtype=np.uint8)
            self.read_into(page, i * sc.page_bytes)
            if numba_kernels.hash_page(page.data, sc.hasher.key) != sc.page_hash(i):
                return i
        return -1

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SegmentReader(PayloadReader):
    """A committed segment's data file held open for reads into memory the caller owns (spec
    F-SC-3; DESIGN "Delivered means validated").

    Opening opens the data file ``path`` of the committed segment ``sidecar``; its header and
    size (:func:`check_data`) are checked on that open descriptor (a rename over the name later
    cannot change what is read) before any byte of the payload is handed back: at the open
    when the file's size is not the usual header block and the payload, else at the first read,
    which then reads the header and the pages in one call (:meth:`read_whole`). Reads ``pread``
    into the caller's buffer: never a mapping, so a file truncated, replaced or failing under
    the reader is a typed error at the read (:class:`~stratastore.io.errors.ShortRead`,
    :class:`StrataIOError`), never a SIGBUS at a later access.
    """

    def __init__(self, sidecar: Sidecar, path: str) -> None:
        self.sidecar = sidecar
        self.path = path
        self._fd = files.open_read(self.path)
        self._start = DATA_OFFSET
        self._head_checked = False
        try:
            self._size = files.fd_size(self._fd, self.path)
            if self._size - sidecar.stored_bytes != DATA_OFFSET:
                # not the usual layout: the header says what it is, now
                self._check_head(bytearray(min(DATA_OFFSET, self._size)))
        except BaseException:
            self.close()
            raise

    def _check_head(self, head: bytearray | memoryview, *, read: bool = True) -> None:
        """Check the header in ``head`` (read into it first with ``read``) against the sidecar
        and the file's size."""
        if read:
            files.pread_exact(self._fd, memoryview(head), 0, self.path)
        hdr = decode_segment_header(bytes(head), data_name(self.sidecar.key))
        check_data(self.sidecar, hdr, self._size)
        self._start = hdr.data_offset
        self._head_checked = True

    def _read_at(self, view: memoryview, offset: int) -> None:
        if not self._head_checked:
            self._check_head(bytearray(DATA_OFFSET))
        files.pread_exact(self._fd, view, self._start + offset, self.path)

    def _readv_at(self, views: list[memoryview], offset: int) -> None:
        if not self._head_checked:
            self._check_head(bytearray(DATA_OFFSET))
        files.preadv_exact(self._fd, views, self._start + offset, self.path)

    def read_whole(self, dst: memoryview) -> None:
        """Fill ``dst`` (exactly the stored payload's size) with the stored payload, not
        validated, in one read with the header when it is not checked yet (checked before this
        returns: a header that fails raises, and ``dst`` then holds bytes no one may use). The
        read goes past the page cache when the bytes are not in it and ``dst`` allows it
        (:func:`~stratastore.io.files.preadv_uncached`)."""
        self._check_range(0, dst.nbytes)
        if dst.nbytes != self.sidecar.stored_bytes:
            raise OutOfRange(
                f"segment {self.sidecar.key.hex()}: a whole read fills {self.sidecar.stored_bytes} "
                f"bytes, not {dst.nbytes}"
            )
        if self._head_checked:
            files.preadv_uncached(self._fd, [dst], self._start, self.path)
            return
        head = _head_block()
        files.preadv_uncached(self._fd, [head, dst], 0, self.path)
        self._check_head(head, read=False)

    def advise(self, offset: int, nbytes: int) -> None:
        end = min(offset + nbytes, self.sidecar.stored_bytes)
        if self._fd >= 0 and 0 <= offset < end:
            read_ahead.ask(self._fd, self._start + offset, end - offset)

    def close(self) -> None:
        if self._fd >= 0:
            files.close(self._fd)
            self._fd = -1


_HEADS = threading.local()


def _head_block() -> memoryview:
    """This thread's page-aligned block the size of a data file's header block (a direct read
    of the header with the pages needs aligned memory; an anonymous mapping is). Private: a
    process forked from this thread gets its own copy at its first write, never the parent's
    memory (a shared mapping would let a child's header land in a parent's check)."""
    block: memoryview | None = getattr(_HEADS, "block", None)
    if block is None:
        mem = mmap.mmap(-1, DATA_OFFSET, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        block = _HEADS.block = memoryview(mem)
    return block


#: a verified read stages (and hashes) this many bytes at a time
_STAGE_BYTES = 16 << 20


def _stage_step(sc: Sidecar) -> int:
    return max(1, _STAGE_BYTES // sc.page_bytes) * sc.page_bytes


_Staged = Generator[tuple[int, npt.NDArray[np.uint8], npt.NDArray[np.uint8]], None, None]


def _staged(seg: OpenSegment) -> _Staged:
    """The payload of a RAW segment read into reusable staging memory, a bounded chunk of whole
    pages at a time: ``(first page, the chunk, the digests the sidecar records for its pages)``.
    The chunk is valid until the next step."""
    sc = seg.sidecar
    expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)
    step = _stage_step(sc)
    stage = STAGING.take(min(step, sc.payload_bytes))
    try:
        for a in range(0, sc.payload_bytes, step):
            chunk = stage[: min(step, sc.payload_bytes - a)]
            ahead = a + 2 * step if a else 0  # the chunk two ahead (at first: the first three)
            seg.advise(ahead, a + 3 * step - ahead)  # read while the chunks before are hashed
            seg.read_into(chunk, a)
            p0 = a // sc.page_bytes
            yield p0, chunk, expected[p0 : p0 - (-chunk.size // sc.page_bytes)]
    finally:
        STAGING.give(stage)


def copy_validated(seg: OpenSegment, dst: memoryview, verify: bool) -> None:
    """Fill ``dst`` (``payload_bytes`` long) with the pages of the open segment ``seg`` (any
    backend's: only its stored-byte reads are used, the hashing is done here). With ``verify``,
    RAW pages go through staging memory: read, hashed, and copied from that memory only if they
    match (a page that fails never reaches ``dst``: :class:`ChecksumMismatch`); compressed
    pages are decoded one at a time and validated before they are copied."""
    sc = seg.sidecar
    if sc.codec is not Codec.RAW:
        _decompress_into(sc, seg.stored(), dst, verify)
        return
    if not verify:
        seg.read_into(dst)
        return
    with contextlib.closing(_staged(seg)) as chunks:  # staging goes back on any exit
        for p0, chunk, want in chunks:
            a = p0 * sc.page_bytes
            bad = numba_kernels.validated_copy(
                chunk, dst[a : a + chunk.size], sc.page_bytes, want, sc.hasher.key
            )
            if bad >= 0:
                _raise_page(sc, chunk, bad, p0)


def _first_bad_raw(seg: OpenSegment) -> int:
    """The first page of a RAW segment that fails its digest (-1: none), hashed in staging."""
    with contextlib.closing(_staged(seg)) as chunks:  # staging goes back on any exit
        for p0, chunk, want in chunks:
            sc = seg.sidecar
            actual = numba_kernels.page_hashes(chunk, sc.page_bytes, key=sc.hasher.key)
            bad = np.flatnonzero((actual != want).any(axis=1))
            if bad.size:
                return p0 + int(bad[0])
    return -1


def _raise_page(sc: Sidecar, payload: npt.NDArray[np.uint8], page: int, first: int = 0) -> None:
    """Raise :class:`ChecksumMismatch` for page ``first + page`` of the segment, which is page
    ``page`` of ``payload`` (pages ``first..`` of it)."""
    a = page * sc.page_bytes
    actual = numba_kernels.hash_page(payload[a : a + sc.page_len(first + page)].data, sc.hasher.key)
    raise ChecksumMismatch(data_name(sc.key), sc.page_hash(first + page), actual, first + page)


def _decode_prefix(
    sc: Sidecar, stored: npt.NDArray[np.uint8], n: int, nbytes: int
) -> npt.NDArray[np.uint8]:
    """The first ``n`` pages (``nbytes``) of a ZSTD segment, decompressed, not validated: a
    frame that does not decode (or decodes to the wrong size) ends the decoding, leaving that
    page and the ones after it zeros (so they fail validation)."""
    out = np.zeros(nbytes, dtype=np.uint8)
    dctx = zstandard.ZstdDecompressor()
    for i, off in enumerate(sc.stored_offsets()[:n]):
        want = sc.page_len(i)
        try:
            page = dctx.decompress(
                stored[off : off + sc.stored_lengths[i]].tobytes(), max_output_size=want
            )
        except zstandard.ZstdError:
            break
        if len(page) != want:
            break
        out[i * sc.page_bytes : i * sc.page_bytes + want] = np.frombuffer(page, np.uint8)
    return out


def decoded_pages(sc: Sidecar, stored: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """A segment's pages from its whole stored payload: the payload itself for RAW, decoded
    for ZSTD (not validated here: validate the stored payload first)."""
    if sc.codec is Codec.RAW:
        return stored
    return _decode_prefix(sc, stored, sc.page_count, sc.payload_bytes)


def first_bad_page(sc: Sidecar, payload: npt.NDArray[np.uint8], *, sample: bool = False) -> int:
    """The first page of ``payload`` (a data file's pages) that fails its sidecar digest, or -1.
    ``sample`` checks only the first and the last page of a RAW segment (fsck's quick mode); a
    compressed segment is always decoded whole."""
    if sc.codec is not Codec.RAW:
        try:
            _decompress_into(sc, payload, None, True)
        except ChecksumMismatch as e:
            return e.page if e.page is not None else 0
        return -1
    expected = np.frombuffer(sc.page_hashes, dtype=np.uint8).reshape(-1, 32)
    if not sample:
        actual = numba_kernels.page_hashes(payload, sc.page_bytes, key=sc.hasher.key)
        bad = np.flatnonzero((actual != expected).any(axis=1))
        return int(bad[0]) if bad.size else -1
    for i in sorted({0, sc.page_count - 1}):
        a = i * sc.page_bytes
        page = payload[a : a + sc.page_len(i)].data
        if numba_kernels.hash_page(page, sc.hasher.key) != expected[i].tobytes():
            return i
    return -1


def _decompress_into(
    sc: Sidecar, payload: npt.NDArray[np.uint8], dst: memoryview | None, verify: bool
) -> None:
    """Decompress each zstd page (bounded by its recorded size), validate it, then copy it into
    ``dst`` (``None``: validate only). One page is held in memory at a time."""
    dctx = zstandard.ZstdDecompressor()
    name = data_name(sc.key)
    for i, off in enumerate(sc.stored_offsets()):
        frame = payload[off : off + sc.stored_lengths[i]]
        want = sc.page_len(i)
        try:
            page = dctx.decompress(frame.tobytes(), max_output_size=want)
        except zstandard.ZstdError as e:
            raise ChecksumMismatch(name, sc.page_hash(i), b"\0" * 32, i) from e
        actual = numba_kernels.hash_page(page, sc.hasher.key) if verify else sc.page_hash(i)
        if len(page) != want or actual != sc.page_hash(i):
            raise ChecksumMismatch(name, sc.page_hash(i), actual, i)
        if dst is not None:
            a = i * sc.page_bytes
            dst[a : a + want] = page


def require_valid(sc: Sidecar, payload: npt.NDArray[np.uint8]) -> None:
    """Raise :class:`ChecksumMismatch` for the first page of ``payload`` (all of a segment's
    pages) that fails its digest."""
    bad = first_bad_page(sc, payload)
    if bad >= 0:
        _raise_page(sc, payload, bad)


def read_pages_checked(seg: OpenSegment, dst: memoryview) -> None:
    """Fill ``dst`` (exactly the payload's size) with the pages of the RAW segment ``seg`` and
    hash each in that memory (spec F-SC-3): :class:`ChecksumMismatch` for the first page that
    fails. A file (:class:`SegmentReader`) is read in one call with its header
    (:meth:`SegmentReader.read_whole`: past the page cache when it is not there, so loads on
    several threads at once keep the disk busy and copy nothing); a remote level reads the
    whole payload in one call likewise."""
    sc = seg.sidecar
    if isinstance(seg, SegmentReader):
        seg.read_whole(dst)
    else:
        seg.read_into(dst)
    arr = np.frombuffer(dst, dtype=np.uint8)
    for i in range(sc.page_count):
        a = i * sc.page_bytes
        if numba_kernels.hash_page(dst[a : a + sc.page_len(i)], sc.hasher.key) != sc.page_hash(i):
            _raise_page(sc, arr, i)


def validate_stored(sc: Sidecar, stored: npt.NDArray[np.uint8]) -> None:
    """Raise :class:`ChecksumMismatch` for the first page of a segment's whole *stored*
    payload (RAW pages or ZSTD frames) that fails its digest (spec F-SC-3)."""
    if sc.codec is Codec.RAW:
        require_valid(sc, stored)
    else:
        _decompress_into(sc, stored, None, True)
