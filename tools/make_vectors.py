"""Write the golden vectors of format-spec/vectors/ (spec F-COMPAT-4, F-COMPAT-5).

Run once per format version: it refuses to touch a directory that already has a manifest,
because a vector of a released version is never regenerated. Tests read the committed files and
compare them with the manifest; they never call this script.

    python tools/make_vectors.py format-spec/vectors/v1
    python tools/make_vectors.py --v1.1 format-spec/vectors/v1.1
    python tools/make_vectors.py --v1.1-errata1 format-spec/vectors/v1.1-errata1
    python tools/make_vectors.py --v1.2 format-spec/vectors/v1.2
    python tools/make_vectors.py --v1.2-errata1 format-spec/vectors/v1.2-errata1
    python tools/make_vectors.py --v1.2-errata2 format-spec/vectors/v1.2-errata2
    python tools/make_vectors.py --v1.3 format-spec/vectors/v1.3
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import replace

import blake3
import numpy as np

from stratastore.format import (
    Codec,
    IndexRecord,
    Kind,
    Level,
    ModelFingerprint,
    SegmentHeader,
    Sidecar,
    encode_segment_header,
    encode_sidecar,
    segment_key,
    state_key,
)
from stratastore.format.sidecar import SIDECAR_HEAD

SEALED = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
FP = ModelFingerprint.create(
    "strata/vector-model", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4, dtype="float16"
)


def pattern(n: int, start: int = 0) -> bytes:
    """The official BLAKE3 test-vector byte pattern: byte i = i % 251."""
    return (np.arange(start, start + n, dtype=np.int64) % 251).astype(np.uint8).tobytes()


def page_hashes(payload: bytes, page_bytes: int) -> bytes:
    return b"".join(
        blake3.blake3(payload[i : i + page_bytes]).digest()
        for i in range(0, len(payload), page_bytes)
    )


def kv_sidecar(
    tokens: list[int],
    parent: bytes,
    t0: int,
    payload: bytes,
    codec: Codec,
    media: tuple[tuple[int, bytes], ...] = (),
) -> tuple[Sidecar, bytes]:
    import zstandard

    key = segment_key(parent, tokens, media)
    pb = FP.page_bytes
    pages = [payload[i : i + pb] for i in range(0, len(payload), pb)]
    if codec is Codec.RAW:
        stored, lengths = payload, ()
    else:
        frames = [
            zstandard.ZstdCompressor(level=1, write_content_size=True).compress(p) for p in pages
        ]
        stored, lengths = b"".join(frames), tuple(len(f) for f in frames)
    sc = Sidecar(
        kind=Kind.KV,
        codec=codec,
        level=Level.COLD,
        fingerprint=FP,
        key=key,
        parent_key=parent,
        token_start=t0,
        token_end=t0 + len(tokens),
        page_bytes=pb,
        last_page_bytes=len(pages[-1]),
        page_hashes=page_hashes(payload, pb),
        stored_bytes=len(stored),
        sealed_at_ns=SEALED,
        stored_lengths=lengths,
        media=media,
    )
    return sc, stored


def resign(raw: bytes) -> bytes:
    """Recompute a sidecar's trailer so a deliberately invalid field reaches the field checks."""
    body = raw[:-32]
    return body + blake3.blake3(body).digest()


def patch_head(raw: bytes, offset: int, fmt: str, value: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt, b, offset, value)
    return resign(bytes(b))


def fresh_folder(out: str) -> bool:
    """Make ``out``; False (said) when it already has a manifest: a released folder is never
    regenerated (spec F-COMPAT-4)."""
    if os.path.exists(os.path.join(out, "MANIFEST.json")):
        print(
            f"{out} already has a manifest: released vectors are never regenerated", file=sys.stderr
        )
        return False
    os.makedirs(out, exist_ok=True)
    return True


def read_vector(folder: str, name: str) -> bytes:
    """The bytes of vector ``name`` in a released folder (an errata set derives from them)."""
    with open(os.path.join(folder, name), "rb") as f:
        return f.read()


def vector_writer(out: str, entries: list[dict[str, object]]) -> Callable[..., None]:
    """``put(name, data, kind, expect, clauses, **extra)``: write vector ``name`` into ``out``
    and append its MANIFEST entry (file, BLAKE3, kind, expected outcome, clauses, extras)."""

    def put(
        name: str, data: bytes, kind: str, expect: str, clauses: list[str], **extra: object
    ) -> None:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        entry: dict[str, object] = {
            "file": name,
            "blake3": blake3.blake3(data).hexdigest(),
            "kind": kind,
            "expect": expect,
            "clauses": clauses,
        }
        entry.update(extra)
        entries.append(entry)

    return put


