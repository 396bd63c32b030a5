"""The sidecar: a segment's identity and commit record (spec F-SC).

Layout (little-endian), in file order::

    head        SIDECAR_HEAD, 224 bytes in v1.0 (``head_bytes`` says how many; a newer minor
                version may append fields that an older reader skips)
    hashes      page_count x 32 bytes, BLAKE3-256 of each *uncompressed* page
    lengths     page_count x u32, stored (compressed) length of each page; only if codec != RAW
    media       media_count x (u32 token offset, 32-byte digest)
    trailer     32 bytes, BLAKE3-256 of every byte before it

A *keyed* sidecar (spec F-KEYED: a keyed level's) sets the required feature bit
:data:`KEYED`, carries its key's 8-byte id at head bytes 224..231 (a minor-1 head of 232
bytes), and its page digests and trailer are BLAKE3 keyed by that key
(:class:`~stratastore.format.level_key.PageHasher`). :func:`decode_sidecar` given a level's
:class:`~stratastore.format.level_key.LevelKeys` accepts only sidecars keyed by one of them;
given none, it refuses a keyed one (:class:`~stratastore.format.errors.KeyRequired`) unless
asked to parse it unchecked (fsck without the key). An unkeyed sidecar is byte for byte the
format before F-KEYED.

A sidecar is written after its data file and is the commit record: a data file without a valid
sidecar is invisible (spec F-DUR-3). :func:`decode_sidecar` refuses truncated, oversized or
garbage input with a typed error and allocates nothing sized by an unchecked field.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

from stratastore.format.errors import (
    ChecksumMismatch,
    FormatError,
    KeyRequired,
    NotAuthenticated,
    UnsupportedVersion,
)
from stratastore.format.fingerprint import FINGERPRINT, MAX_PAGE_BYTES, ModelFingerprint
from stratastore.format.keys import KEY_BYTES, MediaRef
from stratastore.format.level_key import KEY_ID_BYTES, PLAIN, LevelKeys, PageHasher

__all__ = [
    "KEYED",
    "MAX_HEAD_BYTES",
    "MAX_MEDIA",
    "MAX_PAGES",
    "MAX_SIDECAR_BYTES",
    "SIDECAR_HEAD",
    "SIDECAR_MAGIC",
    "Codec",
    "Kind",
    "Level",
    "Sidecar",
    "decode_sidecar",
    "encode_sidecar",
]

SIDECAR_MAGIC = b"STRASIDE"
MAJOR, MINOR = 1, 0
#: ``required_features`` bit of a keyed sidecar (spec F-KEYED-3): a reader without the bit, or
#: without the level's key, refuses it
KEYED = 2  # bit 1; bit 0 stays unknown (vectors and tests refuse it as a newer feature)
#: bits of ``required_features`` this reader understands (any other set bit is refused)
KNOWN_REQUIRED_FEATURES = KEYED
#: the minor version and head size a keyed sidecar is written with (its key id at 224..231)
KEYED_MINOR = 1

# magic, major, minor, head_bytes, reserved, required_features, optional_features,
# kind, codec, level, reserved, fingerprint, key, parent_key, token_start, token_end,
# page_count, page_bytes, last_page_bytes, media_count, stored_bytes, sealed_at_ns
SIDECAR_HEAD = struct.Struct(f"<8sHHHHIIBBBx{FINGERPRINT.size}s32s32sQQIIIIQQ")
assert SIDECAR_HEAD.size == 224
_PREFIX = struct.Struct("<8sHH")
_U32 = struct.Struct("<I")
_MEDIA = struct.Struct("<I32s")
TRAILER_BYTES = 32

MAX_PAGES = 1 << 20
MAX_MEDIA = 1 << 16
#: head bytes a later minor version may add past the v1.0 head (spec F-SC-7)
MAX_HEAD_GROWTH = 4096
#: the largest ``head_bytes`` a reader accepts (F-SC-7, checked at F-READ-1 step 4)
MAX_HEAD_BYTES = SIDECAR_HEAD.size + MAX_HEAD_GROWTH
MAX_SIDECAR_BYTES = MAX_HEAD_BYTES + MAX_PAGES * 36 + MAX_MEDIA * 36 + TRAILER_BYTES
MAX_STORED_PAGE_BYTES = MAX_PAGE_BYTES + (MAX_PAGE_BYTES >> 7) + 4096
#: running-state pages are not tied to the fingerprint, so they get their own, smaller bound
MAX_STATE_PAGE_BYTES = 1 << 26


class Kind(IntEnum):
    """What a segment holds (spec F-SC-4)."""

    KV = 1  #: K/V pages of a token range
    STATE = 2  #: the running state of a recurrent/hybrid model at a checkpoint


class Codec(IntEnum):
    """How pages are stored in the data file (spec F-SEG-5)."""

    RAW = 0
    ZSTD = 1  #: each page one zstd frame; lengths in the sidecar


class Level(IntEnum):
    """The disk level that sealed the sidecar (spec F-SC-5)."""

    WARM = 1
    COLD = 2


@dataclass(frozen=True, slots=True)
class Sidecar:
    """A decoded, validated sidecar. ``page_hashes`` is ``page_count * 32`` bytes."""

    kind: Kind
    codec: Codec
    level: Level
    fingerprint: ModelFingerprint
    key: bytes
    parent_key: bytes
    token_start: int
    token_end: int
    page_bytes: int
    last_page_bytes: int
    page_hashes: bytes
    stored_bytes: int
    sealed_at_ns: int
    stored_lengths: tuple[int, ...] = ()
    media: tuple[MediaRef, ...] = ()
    minor: int = MINOR
    optional_features: int = 0
    extra_head: bytes = field(default=b"", repr=False)
    #: the id of the key the sidecar says it is keyed by (spec F-KEYED-3); empty: unkeyed
    key_id: bytes = b""
    #: how its digests were checked (and are checked, page by page): the key whose id is
    #: ``key_id``, or plain BLAKE3. A keyed sidecar parsed unchecked (fsck without the key)
    #: has ``key_id`` and the plain hasher: :attr:`authenticated` is False
    hasher: PageHasher = field(default=PLAIN, repr=False)

    @property
    def authenticated(self) -> bool:
        """Whether its digests can be checked: unkeyed, or checked with its own key."""
        return self.key_id == self.hasher.key_id

    @property
    def page_count(self) -> int:
        return len(self.page_hashes) // 32

    @property
    def payload_bytes(self) -> int:
        """Uncompressed bytes of all pages."""
        return (self.page_count - 1) * self.page_bytes + self.last_page_bytes

    @property
    def n_tokens(self) -> int:
        return self.token_end - self.token_start

    def page_hash(self, i: int) -> bytes:
        return self.page_hashes[32 * i : 32 * i + 32]

    def page_len(self, i: int) -> int:
        """Uncompressed length of page ``i``."""
        return self.last_page_bytes if i == self.page_count - 1 else self.page_bytes

    def stored_offsets(self) -> list[int]:
        """Offset of each page inside the payload (relative to the data offset)."""
        if self.codec is Codec.RAW:
            return [i * self.page_bytes for i in range(self.page_count)]
        offs, pos = [], 0
        for n in self.stored_lengths:
            offs.append(pos)
            pos += n
        return offs

    def validate(self, obj: str = "sidecar") -> None:
        """Check every semantic rule of spec F-SC-6; raise :class:`FormatError` naming ``obj``."""
        _validate(self, obj)


def _bad(obj: str, what: str) -> FormatError:
    return FormatError(f"{obj}: {what}; the file is not a valid v1 sidecar (spec F-SC)")


def _validate(sc: Sidecar, obj: str) -> None:
    pc = sc.page_count
    if len(sc.page_hashes) % 32 or not 1 <= pc <= MAX_PAGES:
        raise _bad(obj, f"page count {pc} is outside 1..{MAX_PAGES}")
    if len(sc.key) != KEY_BYTES or len(sc.parent_key) != KEY_BYTES:
        raise _bad(obj, "key and parent key must be 32 bytes")
    if not 1 <= sc.page_bytes <= MAX_PAGE_BYTES or not 1 <= sc.last_page_bytes <= sc.page_bytes:
        raise _bad(obj, f"page size {sc.page_bytes} / last page {sc.last_page_bytes} is invalid")
    if not 0 <= sc.token_start <= sc.token_end < 2**63:
        raise _bad(obj, f"token range [{sc.token_start}, {sc.token_end}) is invalid")
    if sc.kind is Kind.KV:
        fp = sc.fingerprint
        n = sc.n_tokens
        want_pages = -(-n // fp.page_tokens)
        want_last = (n - (want_pages - 1) * fp.page_tokens) * fp.token_bytes if n else 0
        if sc.page_bytes != fp.page_bytes or pc != want_pages or sc.last_page_bytes != want_last:
            raise _bad(
                obj,
                f"{n} tokens of {fp.describe()} need {want_pages} pages of {fp.page_bytes} bytes "
                f"(last {want_last}), the sidecar says {pc} of {sc.page_bytes} "
                f"(last {sc.last_page_bytes})",
            )
    elif sc.token_start != sc.token_end:
        raise _bad(obj, "a STATE segment must have an empty token range (its checkpoint)")
    elif sc.page_bytes > MAX_STATE_PAGE_BYTES:
        raise _bad(obj, f"a STATE page of {sc.page_bytes} bytes is over {MAX_STATE_PAGE_BYTES}")
    if sc.codec is Codec.RAW:
        if sc.stored_lengths:
            raise _bad(obj, "a RAW segment has no stored lengths")
        if sc.stored_bytes != sc.payload_bytes:
            raise _bad(obj, f"stored bytes {sc.stored_bytes} != payload {sc.payload_bytes}")
    else:
        if len(sc.stored_lengths) != pc:
            raise _bad(obj, "a compressed segment needs one stored length per page")
        if any(not 1 <= n <= MAX_STORED_PAGE_BYTES for n in sc.stored_lengths):
            raise _bad(obj, "a stored page length is out of range")
        if sum(sc.stored_lengths) != sc.stored_bytes:
            raise _bad(obj, "stored lengths do not add up to stored bytes")
    if len(sc.media) > MAX_MEDIA:
        raise _bad(obj, f"more than {MAX_MEDIA} media refs")
    if sc.key_id and len(sc.key_id) != KEY_ID_BYTES:
        raise _bad(obj, f"a key id is {KEY_ID_BYTES} bytes")
    if sc.key_id and sc.minor < KEYED_MINOR:
        raise _bad(obj, f"a keyed sidecar is of minor version {KEYED_MINOR} or later")
    head = SIDECAR_HEAD.size + len(sc.key_id) + len(sc.extra_head)
    if head > MAX_HEAD_BYTES:
        raise _bad(
            obj,
            f"a head of {head} bytes is over {MAX_HEAD_BYTES} (spec F-SC-7)",
        )
    last = -1
    for off, digest in sc.media:
        if off < last or off >= max(sc.n_tokens, 1) or len(digest) != 32:
            raise _bad(obj, "media refs must ascend within the token range")
        last = off


def encode_sidecar(sc: Sidecar) -> bytes:
    """Serialise a sidecar after validating it: its trailer made with its own hasher (keyed:
    the required bit :data:`KEYED`, its key id after the v1.0 head; spec F-KEYED-3)."""
    sc.validate("sidecar to encode")
    if sc.key_id != sc.hasher.key_id:
        raise _bad("sidecar to encode", "its key id is not the id of the key it is hashed with")
    head = SIDECAR_HEAD.pack(
        SIDECAR_MAGIC,
        MAJOR,
        sc.minor,
        SIDECAR_HEAD.size + len(sc.key_id) + len(sc.extra_head),
        0,
        KEYED if sc.key_id else 0,
        sc.optional_features,
        int(sc.kind),
        int(sc.codec),
        int(sc.level),
        sc.fingerprint.pack(),
        sc.key,
        sc.parent_key,
        sc.token_start,
        sc.token_end,
        sc.page_count,
        sc.page_bytes,
        sc.last_page_bytes,
        len(sc.media),
        sc.stored_bytes,
        sc.sealed_at_ns,
    )
    parts = [head, sc.key_id, sc.extra_head, sc.page_hashes]
    if sc.codec is not Codec.RAW:
        parts.append(struct.pack(f"<{len(sc.stored_lengths)}I", *sc.stored_lengths))
    parts.extend(_MEDIA.pack(off, d) for off, d in sc.media)
    body = b"".join(parts)
    return body + sc.hasher.digest(body)


def decode_sidecar(
    data: bytes,
    obj: str = "sidecar",
    *,
    keys: LevelKeys | None = None,
    unchecked: bool = False,
) -> Sidecar:
    """Parse and validate a sidecar; every failure is a typed error naming ``obj``.

    Raises :class:`UnsupportedVersion` for a newer major version or an unknown required
    feature (spec F-COMPAT-1), :class:`ChecksumMismatch` for a damaged trailer and
    :class:`FormatError` for anything else.

    ``keys``: the level is keyed (spec F-KEYED-5): only a sidecar keyed by one of them is
    accepted, its trailer checked with that key, and the sidecar carries that key
    (:attr:`Sidecar.hasher`) for its pages; an unkeyed one or one of another key is
    :class:`NotAuthenticated`. Without ``keys`` a keyed sidecar is :class:`KeyRequired`, or
    with ``unchecked`` parsed without checking its trailer (fsck without the key: its
    :attr:`Sidecar.authenticated` is False, its pages cannot be checked).
    """
    if len(data) > MAX_SIDECAR_BYTES:
        raise _bad(obj, f"{len(data)} bytes is over the {MAX_SIDECAR_BYTES}-byte limit")
    if len(data) < _PREFIX.size:
        raise _bad(obj, f"truncated at {len(data)} bytes")
    magic, major, minor = _PREFIX.unpack_from(data)
    if magic != SIDECAR_MAGIC:
        raise _bad(obj, f"bad magic {magic!r}")
    if major != MAJOR:
        raise UnsupportedVersion(
            f"{obj}: format version {major}.{minor} is not readable by this version "
            f"(reads {MAJOR}.x); upgrade stratastore to read it"
        )
    if len(data) < SIDECAR_HEAD.size + TRAILER_BYTES:
        raise _bad(obj, f"truncated at {len(data)} bytes")
    (
        _,
        _,
        _,
        head_bytes,
        _,
        required,
        optional,
        kind,
        codec,
        level,
        fp_raw,
        key,
        parent,
        t0,
        t1,
        pc,
        page_bytes,
        last_page,
        media_count,
        stored,
        sealed,
    ) = SIDECAR_HEAD.unpack_from(data)
    if required & ~KNOWN_REQUIRED_FEATURES:
        raise UnsupportedVersion(
            f"{obj}: required feature bits {required:#x} are unknown to this version; "
            "upgrade stratastore to read it"
        )
    keyed = bool(required & KEYED)
    if keyed and keys is None and not unchecked:
        raise KeyRequired(
            f"{obj}: a keyed sidecar (spec F-KEYED), and this reader has no level key; "
            "configure the level's key_file or key_env (or pass --key-file) to read it"
        )
    # F-SC-7: the head is bounded as a field, not only through the file's size, so a head
    # over the bound is refused whatever the counts beside it (F-READ-1 step 4)
    if not SIDECAR_HEAD.size <= head_bytes <= MAX_HEAD_BYTES or (
        minor == MINOR and head_bytes != SIDECAR_HEAD.size
    ):
        raise _bad(obj, f"head size {head_bytes} is invalid for version {major}.{minor}")
    fields_end = SIDECAR_HEAD.size + (KEY_ID_BYTES if keyed else 0)
    if head_bytes < fields_end:
        raise _bad(obj, f"a keyed sidecar's head holds its key id: {head_bytes} bytes is short")
    if not 1 <= pc <= MAX_PAGES or media_count > MAX_MEDIA:
        raise _bad(obj, f"page count {pc} or media count {media_count} is out of range")
    try:
        kind_e, codec_e, level_e = Kind(kind), Codec(codec), Level(level)
    except ValueError:
        raise _bad(obj, f"unknown kind {kind}, codec {codec} or level {level}") from None
    lengths_bytes = 4 * pc if codec_e is not Codec.RAW else 0
    want = head_bytes + 32 * pc + lengths_bytes + _MEDIA.size * media_count + TRAILER_BYTES
    if len(data) != want:
        raise _bad(obj, f"{len(data)} bytes, but its counts need exactly {want}")
    key_id = bytes(data[SIDECAR_HEAD.size : fields_end])
    hasher = _hasher(obj, key_id, keys)
    body = memoryview(data)[: want - TRAILER_BYTES]
    if hasher.key_id == key_id:  # else: keyed, parsed unchecked (no key to check it with)
        actual = hasher.digest(body)
        if actual != data[-TRAILER_BYTES:]:
            raise ChecksumMismatch(obj, bytes(data[-TRAILER_BYTES:]), actual)
    pos = head_bytes
    hashes = bytes(data[pos : pos + 32 * pc])
    pos += 32 * pc
    lengths: tuple[int, ...] = ()
    if lengths_bytes:
        lengths = struct.unpack_from(f"<{pc}I", data, pos)
        pos += lengths_bytes
    media = tuple(
        (off, bytes(d))
        for off, d in (_MEDIA.unpack_from(data, pos + i * _MEDIA.size) for i in range(media_count))
    )
    try:
        fp = ModelFingerprint.unpack(fp_raw)
    except FormatError as e:
        raise _bad(obj, str(e)) from None
    sc = Sidecar(
        kind=kind_e,
        codec=codec_e,
        level=level_e,
        fingerprint=fp,
        key=key,
        parent_key=parent,
        token_start=t0,
        token_end=t1,
        page_bytes=page_bytes,
        last_page_bytes=last_page,
        page_hashes=hashes,
        stored_bytes=stored,
        sealed_at_ns=sealed,
        stored_lengths=lengths,
        media=media,
        minor=minor,
        optional_features=optional,
        extra_head=bytes(data[fields_end:head_bytes]),
        key_id=key_id,
        hasher=hasher,
    )
    sc.validate(obj)
    return sc


def _hasher(obj: str, key_id: bytes, keys: LevelKeys | None) -> PageHasher:
    """The hasher a sidecar saying ``key_id`` (empty: unkeyed) is checked with: a keyed
    level's key of that id (:class:`NotAuthenticated` for an unkeyed sidecar or an id not
    among ``keys``: spec F-KEYED-5), plain BLAKE3 without ``keys``."""
    if keys is None:
        return PLAIN
    if not key_id:
        raise NotAuthenticated(obj, "it was written without a key (an unkeyed sidecar)")
    hasher = keys.for_id(key_id)
    if hasher is None:
        raise NotAuthenticated(
            obj,
            f"it is keyed by key id {key_id.hex()}, not one of the level's "
            f"({', '.join(keys.key_ids)})",
        )
    return hasher
