"""What every level builds the same way on top of two primitives of its own, so a backend
writes only those: ``_put(unsealed, codec)`` (commit a segment sealed from a payload, spec
F-DUR) and ``open_reader(key)`` (a held segment whose range reads land in the caller's memory).

:class:`SealedLevel` gives the rest of the write and read half of
:class:`~stratastore.levels.backend.SegmentBackend`: ``put_kv`` and ``put_state`` seal the
payload (:mod:`stratastore.levels.sealing`: keys, page digests) and hand it to ``_put``;
``read_into`` reads stored bytes unvalidated for a caller that hashes them (the restore's read
pass), ``get_into`` and ``get_bytes`` deliver pages validated in the memory they are delivered
from (spec F-SC-3), refusing a read-only or short buffer and an oversized read first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from stratastore.errors import StrataError
from stratastore.format import (
    PLAIN,
    Codec,
    LevelKeys,
    MediaRef,
    ModelFingerprint,
    PageHasher,
    Sidecar,
)
from stratastore.levels.backend import OpenSegment, PutResult
from stratastore.levels.errors import StoreError
from stratastore.levels.reader import OutOfRange, payload_bytes
from stratastore.levels.sealing import (
    Buffer,
    Payload,
    Unsealed,
    byte_view,
    kv_segment,
    state_segment,
)

__all__ = ["SealedLevel"]


class SealedLevel:
    """The shared half of a level (see the module); a backend subclasses it and implements
    ``_put`` and ``open_reader``."""

    fingerprint: ModelFingerprint
    #: a keyed level's keys (spec F-KEYED; None: unkeyed): the first seals every put, and a
    #: sidecar is read only when keyed by one of them
    level_keys: LevelKeys | None = None
    #: sidecars of the level refused as not keyed by one of its keys (the ``unauthenticated``
    #: figure of its stats)
    unauthenticated: int = 0

    @property
    def hasher(self) -> PageHasher:
        """What this level seals with: its writer's key, or plain BLAKE3."""
        return PLAIN if self.level_keys is None else self.level_keys.writer

    def _put(self, u: Unsealed, codec: Codec) -> PutResult:
        raise NotImplementedError

    def open_reader(self, key: bytes) -> OpenSegment:
        raise NotImplementedError

    def _put_many(self, us: Sequence[Unsealed], codec: Codec) -> list[PutResult | StrataError]:
        """``_put`` of each, a result or the error each raised; a backend that can commit
        several puts together (a directory's group commit) overrides it."""
        out: list[PutResult | StrataError] = []
        for u in us:
            try:
                out.append(self._put(u, codec))
            except StrataError as e:
                out.append(e)
        return out

    # -- writing (spec F-DUR-2, F-DUR-7) ------------------------------------------------------
    def put_kv(
        self,
        parent_key: bytes,
        tokens: Sequence[int] | npt.NDArray[np.integer],
        payload: Payload,
        *,
        token_start: int,
        media: Sequence[MediaRef] = (),
        codec: Codec = Codec.RAW,
        page_hashes: npt.NDArray[np.uint8] | None = None,
    ) -> PutResult:
        """Store the K/V pages of ``tokens`` (which follow the prefix ``parent_key``).

        ``payload`` holds ``len(tokens) * fingerprint.token_bytes`` bytes in the page layout of
        spec F-SEG-4. ``media`` are the segment's own media items at offsets within it (spec
        F-KEY-7: :func:`~stratastore.format.keys.key_chain` gives them): the key is derived with
        them (spec F-KEY-2) and the sidecar carries them, so a segment holding a picture is
        never filed under a media-free key. A put of an already committed key writes nothing
        and returns ``created=False``.

        ``page_hashes``: the ``(pages, 32)`` uint8 BLAKE3 digests of ``payload``'s pages, which
        the sidecar carries instead of hashing them here (a park from device memory: the device
        kernel hashed the same bytes before their one copy to the host). The caller vouches that
        they are of these bytes; a wrong shape is a :class:`StoreError`
        (:func:`~stratastore.levels.sealing.kv_segment`).
        """
        u = kv_segment(
            self.fingerprint,
            parent_key,
            tokens,
            payload,
            token_start=token_start,
            media=media,
            page_hashes=page_hashes,
        )
        return self._put(u.keyed(self.hasher), codec)

    def put_state(
        self, checkpoint_key: bytes, payload: Buffer, *, token_pos: int, codec: Codec = Codec.RAW
    ) -> PutResult:
        """Store the running state saved at the checkpoint ``checkpoint_key`` (spec F-KEY-5)."""
        u = state_segment(checkpoint_key, payload, token_pos=token_pos)
        return self._put(u.keyed(self.hasher), codec)

    def put_states(
        self,
        items: Sequence[tuple[bytes, Buffer]],
        *,
        token_pos: int,
        codec: Codec = Codec.RAW,
    ) -> list[PutResult | StrataError]:
        """:meth:`put_state` of each ``(checkpoint_key, payload)``, committed together where the
        backend can (a directory: one group commit, spec F-DUR-2): for each, its result or the
        :class:`~stratastore.errors.StrataError` its put raised (the others go on)."""
        us: list[Unsealed] = []
        out: list[PutResult | StrataError | None] = []
        for key, payload in items:
            try:
                us.append(state_segment(key, payload, token_pos=token_pos).keyed(self.hasher))
                out.append(None)
            except StrataError as e:
                out.append(e)
        done = iter(self._put_many(us, codec))
        return [next(done) if r is None else r for r in out]

    # -- reading (spec F-SC-3) ----------------------------------------------------------------
    def read_into(self, key: bytes, offset: int, out: Buffer) -> int:
        """Copy the *stored* bytes of ``key`` from ``offset`` into ``out`` (RAW: the pages;
        ZSTD: the frames; not validated: the caller hashes what it reads, spec F-SC-3): as
        many as fit, up to the end. Returns the count (0 at the end); :class:`OutOfRange` for
        an offset before 0 or past the end."""
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only")
        with self.open_reader(key) as seg:
            end = seg.sidecar.stored_bytes
            if offset < 0 or offset > end:
                raise OutOfRange(
                    f"segment {key.hex()}: offset {offset} is outside its {end} stored bytes"
                )
            n = min(len(dst), end - offset)
            if n:
                seg.read_into(dst[:n], offset)
        return n

    def get_into(self, key: bytes, out: Buffer, *, verify: bool = True) -> Sidecar:
        """Copy the segment's pages into ``out`` (at least ``payload_bytes`` long).

        With ``verify`` every page is read into staging memory, hashed there and copied from
        there only if it matches its sidecar digest (the bytes hashed are the bytes delivered);
        a mismatch raises :class:`~stratastore.format.ChecksumMismatch` naming the first bad
        page, and ``out`` then holds validated pages only (spec F-SC-3). Returns the sidecar.
        """
        dst = byte_view(out)
        if dst.readonly:
            raise StoreError("the output buffer is read-only")
        with self.open_reader(key) as seg:
            sc = seg.sidecar
            if len(dst) < sc.payload_bytes:
                raise StoreError(
                    f"output buffer is {len(dst)} bytes; segment {key.hex()} needs "
                    f"{sc.payload_bytes}"
                )
            seg.copy_validated(dst[: sc.payload_bytes], verify)
        return sc

    def get_bytes(self, key: bytes, *, max_bytes: int) -> bytes:
        """The segment's validated payload as bytes (for small objects such as running states);
        refuses one larger than ``max_bytes`` before allocating it."""
        with self.open_reader(key) as seg:
            return payload_bytes(seg, max_bytes)
