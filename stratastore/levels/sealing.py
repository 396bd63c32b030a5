"""Sealing a payload into a segment, with no I/O: what every segment backend does before it
stores anything (spec F-KEY, F-SEG-4, F-SC).

A put is checked and keyed (:func:`kv_segment`, :func:`state_segment`: the key of spec F-KEY-2
or F-KEY-5, the page size, the payload length), its pages encoded (:func:`encode`: RAW pages as
they are, ZSTD one frame per page) and hashed (BLAKE3 per page of the *payload*, spec F-SC-3;
not here when the put brings its pages' digests, hashed on the device), and
its sidecar built (:func:`sidecar_for`). :func:`seal` does the three in one call for a
backend that keeps the stored bytes in memory; the directory store overlaps the hashing with its
file write instead. :func:`check_sealed` is the other direction: a sealed segment handed over by
another level, checked before it is stored again, and :func:`rekeyed` gives it the digests
of the level that stores it.

A keyed level (spec F-KEYED) seals with its writer's key: the put carries it
(:attr:`Unsealed.hasher`), its pages are hashed with it (on the CPU: digests a put brings from
the device are plain BLAKE3 and are dropped, :meth:`Unsealed.keyed`), and the sidecar records
its key id and is keyed too.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import zstandard

import numba_kernels
from numba_kernels import DIGEST_BYTES
from stratastore.format import (
    PLAIN,
    Codec,
    FormatError,
    Kind,
    Level,
    MediaRef,
    ModelFingerprint,
    PageHasher,
    Sidecar,
    segment_key,
    sidecar_name,
    state_key,
)
from stratastore.format.sidecar import KEYED_MINOR, MINOR
from stratastore.levels.errors import StoreError
from stratastore.levels.reader import decoded_pages, validate_stored

__all__ = [
    "STATE_PAGE_BYTES",
    "Buffer",
    "Encoded",
    "PageSource",
    "Payload",
    "Unsealed",
    "byte_view",
    "check_sealed",
    "encode",
    "kv_segment",
    "rekeyed",
    "seal",
    "sidecar_for",
    "state_segment",
]

#: page size of running-state segments (their pages are not tied to tokens)
STATE_PAGE_BYTES = 1 << 20
_ZSTD_LEVEL = 1

Buffer = npt.NDArray[np.uint8] | bytes | bytearray | memoryview


class PageSource(abc.ABC):
    """A segment's payload that is not one buffer: its pages gathered on demand from where
    they are kept (a park from the engine's own layout, :mod:`stratastore.restore.gather`).
    A put streams it (:mod:`.streamed`): a bounded run of pages at a time is gathered into
    staging, hashed there and written from there, so the payload is never copied whole. The
    bytes must not change while the put runs (they are the engine's until it returns)."""

    #: the payload's length in bytes
    nbytes: int

    @abc.abstractmethod
    def gather_into(self, offset: int, out: npt.NDArray[np.uint8]) -> None:
        """Copy bytes ``[offset, offset + out.size)`` of the payload into ``out``;
        ``offset`` is a page boundary."""

    def materialize(self) -> npt.NDArray[np.uint8]:
        """The whole payload in one new buffer (a backend that keeps or ships it whole)."""
        out = np.empty(self.nbytes, dtype=np.uint8)
        self.gather_into(0, out)
        return out


#: what a put takes: the payload's bytes, or a source of its pages
Payload = Buffer | PageSource


def byte_view(buf: Buffer) -> memoryview:
    """``buf`` as a flat byte view; a non-contiguous buffer is refused with :class:`StoreError`
    (a copy here would hide a caller's layout bug and double the memory)."""
    view = buf.data if isinstance(buf, np.ndarray) else memoryview(buf)
    if not view.c_contiguous:
        raise StoreError("payload buffers must be C-contiguous; pass np.ascontiguousarray(x)")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


@dataclass(frozen=True, slots=True)
class Unsealed:
    """A put, checked and keyed, not yet encoded: the payload's pages and what the sidecar
    says about them. ``hashes``: the ``(pages, 32)`` digests of the payload's pages when the
    caller brought them (:func:`kv_segment`'s ``page_hashes``), else ``None`` (hashed here)."""

    key: bytes
    kind: Kind
    parent: bytes
    token_start: int
    token_end: int
    page_bytes: int
    payload: memoryview | PageSource
    media: tuple[MediaRef, ...] = ()
    hashes: npt.NDArray[np.uint8] | None = None
    #: what its pages and sidecar are hashed with: plain BLAKE3, or a keyed level's key
    hasher: PageHasher = PLAIN

    def keyed(self, hasher: PageHasher) -> Unsealed:
        """This put sealed with ``hasher`` (a keyed level's writer, spec F-KEYED). Digests the
        put brought (plain BLAKE3, hashed on the device) are dropped: a keyed level hashes on
        the CPU."""
        if hasher == self.hasher:
            return self
        return replace(self, hasher=hasher, hashes=None)

    @property
    def size(self) -> int:
        """The payload's length in bytes."""
        p = self.payload
        return p.nbytes if isinstance(p, PageSource) else len(p)

    @property
    def page_count(self) -> int:
        return -(-self.size // self.page_bytes)

    def in_memory(self) -> Unsealed:
        """This put with its payload in one buffer (a :class:`PageSource` gathered whole)."""
        if not isinstance(self.payload, PageSource):
            return self
        return replace(self, payload=byte_view(self.payload.materialize()))


def kv_segment(
    fp: ModelFingerprint,
    parent_key: bytes,
    tokens: Sequence[int] | npt.NDArray[np.integer],
    payload: Payload,
    *,
    token_start: int,
    media: Sequence[MediaRef] = (),
    page_hashes: npt.NDArray[np.uint8] | None = None,
) -> Unsealed:
    """The K/V segment of ``tokens`` after the prefix ``parent_key`` (spec F-KEY-2, F-SEG-4);
    :class:`StoreError` for no tokens, a payload of the wrong length, or a root segment that
    does not start at token 0.

    ``page_hashes``: the BLAKE3 digests of the payload's pages (``(pages, 32)`` uint8, pages of
    ``fp.page_bytes`` from the payload's start), which the sidecar then carries instead of
    digests computed here: what a park from device memory brings, hashed by the device kernel
    over the same bytes before their one copy to the host. The caller vouches
    that they are of these bytes: they are not checked against them (that would be the hashing
    they save), only their shape, else :class:`StoreError`. A wrong digest is not silent
    damage all the same: every read validates against the sidecar, so the segment would read as
    damaged (the ladder), never as wrong bytes."""
    n = len(tokens)
    view = payload if isinstance(payload, PageSource) else byte_view(payload)
    if n < 1:
        raise StoreError("a K/V segment needs at least one token")
    want = n * fp.token_bytes
    have = view.nbytes if isinstance(view, PageSource) else len(view)
    if have != want:
        raise StoreError(f"payload is {have} bytes; {n} tokens of {fp.describe()} are {want} bytes")
    if parent_key == fp.digest() and token_start != 0:
        raise StoreError("a segment whose parent is the model root must start at token 0")
    hashes = None if page_hashes is None else _page_hashes(page_hashes, -(-want // fp.page_bytes))
    key = segment_key(parent_key, tokens, media)
    return Unsealed(
        key,
        Kind.KV,
        parent_key,
        token_start,
        token_start + n,
        fp.page_bytes,
        view,
        tuple(media),
        hashes,
    )


def _page_hashes(hashes: object, pages: int) -> npt.NDArray[np.uint8]:
    """A put's own page digests, checked: ``(pages, 32)`` uint8, else :class:`StoreError`."""
    if (
        not isinstance(hashes, np.ndarray)
        or hashes.dtype != np.uint8
        or hashes.shape != (pages, DIGEST_BYTES)
    ):
        got = (
            f"{hashes.dtype} {hashes.shape}"
            if isinstance(hashes, np.ndarray)
            else type(hashes).__name__
        )
        raise StoreError(
            f"page_hashes are {got}; this payload has {pages} pages: pass their "
            f"({pages}, {DIGEST_BYTES}) uint8 BLAKE3 digests, or None to hash them "
            "here"
        )
    return np.ascontiguousarray(hashes)


def state_segment(checkpoint_key: bytes, payload: Buffer, *, token_pos: int) -> Unsealed:
    """The running state saved at the checkpoint ``checkpoint_key`` (spec F-KEY-5)."""
    view = byte_view(payload)
    if not view:
        raise StoreError("a running-state segment needs at least one byte")
    return Unsealed(
        state_key(checkpoint_key),
        Kind.STATE,
        checkpoint_key,
        token_pos,
        token_pos,
        STATE_PAGE_BYTES,
        view,
    )


@dataclass(frozen=True, slots=True)
class Encoded:
    """A payload's stored form: ``chunks`` (the pages, or one zstd frame a page; a chunk is
    valid until the next one is asked for: a streamed payload reuses its staging), the frames'
    ``lengths`` (empty for RAW), and ``hashes()``, the ``(pages, 32)`` digests of the payload
    (for RAW computed while the caller writes: call it once, after writing)."""

    codec: Codec
    chunks: Iterator[memoryview]
    lengths: tuple[int, ...]
    stored_bytes: int
    hashes: Callable[[], npt.NDArray[np.uint8]]


def encode(u: Unsealed, codec: Codec, *, write_chunk: int = 16 << 20) -> Encoded:
    """Encode ``u``'s payload for storing; RAW pages are hashed on another thread meanwhile.
    A put that brought its digests (``u.hashes``) is not hashed at all, either codec. A
    :class:`PageSource` is streamed as RAW (:func:`.streamed.streamed`: each chunk is valid
    until the next is asked for), or gathered whole for ZSTD."""
    if isinstance(u.payload, PageSource):
        if codec is Codec.RAW:
            from stratastore.levels.streamed import streamed

            return streamed(u.payload, u.page_bytes, write_chunk, u.hashes, u.hasher.key)
        u = u.in_memory()
    assert isinstance(u.payload, memoryview)
    view = u.payload
    given = u.hashes
    if codec is Codec.RAW:
        return Encoded(
            codec,
            _chunks(view, write_chunk),
            (),
            len(view),
            (lambda: given)
            if given is not None
            else numba_kernels.start_page_hashes(view, u.page_bytes, u.hasher.key),
        )
    hashes = (
        given
        if given is not None
        else numba_kernels.page_hashes(view, u.page_bytes, key=u.hasher.key)
    )
    cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=True)
    frames = [memoryview(cctx.compress(p)) for p in _chunks(view, u.page_bytes)]
    lengths = tuple(len(f) for f in frames)
    return Encoded(codec, iter(frames), lengths, sum(lengths), lambda: hashes)


def sidecar_for(
    u: Unsealed, enc: Encoded, hashes: npt.NDArray[np.uint8], fp: ModelFingerprint, level: Level
) -> Sidecar:
    """The sidecar that commits ``u`` stored as ``enc`` at ``level``, sealed now."""
    return Sidecar(
        kind=u.kind,
        codec=enc.codec,
        level=level,
        fingerprint=fp,
        key=u.key,
        parent_key=u.parent,
        token_start=u.token_start,
        token_end=u.token_end,
        page_bytes=u.page_bytes,
        last_page_bytes=u.size - (u.page_count - 1) * u.page_bytes,
        page_hashes=hashes.tobytes(),
        stored_bytes=enc.stored_bytes,
        sealed_at_ns=time.time_ns(),
        stored_lengths=enc.lengths,
        media=u.media,
        minor=KEYED_MINOR if u.hasher.keyed else MINOR,
        key_id=u.hasher.key_id,
        hasher=u.hasher,
    )


def seal(u: Unsealed, codec: Codec, fp: ModelFingerprint, level: Level) -> tuple[Sidecar, bytes]:
    """``u`` sealed in one call: its sidecar and its stored bytes (a backend that keeps
    segments in memory or ships them whole; a :class:`PageSource` is gathered whole first)."""
    u = u.in_memory()
    enc = encode(u, codec)
    stored = b"".join(enc.chunks)
    return sidecar_for(u, enc, enc.hashes(), fp, level), stored


def check_sealed(sc: Sidecar, stored: Buffer, fp: ModelFingerprint) -> npt.NDArray[np.uint8]:
    """Check a sealed segment another level hands over before storing it again: its model
    (:class:`~stratastore.format.IncompatibleFingerprint`), its stored size
    (:class:`~stratastore.format.FormatError`) and every page against its digest
    (:class:`~stratastore.format.ChecksumMismatch`, spec F-SC-3). The stored bytes as an
    array."""
    fp.require_same(sc.fingerprint, sidecar_name(sc.key))
    view = byte_view(stored)
    if len(view) != sc.stored_bytes:
        raise FormatError(
            f"segment {sc.key.hex()}: {len(view)} stored bytes, its sidecar says {sc.stored_bytes}"
        )
    data = np.frombuffer(view, dtype=np.uint8)
    validate_stored(sc, data)
    return data


def rekeyed(sc: Sidecar, stored: npt.NDArray[np.uint8], hasher: PageHasher) -> Sidecar:
    """``sc`` with its page digests made by ``hasher`` (the writer of the level that stores
    it: spec F-KEYED-4), from its stored bytes ``stored``, already validated
    (:func:`check_sealed`); ``sc`` itself when it is hashed so already. A segment keyed for
    one level is so re-keyed for another, or unkeyed for an unkeyed one."""
    if sc.hasher == hasher and sc.authenticated:
        return sc
    pages = decoded_pages(sc, stored)
    digests = numba_kernels.page_hashes(pages, sc.page_bytes, key=hasher.key)
    return replace(
        sc,
        page_hashes=digests.tobytes(),
        minor=KEYED_MINOR if hasher.keyed else (sc.minor if sc.extra_head else MINOR),
        key_id=hasher.key_id,
        hasher=hasher,
    )


def _chunks(view: memoryview, size: int) -> Iterator[memoryview]:
    for i in range(0, len(view), size):
        yield view[i : i + size]
