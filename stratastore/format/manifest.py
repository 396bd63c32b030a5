"""The chain manifest: a conversation's commit record on disk (spec F-CHAIN, format 1.1).

A manifest names a conversation's tokens, media, checkpoints and the keys of the K/V segments
that hold it, so that any process can find the conversation by prompt prefix and restore it.
It is written after every segment it names is committed (spec F-CHAIN-3). Layout
(little-endian)::

    head        MANIFEST_HEAD, 76 bytes
    conv_id     conv_id_bytes of UTF-8
    tokens      n_tokens x u32
    checkpoints n_checkpoints x (u64 length, u8 flags, 7 reserved, 32-byte state key or zeros)
    media       n_media x (u64 position, 32-byte digest)
    segments    n_segments x (u64 start, u64 end, 32-byte key)
    trailer     32 bytes, BLAKE3-256 of every byte before it
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3
import numpy as np
import numpy.typing as npt

from stratastore.format.errors import ChecksumMismatch, FormatError, KeyMismatch, UnsupportedVersion
from stratastore.format.keys import key_chain, state_key

__all__ = [
    "MANIFEST_HEAD",
    "MANIFEST_MAGIC",
    "MAX_MANIFEST_BYTES",
    "ChainManifest",
    "ManifestCheckpoint",
    "decode_manifest",
    "encode_manifest",
    "manifest_key_mismatch",
    "verify_manifest_keys",
]

MANIFEST_MAGIC = b"STRACHAN"
MAJOR, MINOR = 1, 0
# magic, major, minor, head_bytes, flags, model digest, conv_id_bytes, reserved, n_tokens,
# n_checkpoints, n_media, n_segments, sealed_at_ns
MANIFEST_HEAD = struct.Struct("<8sHHHH32sHHIIIIQ")
assert MANIFEST_HEAD.size == 76
_CKPT = struct.Struct("<QB7x32s")
assert _CKPT.size == 48
_MEDIA = struct.Struct("<Q32s")
_SEG = struct.Struct("<QQ32s")
assert _SEG.size == 48
TRAILER = 32
FLAG_SESSION = 1  #: an explicitly saved session: capacity GC never removes it
CKPT_PINNED, CKPT_TAIL, CKPT_STATE = 1, 2, 4
MAX_TOKENS = 1 << 24
MAX_ITEMS = 1 << 20
MAX_CONV_ID = 4096
MAX_MANIFEST_BYTES = (
    MANIFEST_HEAD.size + MAX_CONV_ID + 4 * MAX_TOKENS + 3 * 48 * MAX_ITEMS + TRAILER
)


@dataclass(frozen=True, slots=True)
class ManifestCheckpoint:
    length: int
    pinned: bool = False
    tail: bool = False
    state_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class ChainManifest:
    conv_id: str
    model: bytes  #: the fingerprint digest (spec F-FP-4)
    tokens: npt.NDArray[np.uint32]  #: uint32
    checkpoints: tuple[ManifestCheckpoint, ...]
    media: tuple[tuple[int, bytes], ...]
    segments: tuple[tuple[int, int, bytes], ...]
    sealed_at_ns: int
    session: bool = False

    def validate(self, obj: str = "manifest") -> None:
        """Spec F-CHAIN-2: ids, counts and ranges consistent; segments tile [0, n_tokens)."""
        n = len(self.tokens)
        if len(self.model) != 32 or not self.conv_id or len(self.conv_id.encode()) > MAX_CONV_ID:
            raise FormatError(f"{obj}: model digest or conversation id is invalid")
        if (
            n > MAX_TOKENS
            or max(len(self.checkpoints), len(self.media), len(self.segments)) > MAX_ITEMS
        ):
            raise FormatError(f"{obj}: too many tokens or items")
        lengths = [c.length for c in self.checkpoints]
        if lengths != sorted(set(lengths)) or (lengths and not 0 <= lengths[0] <= lengths[-1] <= n):
            raise FormatError(f"{obj}: checkpoints must ascend within the {n} tokens")
        pos = 0
        for start, end, key in self.segments:
            if start != pos or end <= start or len(key) != 32:
                raise FormatError(f"{obj}: segments must tile the tokens from 0 without gaps")
            pos = end
        if pos != n:
            raise FormatError(f"{obj}: segments cover {pos} of {n} tokens")
        last = -1
        for p, d in self.media:
            if not last < p < n or len(d) != 32:
                raise FormatError(f"{obj}: media positions must ascend within the tokens")
            last = p


def encode_manifest(m: ChainManifest) -> bytes:
    m.validate("manifest to encode")
    cid = m.conv_id.encode()
    head = MANIFEST_HEAD.pack(
        MANIFEST_MAGIC,
        MAJOR,
        MINOR,
        MANIFEST_HEAD.size,
        FLAG_SESSION if m.session else 0,
        m.model,
        len(cid),
        0,
        len(m.tokens),
        len(m.checkpoints),
        len(m.media),
        len(m.segments),
        m.sealed_at_ns,
    )
    parts = [head, cid, np.asarray(m.tokens, dtype="<u4").tobytes()]
    for c in m.checkpoints:
        flags = (CKPT_PINNED * c.pinned) | (CKPT_TAIL * c.tail) | (CKPT_STATE * bool(c.state_key))
        parts.append(_CKPT.pack(c.length, flags, c.state_key or b"\0" * 32))
    parts.extend(_MEDIA.pack(p, d) for p, d in m.media)
    parts.extend(_SEG.pack(s, e, k) for s, e, k in m.segments)
    body = b"".join(parts)
    return body + blake3.blake3(body).digest()


def decode_manifest(data: bytes, obj: str = "manifest") -> ChainManifest:
    """Parse and validate; typed errors only, nothing allocated before the size is checked.

    The checks run in the order of spec F-READ-1: the size bounds (108 bytes up to
    :data:`MAX_MANIFEST_BYTES`), the magic, the major version, the fields that size the parse
    (``head_bytes``, the id's length up to 4,096 and the counts), the exact length, the
    trailer, then every other rule. An empty conversation id is one of those other rules
    (step 7, F-CHAIN-4): a 108-byte manifest with an empty id and a bad trailer is a
    :class:`ChecksumMismatch`, the same with a good trailer a :class:`FormatError`."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise FormatError(f"{obj}: {len(data)} bytes is over the manifest limit")
    if len(data) < MANIFEST_HEAD.size + TRAILER:
        raise FormatError(f"{obj}: truncated at {len(data)} bytes (spec F-CHAIN-1)")
    (
        magic,
        major,
        minor,
        head_bytes,
        flags,
        model,
        cid_len,
        _,
        n_tok,
        n_ck,
        n_media,
        n_seg,
        sealed,
    ) = MANIFEST_HEAD.unpack_from(data)
    if magic != MANIFEST_MAGIC:
        raise FormatError(f"{obj}: bad magic {magic!r}; not a chain manifest (spec F-CHAIN-1)")
    if major != MAJOR:
        raise UnsupportedVersion(
            f"{obj}: manifest version {major}.{minor} is not readable by this version; "
            "upgrade stratastore to read it"
        )
    if (
        head_bytes < MANIFEST_HEAD.size
        or cid_len > MAX_CONV_ID
        or n_tok > MAX_TOKENS
        or max(n_ck, n_media, n_seg) > MAX_ITEMS
    ):
        raise FormatError(f"{obj}: a count is out of range (spec F-CHAIN-1)")
    want = (
        head_bytes
        + cid_len
        + 4 * n_tok
        + _CKPT.size * n_ck
        + _MEDIA.size * n_media
        + _SEG.size * n_seg
        + TRAILER
    )
    if len(data) != want:
        raise FormatError(f"{obj}: {len(data)} bytes, its counts need exactly {want}")
    actual = blake3.blake3(memoryview(data)[:-TRAILER]).digest()
    if actual != data[-TRAILER:]:
        raise ChecksumMismatch(obj, bytes(data[-TRAILER:]), actual)
    pos = head_bytes
    try:
        conv_id = bytes(data[pos : pos + cid_len]).decode()
    except UnicodeDecodeError:
        raise FormatError(f"{obj}: the conversation id is not UTF-8") from None
    pos += cid_len
    tokens = np.frombuffer(data, dtype="<u4", count=n_tok, offset=pos).astype(np.uint32)
    pos += 4 * n_tok
    ckpts = []
    for _ in range(n_ck):
        length, f, key = _CKPT.unpack_from(data, pos)
        pos += _CKPT.size
        ckpts.append(
            ManifestCheckpoint(
                length, bool(f & CKPT_PINNED), bool(f & CKPT_TAIL), key if f & CKPT_STATE else None
            )
        )
    media = []
    for _ in range(n_media):
        media.append(_MEDIA.unpack_from(data, pos))
        pos += _MEDIA.size
    segs = []
    for _ in range(n_seg):
        segs.append(_SEG.unpack_from(data, pos))
        pos += _SEG.size
    m = ChainManifest(
        conv_id,
        model,
        tokens,
        tuple(ckpts),
        tuple(media),
        tuple(segs),
        sealed,
        bool(flags & FLAG_SESSION),
    )
    m.validate(obj)
    return m


def manifest_key_mismatch(
    m: ChainManifest, root: bytes | None = None, obj: str = "manifest"
) -> KeyMismatch | None:
    """The first recorded key of ``m`` that is not the key of its own content, or ``None``.

    Segment keys are recomputed from the manifest's own tokens and media cut at its own
    segment bounds (spec F-CHAIN-2, F-KEY-2, F-KEY-7); a checkpoint's state key must be the
    state key (F-KEY-5) of the segment key ending at its length (F-CHAIN-6). ``root`` is the
    fingerprint digest the chain starts from (F-KEY-1); by default the manifest's own
    ``model``. Pure: no I/O. ``m`` must have passed :meth:`ChainManifest.validate` (every
    decoded manifest has).
    """
    derived = key_chain(
        root if root is not None else m.model, m.tokens, m.media, [(s, e) for s, e, _ in m.segments]
    )
    for i, (seg, (start, end, recorded)) in enumerate(zip(derived, m.segments, strict=True)):
        if seg.key != recorded:
            return KeyMismatch(obj, f"segment {i} (tokens [{start}, {end}))", recorded, seg.key)
    ends = {seg.end: seg.key for seg in derived}
    for c in m.checkpoints:
        if c.state_key is not None:
            want = state_key(ends[c.length]) if c.length in ends else b""
            if c.state_key != want:
                return KeyMismatch(
                    obj, f"the state of the checkpoint at {c.length}", c.state_key, want
                )
    return None


def verify_manifest_keys(
    m: ChainManifest, root: bytes | None = None, obj: str = "manifest"
) -> None:
    """Raise :class:`KeyMismatch` for the first segment of ``m`` whose key is not its content's
    (see :func:`manifest_key_mismatch`). A reader runs it after :func:`decode_manifest` and
    refuses the manifest on failure (spec F-CHAIN-2)."""
    err = manifest_key_mismatch(m, root, obj)
    if err is not None:
        raise err