def main(out: str) -> int:
    if not fresh_folder(out):
        return 1
    entries: list[dict[str, object]] = []

    def put(
        name: str, data: bytes, kind: str, expect: str, clauses: list[str], **extra: object
    ) -> None:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        entry: dict[str, object] = {
            "file": name,
            "blake3": blake3.blake3(data).hexdigest(),
            "kind": kind,
            "expect": expect,
            "clauses": clauses,
        }
        entry.update(extra)
        entries.append(entry)

    root = FP.digest()
    tokens = list(range(100, 110))
    payload = pattern(len(tokens) * FP.token_bytes)
    sc, stored = kv_sidecar(tokens, root, 0, payload, Codec.RAW)
    side = encode_sidecar(sc)
    seg = encode_segment_header(SegmentHeader.for_sidecar(sc)) + stored
    put(
        "fingerprint.bin",
        FP.pack(),
        "fingerprint",
        "ok",
        ["F-FP-1", "F-FP-2", "F-FP-3", "F-FP-4"],
        digest=root.hex(),
        token_bytes=FP.token_bytes,
        page_bytes=FP.page_bytes,
    )
    put(
        "sidecar_kv_raw.side",
        side,
        "sidecar",
        "ok",
        ["F-SC-1", "F-SC-2", "F-SC-5", "F-SC-6", "F-SC-7", "F-KEY-2", "F-COMPAT-1", "F-COMPAT-2"],
        key=sc.key.hex(),
        pages=sc.page_count,
        payload_bytes=sc.payload_bytes,
    )
    put(
        "segment_kv_raw.seg",
        seg,
        "segment",
        "ok",
        ["F-SEG-1", "F-SEG-2", "F-SEG-3", "F-SEG-4", "F-SC-3", "F-COMPAT-1"],
        sidecar="sidecar_kv_raw.side",
        payload="pattern",
    )

    sc2, stored2 = kv_sidecar(
        list(range(110, 115)), sc.key, 10, pattern(5 * FP.token_bytes, 7), Codec.ZSTD
    )
    put(
        "sidecar_kv_zstd.side",
        encode_sidecar(sc2),
        "sidecar",
        "ok",
        ["F-SC-1", "F-SEG-5"],
        key=sc2.key.hex(),
        pages=sc2.page_count,
        payload_bytes=sc2.payload_bytes,
    )
    put(
        "segment_kv_zstd.seg",
        encode_segment_header(SegmentHeader.for_sidecar(sc2)) + stored2,
        "segment",
        "ok",
        ["F-SEG-5"],
        sidecar="sidecar_kv_zstd.side",
        payload="pattern+7",
    )

    media = ((2, blake3.blake3(b"picture-1").digest()),)
    sc3, _ = kv_sidecar(tokens, root, 0, payload, Codec.RAW, media)
    put(
        "sidecar_kv_media.side",
        encode_sidecar(sc3),
        "sidecar",
        "ok",
        ["F-KEY-4", "F-SC-1"],
        key=sc3.key.hex(),
        pages=sc3.page_count,
        payload_bytes=sc3.payload_bytes,
    )

    state = pattern(3000, 11)
    sc4 = Sidecar(
        kind=Kind.STATE,
        codec=Codec.RAW,
        level=Level.WARM,
        fingerprint=FP,
        key=state_key(sc.key),
        parent_key=sc.key,
        token_start=10,
        token_end=10,
        page_bytes=1024,
        last_page_bytes=3000 - 2048,
        page_hashes=page_hashes(state, 1024),
        stored_bytes=3000,
        sealed_at_ns=SEALED,
    )
    put(
        "sidecar_state.side",
        encode_sidecar(sc4),
        "sidecar",
        "ok",
        ["F-SC-4", "F-SC-5", "F-KEY-5"],
        key=sc4.key.hex(),
        pages=sc4.page_count,
        payload_bytes=sc4.payload_bytes,
    )

    newer = encode_sidecar(replace(sc, minor=1, optional_features=0x1, extra_head=b"\xab" * 16))
    put(
        "sidecar_minor1.side",
        newer,
        "sidecar",
        "ok",
        ["F-COMPAT-3"],
        key=sc.key.hex(),
        pages=sc.page_count,
        payload_bytes=sc.payload_bytes,
    )

    rec = IndexRecord.from_sidecar(sc, len(side), len(seg))
    put("index_record.bin", rec.pack(), "index_record", "ok", ["F-IDX-1"])

    keys = {
        "fingerprint_file": "fingerprint.bin",
        "root": {"digest_of": "fingerprint.bin", "key": root.hex()},
        "cases": [
            {
                "name": "segment_0_10",
                "parent": "root",
                "tokens": list(range(100, 110)),
                "media": [],
                "key": sc.key.hex(),
            },
            {
                "name": "segment_10_15",
                "parent": "segment_0_10",
                "tokens": list(range(110, 115)),
                "media": [],
                "key": sc2.key.hex(),
            },
            {
                "name": "segment_0_10_media",
                "parent": "root",
                "tokens": list(range(100, 110)),
                "media": [[2, media[0][1].hex()]],
                "key": sc3.key.hex(),
            },
        ],
        "states": [
            {"name": "state_at_segment_0_10", "checkpoint": "segment_0_10", "key": sc4.key.hex()}
        ],
    }
    put(
        "keys.json",
        (json.dumps(keys, indent=2) + "\n").encode(),
        "keys",
        "ok",
        ["F-KEY-1", "F-KEY-2", "F-KEY-3", "F-KEY-4", "F-KEY-5"],
    )

    # -- invalid vectors: each breaks exactly one rule ----------------------------------------
    bad: list[tuple[str, bytes, str, list[str]]] = []
    bad.append(("sidecar_bad_magic.side", b"XTRASIDE" + side[8:], "FormatError", ["F-SC-1"]))
    bad.append(
        ("sidecar_major2.side", patch_head(side, 8, "<H", 2), "UnsupportedVersion", ["F-COMPAT-1"])
    )
    bad.append(
        (
            "sidecar_required_feature.side",
            patch_head(side, 16, "<I", 0x4),
            "UnsupportedVersion",
            ["F-COMPAT-2"],
        )
    )
    bad.append(("sidecar_truncated.side", side[: len(side) // 2], "FormatError", ["F-SC-7"]))
    flipped = bytearray(side)
    flipped[300] ^= 0x01
    bad.append(("sidecar_body_flip.side", bytes(flipped), "ChecksumMismatch", ["F-SC-2"]))
    count_off = SIDECAR_HEAD.size - 32  # page_count sits after the two u64 token bounds
    bad.append(
        (
            "sidecar_page_count_huge.side",
            patch_head(side, count_off, "<I", 0xFFFFFFFF),
            "FormatError",
            ["F-SC-7"],
        )
    )
    wrong_pages = patch_head(side, count_off - 8, "<Q", 13)  # token_end: 13 tokens, 3 pages
    bad.append(("sidecar_tokens_pages_disagree.side", wrong_pages, "FormatError", ["F-SC-6"]))
    fp_off = 28  # fingerprint record starts after magic..reserved (28 bytes)
    bad.append(
        (
            "sidecar_bad_dtype.side",
            patch_head(side, fp_off + 80, "<B", 99),
            "FormatError",
            ["F-FP-2"],
        )
    )
    bad.append(
        ("sidecar_head_short.side", patch_head(side, 12, "<H", 200), "FormatError", ["F-SC-1"])
    )
    unsorted = encode_sidecar(replace(sc3, media=media)).replace(
        struct.pack("<I", 2) + media[0][1], struct.pack("<I", 99) + media[0][1]
    )
    bad.append(
        ("sidecar_media_out_of_range.side", resign(unsorted), "FormatError", ["F-KEY-4", "F-SC-6"])
    )
    for name, data, expect, clauses in bad:
        put(name, data, "sidecar", expect, clauses)

    hdr = seg[:4096]
    put(
        "segment_bad_magic.seg",
        b"XTRATSEG" + seg[8:],
        "segment",
        "FormatError",
        ["F-SEG-1"],
        sidecar="sidecar_kv_raw.side",
    )
    hflip = bytearray(seg)
    hflip[50] ^= 0x01
    put(
        "segment_header_flip.seg",
        bytes(hflip),
        "segment",
        "ChecksumMismatch",
        ["F-SEG-1"],
        sidecar="sidecar_kv_raw.side",
    )
    off_bad = encode_segment_header(replace(SegmentHeader.for_sidecar(sc), data_offset=4096))
    off_bad = bytearray(off_bad)
    struct.pack_into("<I", off_bad, 12, 1000)
    signed = bytes(off_bad[:68])
    off_bad[68:100] = blake3.blake3(signed).digest()
    put(
        "segment_bad_offset.seg",
        bytes(off_bad) + stored,
        "segment",
        "FormatError",
        ["F-SEG-3"],
        sidecar="sidecar_kv_raw.side",
    )
    major = bytearray(hdr)
    struct.pack_into("<H", major, 8, 2)
    major[68:100] = blake3.blake3(bytes(major[:68])).digest()
    put(
        "segment_major2.seg",
        bytes(major) + stored,
        "segment",
        "UnsupportedVersion",
        ["F-COMPAT-1"],
        sidecar="sidecar_kv_raw.side",
    )
    put(
        "segment_truncated.seg",
        seg[:-1],
        "segment",
        "FormatError",
        ["F-SEG-3"],
        sidecar="sidecar_kv_raw.side",
    )
    pflip = bytearray(seg)
    pflip[4096 + FP.page_bytes + 3] ^= 0x80
    put(
        "segment_page1_flip.seg",
        bytes(pflip),
        "segment",
        "PageMismatch:1",
        ["F-SC-3"],
        sidecar="sidecar_kv_raw.side",
    )
    put(
        "segment_header_mismatch.seg",
        encode_segment_header(SegmentHeader.for_sidecar(sc2)) + stored2,
        "segment",
        "FormatError",
        ["F-SEG-2"],
        sidecar="sidecar_kv_raw.side",
    )

    reversed_pages = b"".join(
        reversed(
            [stored[i : i + FP.page_bytes] for i in range(0, 2 * FP.page_bytes, FP.page_bytes)]
        )
    )
    put(
        "segment_pages_misplaced.seg",
        hdr + reversed_pages + stored[2 * FP.page_bytes :],
        "segment",
        "PageMismatch:0",
        ["F-SEG-4"],
        sidecar="sidecar_kv_raw.side",
    )

    import zstandard

    zpages = [
        pattern(5 * FP.token_bytes, 7)[i : i + FP.page_bytes]
        for i in range(0, 5 * FP.token_bytes, FP.page_bytes)
    ]
    cz = zstandard.ZstdCompressor(level=1, write_content_size=True)
    frames = [cz.compress(zpages[0]), cz.compress(zpages[1][:-64])]  # page 1 decodes short
    sc5 = replace(
        sc2, stored_lengths=tuple(len(f) for f in frames), stored_bytes=sum(len(f) for f in frames)
    )
    put(
        "sidecar_kv_zstd_short_frame.side",
        encode_sidecar(sc5),
        "sidecar",
        "ok",
        ["F-SEG-5"],
        key=sc5.key.hex(),
        pages=sc5.page_count,
        payload_bytes=sc5.payload_bytes,
    )
    put(
        "segment_kv_zstd_short_frame.seg",
        encode_segment_header(SegmentHeader.for_sidecar(sc5)) + b"".join(frames),
        "segment",
        "PageMismatch:1",
        ["F-SEG-5"],
        sidecar="sidecar_kv_zstd_short_frame.side",
    )

    for name, off, fmt, value, clause in [
        ("sidecar_bad_kind.side", 24, "<B", 7, "F-SC-4"),
        ("sidecar_bad_level.side", 26, "<B", 9, "F-SC-5"),
        ("sidecar_bad_codec.side", 25, "<B", 5, "F-SEG-5"),
    ]:
        put(name, patch_head(side, off, fmt, value), "sidecar", "FormatError", [clause])
    short_minor = bytearray(encode_sidecar(replace(sc, minor=1, extra_head=b"\0" * 8)))
    struct.pack_into("<H", short_minor, 12, 220)
    put(
        "sidecar_minor1_head_short.side",
        resign(bytes(short_minor)),
        "sidecar",
        "FormatError",
        ["F-COMPAT-3"],
    )

    # key derivation: one case per file; "KeyMismatch" marks a deliberately wrong derivation
    # (what a reader gets if it drops a part of F-KEY-2), "FormatError" an input to refuse
    toks = list(range(100, 110))
    no_domain = blake3.blake3(FP.pack()).digest()
    no_count = blake3.blake3(
        b"strata-key-v1\0" + root + np.array(toks, "<u4").tobytes() + struct.pack("<I", 0)
    ).digest()
    key_cases = [
        (
            "key_ok.json",
            {"parent": "root", "tokens": toks, "media": [], "key": sc.key.hex()},
            "ok",
            ["F-KEY-1", "F-KEY-2", "F-KEY-3"],
        ),
        (
            "key_root_without_domain.json",
            {
                "parent": "root",
                "root_override": no_domain.hex(),
                "tokens": toks,
                "media": [],
                "key": segment_key(no_domain, toks).hex(),
            },
            "KeyMismatch",
            ["F-FP-4", "F-KEY-1"],
        ),
        (
            "key_without_token_count.json",
            {"parent": "root", "tokens": toks, "media": [], "key": no_count.hex()},
            "KeyMismatch",
            ["F-KEY-2"],
        ),
        (
            "key_token_out_of_range.json",
            {"parent": "root", "tokens": [1, 2**32], "media": []},
            "FormatError",
            ["F-KEY-3"],
        ),
        (
            "key_media_out_of_range.json",
            {"parent": "root", "tokens": [1, 2], "media": [[2, "00" * 32]]},
            "FormatError",
            ["F-KEY-4"],
        ),
        ("key_state_of_short_key.json", {"state_of": "00" * 31}, "FormatError", ["F-KEY-5"]),
        ("key_state_ok.json", {"state_of": sc.key.hex(), "key": sc4.key.hex()}, "ok", ["F-KEY-5"]),
    ]
    for name, case, expect, clauses in key_cases:
        put(
            name,
            (json.dumps(case) + "\n").encode(),
            "key_case",
            expect,
            clauses,
            fingerprint="fingerprint.bin",
        )

    put("fingerprint_short.bin", FP.pack()[:-1], "fingerprint", "FormatError", ["F-FP-1"])
    bad_fp = bytearray(FP.pack())
    bad_fp[80] = 99
    put("fingerprint_bad_dtype.bin", bytes(bad_fp), "fingerprint", "FormatError", ["F-FP-2"])
    zero_fp = bytearray(FP.pack())
    struct.pack_into("<I", zero_fp, 64, 0)
    put("fingerprint_zero_layers.bin", bytes(zero_fp), "fingerprint", "FormatError", ["F-FP-3"])
    bad_rec = bytearray(rec.pack())
    bad_rec[0] = 9
    put("index_record_bad_schema.bin", bytes(bad_rec), "index_record", "FormatError", ["F-IDX-1"])

    # a second model with the same geometry: its bytes must never be read for the first
    other_fp = ModelFingerprint.create(
        "strata/another-model", n_layers=2, n_kv_heads=2, head_dim=4, page_tokens=4, dtype="float16"
    )
    osc = replace(
        sc,
        fingerprint=other_fp,
        key=segment_key(other_fp.digest(), tokens),
        parent_key=other_fp.digest(),
    )
    put(
        "sidecar_other_model.side",
        encode_sidecar(osc),
        "sidecar",
        "ok",
        ["F-FP-1"],
        key=osc.key.hex(),
        pages=osc.page_count,
        payload_bytes=osc.payload_bytes,
    )
    put(
        "segment_other_model.seg",
        encode_segment_header(SegmentHeader.for_sidecar(osc)) + stored,
        "segment",
        "ok",
        ["F-SEG-1"],
        sidecar="sidecar_other_model.side",
        payload="pattern",
    )

    # store layouts: recipes that place vector files under names in an empty directory, which
    # a reader then opens with fingerprint.bin; "ok:N" = N segments adopted, all reading back
    def names(key: bytes) -> tuple[str, str]:
        return f"strata-conv-{key.hex()}.side", f"strata-conv-{key.hex()}.seg"

    raw_side, raw_seg = names(sc.key)
    z_side, z_seg = names(sc2.key)
    o_side, o_seg = names(osc.key)
    recipes = [
        (
            "store_valid.json",
            {
                raw_side: "sidecar_kv_raw.side",
                raw_seg: "segment_kv_raw.seg",
                z_side: "sidecar_kv_zstd.side",
                z_seg: "segment_kv_zstd.seg",
                f"strata-tmp-0123456789abcdef-{o_side}": "sidecar_other_model.side",
                "README.txt": "keys.json",
            },
            "ok:2",
            ["F-DIR-1", "F-DIR-2", "F-DIR-3", "F-DIR-4", "F-DIR-6", "F-FP-5", "F-IDX-3", "F-KEY-6"],
        ),
        (
            "store_index_is_a_file.json",
            {
                raw_side: "sidecar_kv_raw.side",
                raw_seg: "segment_kv_raw.seg",
                "strata-index": "keys.json",
            },
            "StrataIOError",
            ["F-DIR-4"],
        ),
        (
            "store_name_mismatch.json",
            {z_side: "sidecar_kv_raw.side", z_seg: "segment_kv_raw.seg"},
            "FormatError",
            ["F-KEY-6"],
        ),
        (
            "store_unrecognised_names.json",
            {
                raw_side.upper().replace("STRATA-CONV-", "strata-conv-"): "sidecar_kv_raw.side",
                f"strata-tmp-0123456789abcdef-{raw_side}": "sidecar_kv_raw.side",
                f"strata-tmp-0123456789abcdef-{raw_seg}": "segment_kv_raw.seg",
                raw_seg: "segment_kv_raw.seg",
            },
            "ok:0",
            ["F-DIR-1", "F-DIR-2", "F-DIR-3", "F-DUR-3"],
        ),
        (
            "store_sidecar_without_data.json",
            {raw_side: "sidecar_kv_raw.side"},
            "StrataIOError",
            ["F-IDX-3"],
        ),
        (
            "store_two_models.json",
            {
                raw_side: "sidecar_kv_raw.side",
                raw_seg: "segment_kv_raw.seg",
                o_side: "sidecar_other_model.side",
                o_seg: "segment_other_model.seg",
            },
            "IncompatibleFingerprint",
            ["F-DIR-6", "F-FP-5"],
        ),
        (
            "store_other_model_only.json",
            {o_side: "sidecar_other_model.side", o_seg: "segment_other_model.seg"},
            "IncompatibleFingerprint",
            ["F-FP-5"],
        ),
    ]
    for name, layout, expect, clauses in recipes:
        recipe = {"fingerprint": "fingerprint.bin", "files": layout}
        put(name, (json.dumps(recipe, indent=2) + "\n").encode(), "store", expect, clauses)

    manifest = {"format_version": "1.0", "generator": "tools/make_vectors.py", "vectors": entries}
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}")
    return 0


def main_v1_1(out: str) -> int:
    """Format 1.1 adds the chain manifest (spec F-CHAIN)."""
    from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, encode_manifest

    if not fresh_folder(out):
        return 1
    entries: list[dict[str, object]] = []

    def put(name: str, data: bytes, expect: str, clauses: list[str]) -> None:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        entries.append(
            {
                "file": name,
                "blake3": blake3.blake3(data).hexdigest(),
                "kind": "manifest",
                "expect": expect,
                "clauses": clauses,
            }
        )

    root = FP.digest()
    tokens = np.arange(100, 115, dtype=np.uint32)
    k1 = segment_key(root, tokens[:10])
    k2 = segment_key(k1, tokens[10:15])
    m = ChainManifest(
        "conversation-1",
        root,
        tokens,
        (
            ManifestCheckpoint(10, pinned=True),
            ManifestCheckpoint(15, tail=True, state_key=state_key(k2)),
        ),
        ((3, blake3.blake3(b"pic").digest()),),
        ((0, 10, k1), (10, 15, k2)),
        SEALED,
    )
    good = encode_manifest(m)
    put("manifest_ok.chain", good, "ok", ["F-CHAIN-1", "F-CHAIN-2"])
    put(
        "manifest_session.chain",
        encode_manifest(replace(m, session=True)),
        "ok",
        ["F-CHAIN-1", "F-CHAIN-5"],
    )
    put("manifest_bad_magic.chain", b"XTRACHAN" + good[8:], "FormatError", ["F-CHAIN-1"])
    put("manifest_truncated.chain", good[:-5], "FormatError", ["F-CHAIN-1"])
    flipped = bytearray(good)
    flipped[100] ^= 1
    put("manifest_body_flip.chain", bytes(flipped), "ChecksumMismatch", ["F-CHAIN-1"])
    major = bytearray(good)
    struct.pack_into("<H", major, 8, 2)
    put("manifest_major2.chain", resign(bytes(major)), "UnsupportedVersion", ["F-COMPAT-1"])
    # segments that leave a gap: [0, 10) then [11, 15), re-signed so the tiling check decides
    gap = good.replace(struct.pack("<QQ", 10, 15) + k2, struct.pack("<QQ", 11, 15) + k2)
    put("manifest_segment_gap.chain", resign(gap), "FormatError", ["F-CHAIN-2"])
    swapped = good.replace(struct.pack("<Q", 10) + b"\x01", struct.pack("<Q", 20) + b"\x01")
    put("manifest_checkpoints_out_of_order.chain", resign(swapped), "FormatError", ["F-CHAIN-2"])
    manifest = {
        "format_version": "1.1",
        "generator": "tools/make_vectors.py --v1.1",
        "vectors": entries,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}")
    return 0


ERRATA_1 = "v1.1-errata1"


def main_v1_1_errata1(out: str, vectors_root: str = "format-spec/vectors") -> int:
    """Corrected and added vectors of format 1.1 (spec F-COMPAT-5).

    Every v1.1 manifest carries a picture at position 3 in the segment ``[0, 10)`` but names
    that segment by its media-free key: a manifest a conforming reader refuses (F-CHAIN-2,
    F-KEY-7), and invalid vectors that break two rules instead of one. This folder holds the
    corrected set under the same names, lists the v1.1 files under ``supersedes``, and adds
    vectors for the reader clauses the spec spells out since (F-READ, F-KEY-7, F-CHAIN-6,
    F-IDX-6). Deterministic: same inputs, same bytes (tests/conformance/test_vectors.py runs
    it into a temporary folder and compares).
    """
    from stratastore.format import key_chain
    from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, encode_manifest

    if not fresh_folder(out):
        return 1
    v1 = os.path.join(vectors_root, "v1")
    v1_1 = os.path.join(vectors_root, "v1.1")
    entries: list[dict[str, object]] = []

    def put(
        name: str,
        data: bytes,
        expect: str,
        clauses: list[str],
        kind: str = "manifest",
        **extra: object,
    ) -> None:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        entry: dict[str, object] = {
            "file": name,
            "blake3": blake3.blake3(data).hexdigest(),
            "kind": kind,
            "expect": expect,
            "clauses": clauses,
        }
        entry.update(extra)
        entries.append(entry)

    read = read_vector

    def once(data: bytes, old: bytes, new: bytes) -> bytes:
        assert data.count(old) == 1, "the patched bytes must be unique"
        return data.replace(old, new)

    root = FP.digest()
    tokens = np.arange(100, 115, dtype=np.uint32)
    pic = blake3.blake3(b"pic").digest()

    def manifest(
        media: tuple[tuple[int, bytes], ...],
        bounds: list[tuple[int, int]],
        keys: list[bytes] | None = None,
        state: bytes | None = None,
        toks: np.ndarray = tokens,
    ) -> ChainManifest:
        """conversation-1: checkpoints at 10 (pinned) and 15 (tail, with a state); segment keys
        derived per F-KEY-7 unless ``keys`` (a deliberately wrong derivation) are given."""
        derived = [s.key for s in key_chain(root, toks, media, bounds)]
        keys = keys or derived
        return ChainManifest(
            "conversation-1",
            root,
            tokens,
            (
                ManifestCheckpoint(10, pinned=True),
                ManifestCheckpoint(15, tail=True, state_key=state or state_key(keys[-1])),
            ),
            media,
            tuple((s, e, k) for (s, e), k in zip(bounds, keys, strict=True)),
            SEALED,
        )

    cuts = [(0, 10), (10, 15)]
    media = ((3, pic),)
    m = manifest(media, cuts)
    k1, k2 = (k for _, _, k in m.segments)
    good = encode_manifest(m)
    put(
        "manifest_ok.chain",
        good,
        "ok",
        ["F-CHAIN-1", "F-CHAIN-2", "F-CHAIN-6", "F-KEY-2", "F-KEY-7", "F-READ-1", "F-READ-3"],
    )
    put(
        "manifest_session.chain",
        encode_manifest(replace(m, session=True)),
        "ok",
        ["F-CHAIN-1", "F-CHAIN-5"],
    )
    # the v1.1 set again, each breaking exactly one rule now (same constructions as v1.1)
    put(
        "manifest_bad_magic.chain", b"XTRACHAN" + good[8:], "FormatError", ["F-CHAIN-1", "F-READ-1"]
    )
    put("manifest_truncated.chain", good[:-5], "FormatError", ["F-CHAIN-1", "F-READ-1"])
    flipped = bytearray(good)
    flipped[100] ^= 1
    put("manifest_body_flip.chain", bytes(flipped), "ChecksumMismatch", ["F-CHAIN-1", "F-READ-1"])
    major = bytearray(good)
    struct.pack_into("<H", major, 8, 2)
    put(
        "manifest_major2.chain",
        resign(bytes(major)),
        "UnsupportedVersion",
        ["F-COMPAT-1", "F-READ-1"],
    )
    gap = once(good, struct.pack("<QQ", 10, 15) + k2, struct.pack("<QQ", 11, 15) + k2)
    put("manifest_segment_gap.chain", resign(gap), "FormatError", ["F-CHAIN-2"])
    swapped = once(good, struct.pack("<Q", 10) + b"\x01", struct.pack("<Q", 20) + b"\x01")
    put(
        "manifest_checkpoints_out_of_order.chain",
        resign(swapped),
        "FormatError",
        ["F-CHAIN-2", "F-READ-3"],
    )

    # order of checks (F-READ-1): two rules broken, the earlier check decides
    put("manifest_major2_unsigned.chain", bytes(major), "UnsupportedVersion", ["F-READ-1"])
    put("manifest_segment_gap_unsigned.chain", gap, "ChecksumMismatch", ["F-READ-1"])

    # keys (F-CHAIN-2, F-CHAIN-6, F-KEY-7): well-formed, checksummed, and refused
    media_free = encode_manifest(
        manifest(media, cuts, [s.key for s in key_chain(root, tokens, (), cuts)])
    )
    assert media_free == read(v1_1, "manifest_ok.chain"), "v1.1's manifest_ok is this derivation"
    put("manifest_media_free_key.chain", media_free, "KeyMismatch", ["F-CHAIN-2", "F-KEY-7"])
    other = np.concatenate([tokens[:10], np.full(5, 7, np.uint32)])
    foreign = [s.key for s in key_chain(root, other, media, cuts)]
    put(
        "manifest_foreign_keys.chain",
        encode_manifest(manifest(media, cuts, foreign)),
        "KeyMismatch",
        ["F-CHAIN-2"],
    )
    unlinked = [k1, segment_key(root, tokens[10:15])]
    put(
        "manifest_chain_unlinked.chain",
        encode_manifest(manifest(media, cuts, unlinked)),
        "KeyMismatch",
        ["F-CHAIN-2", "F-KEY-2"],
    )
    put(
        "manifest_state_key_forged.chain",
        encode_manifest(manifest(media, cuts, state=state_key(k1))),
        "KeyMismatch",
        ["F-CHAIN-6", "F-KEY-5"],
    )
    at_cut = ((0, blake3.blake3(b"pic-0").digest()), (10, pic))
    put(
        "manifest_media_at_cut.chain",
        encode_manifest(manifest(at_cut, cuts)),
        "ok",
        ["F-KEY-7", "F-CHAIN-2"],
    )
    three = [(0, 4), (4, 10), (10, 15)]
    inner = ((5, pic),)  # offset 1 in [4, 10); an absolute offset 5 is in range there too
    absolute = key_chain(root, tokens, (), three)
    wrong = [absolute[0].key, segment_key(absolute[0].key, tokens[4:10], [(5, pic)])]
    wrong.append(segment_key(wrong[1], tokens[10:15]))
    put(
        "manifest_media_offset_absolute.chain",
        encode_manifest(manifest(inner, three, wrong)),
        "KeyMismatch",
        ["F-KEY-7"],
    )
    put(
        "manifest_media_offset_relative.chain",
        encode_manifest(manifest(inner, three)),
        "ok",
        ["F-KEY-7"],
    )
    second = blake3.blake3(b"pic-2").digest()
    twice = encode_manifest(manifest(((3, pic), (4, second)), cuts))
    twice = once(twice, struct.pack("<Q", 4) + second, struct.pack("<Q", 3) + second)
    put(
        "manifest_media_same_position.chain",
        resign(twice),
        "FormatError",
        ["F-CHAIN-2", "F-READ-3"],
    )

    # reserved fields and undefined flag bits are ignored (F-READ-2); head bytes past the
    # known ones are skipped (F-COMPAT-3)
    res = bytearray(good)
    struct.pack_into("<H", res, 14, 0x8000)  # head flags: an undefined bit
    struct.pack_into("<H", res, 50, 0xBEEF)  # head reserved
    ck = 76 + len(m.conv_id.encode()) + 4 * len(tokens)  # the checkpoint at 10 (no state)
    struct.pack_into("<B7s32s", res, ck + 8, 0x01 | 0x80, b"\xaa" * 7, b"\x55" * 32)
    put("manifest_reserved_nonzero.chain", resign(bytes(res)), "ok", ["F-READ-2"])
    res_unsigned = bytearray(good)
    struct.pack_into("<H", res_unsigned, 50, 0xBEEF)
    put("manifest_reserved_unsigned.chain", bytes(res_unsigned), "ChecksumMismatch", ["F-READ-2"])
    body = good[:-32]
    longer = bytearray(body[:76] + b"\xab" * 16 + body[76:])
    struct.pack_into("<HH", longer, 10, 1, 76 + 16)  # minor 1, head_bytes 92
    put(
        "manifest_minor1_head_long.chain",
        resign(bytes(longer) + bytes(32)),
        "ok",
        ["F-COMPAT-3", "F-CHAIN-1"],
    )

    side = read(v1, "sidecar_kv_raw.side")
    sres = bytearray(side)
    struct.pack_into("<H", sres, 14, 0xBEEF)  # head reserved
    struct.pack_into("<B", sres, 27, 0xAA)  # head reserved
    struct.pack_into("<H", sres, 28 + 82, 0xCDEF)  # the fingerprint's reserved bytes
    put(
        "sidecar_reserved_nonzero.side",
        resign(bytes(sres)),
        "ok",
        ["F-READ-2", "F-FP-4"],
        kind="sidecar",
    )
    seg = bytearray(read(v1, "segment_kv_raw.seg"))
    struct.pack_into("<H", seg, 18, 0xBEEF)
    seg[68:100] = blake3.blake3(bytes(seg[:68])).digest()
    put("sidecar_kv_raw.side", side, "ok", ["F-SC-1"], kind="sidecar")
    put(
        "segment_reserved_nonzero.seg",
        bytes(seg),
        "ok",
        ["F-READ-2"],
        kind="segment",
        sidecar="sidecar_kv_raw.side",
        payload="pattern",
    )

    # index records (F-IDX-6): a code that F-SC-4, F-SC-5 or F-SEG-5 does not define
    rec = read(v1, "index_record.bin")
    put("index_record.bin", rec, "ok", ["F-IDX-1", "F-IDX-6"], kind="index_record")
    for name, off, value in [
        ("index_record_bad_kind.bin", 1, 7),
        ("index_record_bad_level.bin", 2, 9),
        ("index_record_bad_codec.bin", 3, 5),
    ]:
        bad = bytearray(rec)
        bad[off] = value
        put(name, bytes(bad), "FormatError", ["F-IDX-6"], kind="index_record")
    put("index_record_short.bin", rec[:-1], "FormatError", ["F-IDX-6"], kind="index_record")

    old = json.loads(read(v1_1, "MANIFEST.json"))
    supersedes = []
    for e in old["vectors"]:
        was_ok = e["expect"] == "ok"
        supersedes.append(
            {
                "file": f"v1.1/{e['file']}",
                "blake3": e["blake3"],
                "expect": "KeyMismatch" if was_ok else e["expect"],
                "violates": ["F-CHAIN-2", "F-KEY-7"],
                "replaced_by": e["file"],
                "reason": (
                    "the segment [0, 10) holds the picture at position 3 but is named by its "
                    "media-free key, so a reader would serve a text-only prefix's K/V for it"
                    if was_ok
                    else "besides the rule it tests, it names the segment [0, 10) "
                    "by its media-free key: an invalid vector must break exactly one rule"
                ),
            }
        )
    doc = {
        "format_version": "1.1",
        "generator": f"tools/make_vectors.py --{ERRATA_1}",
        "corrects": "v1.1",
        "vectors": entries,
        "supersedes": supersedes,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}, superseding {len(supersedes)}")
    return 0


V1_2 = "v1.2"


def main_v1_2(out: str) -> int:
    """Writers of 1.2: the shared remote level's key names and commit records (spec F-REM-1,
    F-REM-2). Deterministic: same inputs, same bytes (tests/conformance/test_vectors.py runs it
    into a temporary folder and compares)."""
    from stratastore.format.remote_record import CommitRecord, RemoteNames

    if not fresh_folder(out):
        return 1
    entries: list[dict[str, object]] = []

    def put(name: str, data: bytes, kind: str, expect: str, clauses: list[str]) -> None:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        entries.append(
            {
                "file": name,
                "blake3": blake3.blake3(data).hexdigest(),
                "kind": kind,
                "expect": expect,
                "clauses": clauses,
            }
        )

    def once(data: bytes, old: bytes, new: bytes) -> bytes:
        assert data.count(old) == 1, "the patched bytes must be unique"
        return data.replace(old, new)

    root = FP.digest()
    tokens = list(range(100, 200))  # 100 tokens of 64 bytes: 6,400 stored bytes, pages of 256
    sc, _ = kv_sidecar(tokens, root, 0, pattern(len(tokens) * FP.token_bytes), Codec.RAW)
    nonce = "00112233445566778899aabbccddeeff"
    good = CommitRecord.for_sidecar(nonce, sc, 4096).encode()  # 2 parts: 4,096 and 2,304
    head = f"SRC1:{nonce}:2:4096:".encode()
    assert good.startswith(head)
    put("fingerprint.bin", FP.pack(), "fingerprint", "ok", ["F-FP-1"])
    put("remote_commit_ok.rec", good, "remote_commit", "ok", ["F-REM-2", "F-SC-1"])
    put(
        "remote_commit_one_part.rec",
        CommitRecord.for_sidecar(nonce, sc, 8192).encode(),
        "remote_commit",
        "ok",
        ["F-REM-2"],
    )
    bad_heads = [
        ("remote_commit_bad_magic.rec", b"SRC2:"),
        ("remote_commit_nonce_upper.rec", f"SRC1:{nonce.upper()}:2:4096:".encode()),
        ("remote_commit_parts_short.rec", f"SRC1:{nonce}:1:4096:".encode()),
        ("remote_commit_parts_leading_zero.rec", f"SRC1:{nonce}:02:4096:".encode()),
        ("remote_commit_part_bytes_zero.rec", f"SRC1:{nonce}:2:0:".encode()),
        ("remote_commit_part_under_4kib.rec", f"SRC1:{nonce}:2:4095:".encode()),
        ("remote_commit_part_over_512mib.rec", f"SRC1:{nonce}:1:{(512 << 20) + 1}:".encode()),
        ("remote_commit_no_colon.rec", f"SRC1:{nonce}:2:4096".encode()),
    ]
    for name, new in bad_heads:
        old = head if new.startswith(b"SRC1:") else b"SRC1:"
        put(name, once(good, old, new), "remote_commit", "FormatError", ["F-REM-2"])
    flipped = bytearray(good)
    flipped[len(head) + 100] ^= 1  # a byte of the sidecar's head: its trailer no longer matches
    put(
        "remote_commit_sidecar_flip.rec",
        bytes(flipped),
        "remote_commit",
        "ChecksumMismatch",
        ["F-REM-2", "F-SC-1"],
    )

    names = RemoteNames("chat-prod", root)
    part = 2
    case = {
        "name": names.name,
        "fingerprint": "fingerprint.bin",
        "key": sc.key.hex(),
        "parent": sc.parent_key.hex(),
        "nonce": nonce,
        "part": part,
        "names": {
            "record": names.record(sc.key),
            "part": names.part(sc.key, nonce, part),
            "recs": names.recs,
            "ages": names.ages,
            "used": names.used,
            "kids": names.kids(sc.parent_key),
        },
    }

    def keys_json(doc: dict[str, object]) -> bytes:
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    put("remote_keys.json", keys_json(case), "remote_keys", "ok", ["F-REM-1"])
    whole = {k: v.replace(root.hex()[:32], root.hex()) for k, v in case["names"].items()}
    put(
        "remote_keys_whole_digest.json",
        keys_json({**case, "names": whole}),
        "remote_keys",
        "KeyMismatch",
        ["F-REM-1"],
    )
    no_tag = {**case["names"], "part": f"{names.ns}p/{sc.key.hex()}/{nonce}/{part}"}
    put(
        "remote_keys_no_hash_tag.json",
        keys_json({**case, "names": no_tag}),
        "remote_keys",
        "KeyMismatch",
        ["F-REM-1"],
    )
    put(
        "remote_keys_bad_name.json",
        keys_json({**case, "name": "Chat/Prod"}),
        "remote_keys",
        "FormatError",
        ["F-REM-1"],
    )
    doc = {
        "format_version": "1.1",
        "writers": "1.2",
        "generator": f"tools/make_vectors.py --{V1_2}",
        "vectors": entries,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}")
    return 0


ERRATA_1_2 = "v1.2-errata1"


def main_v1_2_errata1(out: str, vectors_root: str = "format-spec/vectors") -> int:
    """Format 1.1 and writers of 1.2, settled: what an implementation written from the spec
    alone had to guess, each now a rule with its vectors (spec F-KEY-6, F-CHAIN-1, F-CHAIN-2,
    F-CHAIN-6, F-SC-5, F-SC-7, F-REM-2, F-READ-1), and a corrected
    ``manifest_checkpoints_out_of_order.chain``: the ``v1.1-errata1`` one also puts a
    checkpoint past the tokens, breaking two rules. Deterministic: same inputs, same bytes
    (tests/conformance/test_vectors.py runs it into a temporary folder and compares)."""
    from stratastore.format import decode_sidecar
    from stratastore.format.manifest import (
        MANIFEST_HEAD,
        ChainManifest,
        ManifestCheckpoint,
        decode_manifest,
        encode_manifest,
    )
    from stratastore.format.remote_record import CommitRecord
    from stratastore.format.sidecar import MAX_SIDECAR_BYTES, MAX_STORED_PAGE_BYTES

    if not fresh_folder(out):
        return 1
    v1 = os.path.join(vectors_root, "v1")
    errata1 = os.path.join(vectors_root, ERRATA_1)
    v1_2 = os.path.join(vectors_root, V1_2)
    entries: list[dict[str, object]] = []

    put = vector_writer(out, entries)
    read = read_vector

    def recipe(doc: dict[str, object]) -> bytes:
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    root = FP.digest()
    put("fingerprint.bin", FP.pack(), "fingerprint", "ok", ["F-FP-1"])

    # -- the correction: checkpoints out of order, and nothing else ---------------------------
    good = read(errata1, "manifest_ok.chain")
    m = decode_manifest(good)
    k1, k2 = (k for _, _, k in m.segments)
    ck = MANIFEST_HEAD.size + len(m.conv_id.encode()) + 4 * len(m.tokens)
    first, second = good[ck : ck + 48], good[ck + 48 : ck + 96]  # the checkpoints at 10, 15
    swapped = resign(good[:ck] + second + first + good[ck + 96 :])
    put(
        "manifest_checkpoints_out_of_order.chain",
        swapped,
        "manifest",
        "FormatError",
        ["F-CHAIN-2", "F-READ-3"],
    )

    # -- a manifest's size (F-CHAIN-1, F-READ-1 step 1) ----------------------------------------
    smallest = encode_manifest(ChainManifest("c", root, np.zeros(0, np.uint32), (), (), (), SEALED))
    assert len(smallest) == MANIFEST_HEAD.size + 1 + 32
    put("manifest_smallest.chain", smallest, "manifest", "ok", ["F-CHAIN-1", "F-READ-1"])
    no_id = bytearray(smallest[:-33])
    struct.pack_into("<H", no_id, 48, 0)  # conv_id_bytes: 0
    put(
        "manifest_empty_id.chain",
        resign(bytes(no_id) + bytes(32)),
        "manifest",
        "FormatError",
        ["F-CHAIN-1", "F-CHAIN-4"],
    )
    short = bytearray(good[: MANIFEST_HEAD.size + 31])  # 107 bytes: one short of head + trailer
    struct.pack_into("<H", short, 8, 2)  # a newer major: the size is checked first
    put(
        "manifest_under_108_bytes_major2.chain",
        bytes(short),
        "manifest",
        "FormatError",
        ["F-CHAIN-1", "F-READ-1"],
    )

    # -- a state where no segment ends (F-CHAIN-6) ---------------------------------------------
    def with_checkpoints(*ckpts: ManifestCheckpoint) -> bytes:
        return encode_manifest(replace(m, checkpoints=ckpts))

    pinned, tail = m.checkpoints
    put(
        "manifest_checkpoint_at_zero.chain",
        with_checkpoints(ManifestCheckpoint(0), pinned, tail),
        "manifest",
        "ok",
        ["F-CHAIN-2", "F-CHAIN-6"],
    )
    put(
        "manifest_state_at_zero.chain",
        with_checkpoints(ManifestCheckpoint(0, state_key=state_key(root)), pinned, tail),
        "manifest",
        "KeyMismatch",
        ["F-CHAIN-6", "F-KEY-5"],
    )
    put(
        "manifest_state_inside_segment.chain",
        with_checkpoints(pinned, ManifestCheckpoint(12, state_key=state_key(k1)), tail),
        "manifest",
        "KeyMismatch",
        ["F-CHAIN-6"],
    )

    # -- keys after a wrong one chain from the derived key (F-CHAIN-2) -------------------------
    wrong0 = segment_key(root, m.tokens[:10])  # the media-free key of [0, 10)
    later = replace(m, segments=((0, 10, wrong0), (10, 15, k2)))
    put(
        "manifest_later_keys_derived.chain",
        encode_manifest(later),
        "manifest",
        "KeyMismatch",
        ["F-CHAIN-2"],
        first_mismatch="segment 0",
    )

    # -- a sidecar's key against its name is checked after its model (F-KEY-6, F-READ-1) ------
    other_side = read(v1, "sidecar_other_model.side")
    osc = decode_sidecar(other_side)
    put(
        "sidecar_other_model.side",
        other_side,
        "sidecar",
        "ok",
        ["F-FP-1"],
        key=osc.key.hex(),
        pages=osc.page_count,
        payload_bytes=osc.payload_bytes,
    )
    put(
        "segment_other_model.seg",
        read(v1, "segment_other_model.seg"),
        "segment",
        "ok",
        ["F-SEG-1"],
        sidecar="sidecar_other_model.side",
        payload="pattern",
    )
    ours = segment_key(root, list(range(100, 110)))  # the key v1's sidecar_kv_raw.side holds
    put(
        "store_name_mismatch_other_model.json",
        recipe(
            {
                "fingerprint": "fingerprint.bin",
                "files": {
                    f"strata-conv-{ours.hex()}.side": "sidecar_other_model.side",
                    f"strata-conv-{ours.hex()}.seg": "segment_other_model.seg",
                },
            }
        ),
        "store",
        "IncompatibleFingerprint",
        ["F-KEY-6", "F-FP-5", "F-READ-1"],
    )

    # -- the largest sidecar (F-SC-7, F-READ-1 step 1): a recipe, not 40 MB of zeros -----------
    major2 = read(v1, "sidecar_major2.side")
    put("sidecar_major2.side", major2, "sidecar", "UnsupportedVersion", ["F-COMPAT-1"])
    for name, size, expect in [
        ("sidecar_longest_major2.json", MAX_SIDECAR_BYTES, "UnsupportedVersion"),
        ("sidecar_over_longest_major2.json", MAX_SIDECAR_BYTES + 1, "FormatError"),
    ]:
        put(
            name,
            recipe({"of": "sidecar", "head": "sidecar_major2.side", "bytes": size}),
            "sized",
            expect,
            ["F-SC-7", "F-READ-1"],
        )

    # -- commit records (F-REM-2): the head's bounds, the part count, the level byte -----------
    rec = read(v1_2, "remote_commit_ok.rec")
    nonce = "00112233445566778899aabbccddeeff"
    head = f"SRC1:{nonce}:2:4096:".encode()
    side = rec[len(head) :]
    sc = decode_sidecar(side)
    assert sc.level is Level.COLD, "a remote copy's sidecar carries 2"
    side2 = patch_head(side, 8, "<H", 2)
    put(
        "remote_commit_sidecar_major2.rec",
        head + side2,
        "remote_commit",
        "UnsupportedVersion",
        ["F-REM-2", "F-READ-1"],
    )
    put(
        "remote_commit_parts_eleven_digits.rec",
        f"SRC1:{nonce}:10000000000:4096:".encode() + side2,
        "remote_commit",
        "FormatError",
        ["F-REM-2", "F-READ-1"],
    )
    put(
        "remote_commit_parts_too_many.rec",
        f"SRC1:{nonce}:3:4096:".encode() + side,
        "remote_commit",
        "FormatError",
        ["F-REM-2"],
    )
    warm = CommitRecord(nonce, 2, 4096, replace(sc, level=Level.WARM)).encode()
    put("remote_commit_level_warm.rec", warm, "remote_commit", "ok", ["F-REM-2", "F-SC-5"])
    # ten-digit parts: 1,893 ZSTD pages of the largest stored length, in 4 KiB parts
    n_pages = 1893
    lengths = (MAX_STORED_PAGE_BYTES,) * n_pages
    big = Sidecar(
        kind=Kind.KV,
        codec=Codec.ZSTD,
        level=Level.COLD,
        fingerprint=FP,
        key=segment_key(root, [7] * (n_pages * FP.page_tokens)),
        parent_key=root,
        token_start=0,
        token_end=n_pages * FP.page_tokens,
        page_bytes=FP.page_bytes,
        last_page_bytes=FP.page_bytes,
        page_hashes=b"".join(
            blake3.blake3(i.to_bytes(4, "little")).digest() for i in range(n_pages)
        ),
        stored_bytes=sum(lengths),
        sealed_at_ns=SEALED,
        stored_lengths=lengths,
    )
    ten = CommitRecord.for_sidecar(nonce, big, 4096)
    assert len(str(ten.parts)) == 10
    put("remote_commit_parts_ten_digits.rec", ten.encode(), "remote_commit", "ok", ["F-REM-2"])

    # -- the index's derived tables (F-IDX-7): ages keyed big-endian, totals little-endian ---
    pairs = []
    for side_name, seg_name in [
        ("sidecar_kv_raw.side", "segment_kv_raw.seg"),
        ("sidecar_kv_zstd.side", "segment_kv_zstd.seg"),
    ]:
        side_raw, seg_raw = read(v1, side_name), read(v1, seg_name)
        one = decode_sidecar(side_raw)
        put(
            side_name,
            side_raw,
            "sidecar",
            "ok",
            ["F-SC-1"],
            key=one.key.hex(),
            pages=one.page_count,
            payload_bytes=one.payload_bytes,
        )
        put(
            seg_name,
            seg_raw,
            "segment",
            "ok",
            ["F-SEG-1"],
            sidecar=side_name,
            payload="pattern" if "raw" in side_name else "pattern+7",
        )
        pairs.append((one, side_name, seg_name, len(side_raw) + len(seg_raw)))
    files = {}
    for one, side_name, seg_name, _ in pairs:
        files[f"strata-conv-{one.key.hex()}.side"] = side_name
        files[f"strata-conv-{one.key.hex()}.seg"] = seg_name
    total = sum(n for *_, n in pairs)

    def tables(age: str, count: str) -> bytes:
        return recipe(
            {
                "fingerprint": "fingerprint.bin",
                "files": files,
                "tables": {
                    "ages": {
                        (struct.pack(age, one.sealed_at_ns) + one.key).hex(): ""
                        for one, *_ in pairs
                    },
                    "totals": {b"bytes".hex(): struct.pack(count, total).hex()},
                },
            }
        )

    put("index_tables.json", tables(">Q", "<Q"), "index_tables", "ok", ["F-IDX-7"])
    put(
        "index_tables_ages_little_endian.json",
        tables("<Q", "<Q"),
        "index_tables",
        "KeyMismatch",
        ["F-IDX-7"],
    )
    put(
        "index_tables_totals_big_endian.json",
        tables(">Q", ">Q"),
        "index_tables",
        "KeyMismatch",
        ["F-IDX-7"],
    )

    old = next(
        e
        for e in json.loads(read(errata1, "MANIFEST.json"))["vectors"]
        if e["file"] == "manifest_checkpoints_out_of_order.chain"
    )
    supersedes = [
        {
            "file": f"{ERRATA_1}/{old['file']}",
            "blake3": old["blake3"],
            "expect": "FormatError",
            "violates": ["F-CHAIN-2"],
            "replaced_by": old["file"],
            "reason": (
                "besides the order it tests, its first checkpoint (moved to 20) lies past "
                "the 15 tokens: an invalid vector must break exactly one rule"
            ),
        }
    ]
    doc = {
        "format_version": "1.1",
        "writers": "1.2",
        "generator": f"tools/make_vectors.py --{ERRATA_1_2}",
        "corrects": ERRATA_1,
        "vectors": entries,
        "supersedes": supersedes,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}, superseding {len(supersedes)}")
    return 0


ERRATA_2_2 = "v1.2-errata2"


def main_v1_2_errata2(out: str, vectors_root: str = "format-spec/vectors") -> int:
    """Format 1.1 and writers of 1.2, settled again: the points a reader written from the spec
    alone still had to guess after ``v1.2-errata1``, each now a rule with its vectors. A
    sidecar's ``head_bytes`` is bounded as a field (spec F-SC-7, F-READ-1 step 4); a
    commit record's part count of ``0`` is a malformed head, refused before its sidecar
    (F-REM-2); an empty conversation id is refused at F-READ-1 step 7, after the trailer
    (F-CHAIN-1, F-CHAIN-4). Supersedes nothing. Deterministic: same inputs, same bytes
    (tests/conformance/test_vectors.py runs it into a temporary folder and compares)."""
    from stratastore.format import decode_sidecar
    from stratastore.format.sidecar import MAX_HEAD_BYTES

    if not fresh_folder(out):
        return 1
    v1 = os.path.join(vectors_root, "v1")
    v1_2 = os.path.join(vectors_root, V1_2)
    errata1 = os.path.join(vectors_root, ERRATA_1_2)
    entries: list[dict[str, object]] = []

    put = vector_writer(out, entries)
    read = read_vector

    # -- a sidecar's head_bytes is bounded as a field (F-SC-7, F-READ-1 step 4) ---------------
    sc = decode_sidecar(read(v1, "sidecar_kv_raw.side"))
    grown = MAX_HEAD_BYTES - SIDECAR_HEAD.size  # the 4,096 bytes a later minor may add
    longest = encode_sidecar(replace(sc, minor=1, extra_head=bytes(grown)))
    assert struct.unpack_from("<H", longest, 12)[0] == MAX_HEAD_BYTES
    put(
        "sidecar_head_longest.side",
        longest,
        "sidecar",
        "ok",
        ["F-SC-1", "F-SC-7", "F-COMPAT-3"],
        key=sc.key.hex(),
        pages=sc.page_count,
        payload_bytes=sc.payload_bytes,
    )
    # one head byte more, the file exactly as long as its counts say, its trailer good: only
    # the bound on the field refuses it
    over = bytearray(longest[:MAX_HEAD_BYTES] + b"\0" + longest[MAX_HEAD_BYTES:])
    struct.pack_into("<H", over, 12, MAX_HEAD_BYTES + 1)
    put(
        "sidecar_head_over_longest.side",
        resign(bytes(over)),
        "sidecar",
        "FormatError",
        ["F-SC-7", "F-READ-1"],
    )

    # -- a part count of 0 is a malformed head, refused before the sidecar (F-REM-2) ----------
    rec = read(v1_2, "remote_commit_ok.rec")
    nonce = "00112233445566778899aabbccddeeff"
    side = rec[len(f"SRC1:{nonce}:2:4096:") :]
    side_major2 = patch_head(side, 8, "<H", 2)
    put(
        "remote_commit_parts_zero_major2.rec",
        f"SRC1:{nonce}:0:4096:".encode() + side_major2,
        "remote_commit",
        "FormatError",
        ["F-REM-2", "F-READ-1"],
    )

    # -- an empty conversation id is refused at step 7, after the trailer (F-CHAIN-1) ---------
    empty = read(errata1, "manifest_empty_id.chain")
    assert len(empty) == 108
    put(
        "manifest_empty_id_bad_trailer.chain",
        empty[:-1] + bytes([empty[-1] ^ 0x01]),
        "manifest",
        "ChecksumMismatch",
        ["F-CHAIN-1", "F-CHAIN-4", "F-READ-1"],
    )

    doc = {
        "format_version": "1.1",
        "writers": "1.2",
        "generator": f"tools/make_vectors.py --{ERRATA_2_2}",
        "vectors": entries,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}")
    return 0


V1_3 = "v1.3"
#: the fixed test secrets of ``v1.3/`` (never a real level's)
TEST_SECRET = b"stratastore keyed level test secret 1"
TEST_SECRET_NEW = b"stratastore keyed level test secret 2"
TEST_SECRET_OTHER = b"a secret that is not the level's at all"


def keyed(sc: Sidecar, payload: bytes, secret: bytes) -> Sidecar:
    """``sc`` keyed by ``secret`` (spec F-KEYED-2/3): its page digests keyed, its key id."""
    from stratastore.format import PageHasher
    from stratastore.format.level_key import derive_key

    h = PageHasher(derive_key(secret))
    pb = sc.page_bytes
    digests = b"".join(h.digest(payload[i : i + pb]) for i in range(0, len(payload), pb))
    return replace(sc, page_hashes=digests, minor=1, key_id=h.key_id, hasher=h)


def main_v1_3(out: str) -> int:
    """Format 1.3: keyed sidecars (spec F-KEYED) under fixed test secrets, each in a key file of
    this folder that the vector names (``key_file``): the key derivation, a keyed sidecar, data
    file and commit record, and what a keyed level refuses (an unkeyed sidecar, another key's,
    a made-up key id, a trailer or pages not keyed) and a reader without the key. Deterministic:
    same inputs, same bytes (tests/conformance/test_vectors.py compares)."""
    from stratastore.format import PLAIN, LevelKeys
    from stratastore.format.level_key import derive_key, key_id_of
    from stratastore.format.remote_record import CommitRecord

    if not fresh_folder(out):
        return 1
    entries: list[dict[str, object]] = []
    put = vector_writer(out, entries)

    def key_file(*secrets: bytes) -> bytes:
        return (
            b"# test secrets of the v1.3 vectors, the writer's first\n"
            + b"\n".join(secrets)
            + b"\n"
        )

    def ids(*secrets: bytes) -> list[str]:
        return list(LevelKeys(list(secrets)).key_ids)

    # -- keys (F-KEYED-1) ------------------------------------------------------------------------
    put("fingerprint.bin", FP.pack(), "fingerprint", "ok", ["F-FP-1"])
    put(
        "level.key",
        key_file(TEST_SECRET),
        "level_key",
        "ok",
        ["F-KEYED-1"],
        key_ids=ids(TEST_SECRET),
    )
    put(
        "level_rotated.key",
        key_file(TEST_SECRET_NEW, TEST_SECRET),
        "level_key",
        "ok",
        ["F-KEYED-1", "F-KEYED-4"],
        key_ids=ids(TEST_SECRET_NEW, TEST_SECRET),
    )
    put(
        "other.key",
        key_file(TEST_SECRET_OTHER),
        "level_key",
        "ok",
        ["F-KEYED-1"],
        key_ids=ids(TEST_SECRET_OTHER),
    )
    plain_id = key_id_of(blake3.blake3(TEST_SECRET).digest()).hex()  # no derive_key context
    put(
        "level_key_without_context.key",
        key_file(TEST_SECRET),
        "level_key",
        "KeyMismatch",
        ["F-KEYED-1"],
        key_ids=[plain_id],
    )
    put(
        "level_short.key",
        key_file(TEST_SECRET[:15]),
        "level_key",
        "FormatError",
        ["F-KEYED-1"],
        key_ids=[],
    )
    assert derive_key(TEST_SECRET) != blake3.blake3(TEST_SECRET).digest()

    # -- a keyed sidecar, its data file, a commit record (F-KEYED-2/3/5) ------------------------
    payload = pattern(10 * FP.token_bytes)
    sc, stored = kv_sidecar(list(range(10)), FP.digest(), 0, payload, Codec.RAW)
    sc_k = keyed(sc, payload, TEST_SECRET)
    side_k = encode_sidecar(sc_k)
    ok = {"key": sc.key.hex(), "pages": sc.page_count, "payload_bytes": sc.payload_bytes}
    put(
        "sidecar_keyed.side",
        side_k,
        "sidecar",
        "ok",
        ["F-KEYED-2", "F-KEYED-3", "F-KEYED-5"],
        key_file="level.key",
        **ok,
    )
    header = encode_segment_header(
        SegmentHeader(sc.kind, sc.codec, sc.key, sc.page_count, sc.page_bytes, sc.stored_bytes)
    )
    seg = header + stored
    put(
        "segment_keyed.seg",
        seg,
        "segment",
        "ok",
        ["F-KEYED-2", "F-KEYED-4", "F-KEYED-5"],
        sidecar="sidecar_keyed.side",
        key_file="level_rotated.key",
        payload="pattern",
        payload_bytes=len(payload),
    )
    nonce = "00112233445566778899aabbccddeeff"
    put(
        "remote_commit_keyed.rec",
        CommitRecord(nonce, 1, 4096, sc_k).encode(),
        "remote_commit",
        "ok",
        ["F-KEYED-2", "F-REM-2"],
        key_file="level.key",
    )

    # -- what a keyed level refuses (F-KEYED-2/3/4/5) -------------------------------------------
    put(
        "sidecar_keyed_other_key.side",
        side_k,
        "sidecar",
        "NotAuthenticated",
        ["F-KEYED-5"],
        key_file="other.key",
    )
    side_plain = encode_sidecar(sc)
    assert sc.hasher == PLAIN
    put(
        "sidecar_unkeyed_in_keyed_level.side",
        side_plain,
        "sidecar",
        "NotAuthenticated",
        ["F-KEYED-5"],
        key_file="level.key",
    )
    made_up = bytearray(side_k[:-32])
    made_up[224:232] = b"\x11" * 8
    own = derive_key(TEST_SECRET_OTHER)
    put(
        "sidecar_keyed_made_up_id.side",
        bytes(made_up) + blake3.blake3(bytes(made_up), key=own).digest(),
        "sidecar",
        "NotAuthenticated",
        ["F-KEYED-5"],
        key_file="level.key",
    )
    put(
        "sidecar_keyed_plain_trailer.side",
        resign(side_k),
        "sidecar",
        "ChecksumMismatch",
        ["F-KEYED-2"],
        key_file="level.key",
    )
    short = bytearray(side_k[:224] + side_k[232:-32])
    struct.pack_into("<H", short, 12, 224)
    body = bytes(short)
    put(
        "sidecar_keyed_head_short.side",
        body + blake3.blake3(body, key=derive_key(TEST_SECRET)).digest(),
        "sidecar",
        "FormatError",
        ["F-KEYED-3", "F-READ-1"],
        key_file="level.key",
    )
    plain_pages = replace(sc_k, page_hashes=sc.page_hashes)
    put(
        "sidecar_keyed_plain_pages.side",
        encode_sidecar(plain_pages),
        "sidecar",
        "ok",
        ["F-KEYED-3"],
        key_file="level.key",
        **ok,
    )
    put(
        "segment_keyed_plain_pages.seg",
        seg,
        "segment",
        "PageMismatch:0",
        ["F-KEYED-2"],
        sidecar="sidecar_keyed_plain_pages.side",
        key_file="level.key",
    )
    sc_new = keyed(sc, payload, TEST_SECRET_NEW)
    put(
        "sidecar_keyed_new_key.side",
        encode_sidecar(sc_new),
        "sidecar",
        "NotAuthenticated",
        ["F-KEYED-4"],
        key_file="level.key",
    )

    # -- a reader without the key (F-KEYED-6) ---------------------------------------------------
    put("sidecar_keyed_no_key.side", side_k, "sidecar", "UnsupportedVersion", ["F-KEYED-6"])
    put("sidecar_unkeyed.side", side_plain, "sidecar", "ok", ["F-KEYED-6", "F-SC-2"], **ok)

    doc = {
        "format_version": "1.3",
        "generator": f"tools/make_vectors.py --{V1_3}",
        "vectors": entries,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(entries)} vectors to {out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--v1.1":
        raise SystemExit(
            main_v1_1(sys.argv[2] if len(sys.argv) > 2 else "format-spec/vectors/v1.1")
        )
    if len(sys.argv) > 1 and sys.argv[1] == f"--{ERRATA_1}":
        raise SystemExit(
            main_v1_1_errata1(
                sys.argv[2] if len(sys.argv) > 2 else f"format-spec/vectors/{ERRATA_1}",
                sys.argv[3] if len(sys.argv) > 3 else "format-spec/vectors",
            )
        )
    if len(sys.argv) > 1 and sys.argv[1] == f"--{V1_2}":
        raise SystemExit(
            main_v1_2(sys.argv[2] if len(sys.argv) > 2 else f"format-spec/vectors/{V1_2}")
        )
    if len(sys.argv) > 1 and sys.argv[1] == f"--{ERRATA_1_2}":
        raise SystemExit(
            main_v1_2_errata1(
                sys.argv[2] if len(sys.argv) > 2 else f"format-spec/vectors/{ERRATA_1_2}",
                sys.argv[3] if len(sys.argv) > 3 else "format-spec/vectors",
            )
        )
    if len(sys.argv) > 1 and sys.argv[1] == f"--{ERRATA_2_2}":
        raise SystemExit(
            main_v1_2_errata2(
                sys.argv[2] if len(sys.argv) > 2 else f"format-spec/vectors/{ERRATA_2_2}",
                sys.argv[3] if len(sys.argv) > 3 else "format-spec/vectors",
            )
        )
    if len(sys.argv) > 1 and sys.argv[1] == f"--{V1_3}":
        raise SystemExit(
            main_v1_3(sys.argv[2] if len(sys.argv) > 2 else f"format-spec/vectors/{V1_3}")
        )
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "format-spec/vectors/v1"))
