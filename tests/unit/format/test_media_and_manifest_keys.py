"""Keys, sidecars and manifests agree on media, and a manifest is checked against its keys (spec
F-KEY-2, F-KEY-7, F-CHAIN-2, F-CHAIN-6, F-SEG-7).

A segment holding a picture is filed under the key computed with the picture, its sidecar carries
the picture, and the manifest names that key: a multimodal conversation parked to disk restores
whole, fsck finds it clean, and a text-only conversation with the same token ids never gets the
picture's K/V. A manifest whose segment keys are not its own tokens' (a forgery with intact
checksums) is refused by the reader, named by fsck and a conformance violation.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import blake3
import numpy as np
import pytest

from stratastore import Store
from stratastore.chain import Checkpoint, Conversation, as_tokens
from stratastore.config import StoreConfig
from stratastore.format.manifest import decode_manifest, encode_manifest
from stratastore.format.naming import chain_name
from stratastore.ops.fsck import fsck
from stratastore.ops.repair import repair
from stratastore.testing import check_conformance
from stratastore.tiers.records import Snapshot
from stratastore.tiers.tiered import Tiers
from tests.conftest import tiny_fp

FP = tiny_fp()  # 64 bytes a token, pages of 4 tokens
TB = FP.token_bytes
N = 64
PIC = blake3.blake3(b"a picture").digest()
AUDIO = blake3.blake3(b"a sound").digest()
MEDIA = {20: PIC, 40: AUDIO}  # inside the segments [16, 32) and [32, 48)


def conv(cid: str, media: dict[int, bytes] | None = None, base: int = 0) -> Conversation:
    lengths = [16, 32, 48, N]
    return Conversation(
        cid,
        as_tokens(np.arange(base, base + N) + 1000),
        [Checkpoint(x) for x in lengths],
        dict(media or {}),
        cuts=[0, 16, 32, 48],
    )


def snap(cid: str, media: dict[int, bytes] | None = None, seed: int = 0) -> Snapshot:
    kv = np.random.default_rng(seed).integers(0, 256, N * TB, dtype=np.uint8)
    return Snapshot(conv(cid, media), kv)


def tiers(tmp_path: Path, **kw: object) -> Tiers:
    values: dict[str, object] = {
        "ram_mib": 1,
        "slots": 4,
        "min_free_mib": 1,
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }
    values.update(kw)
    return Tiers(StoreConfig.from_mapping(values), FP, probe=lambda: 1 << 40, warn=lambda m: None)


def store_cfg(tmp_path: Path) -> dict[str, object]:
    """A Store that parks to a cold level only."""
    return {
        "ram_mib": 1,
        "slots": 4,
        "min_free_mib": 1,
        "park": "disk",
        "cold_dir": str(tmp_path / "cold"),
        "cold_mib": 64,
    }


def no_errors(dirs: list[str]) -> list[str]:
    """Errors, and broken chains (a warning for a conversation that is not a session)."""
    return [
        f"{f.id}: {f.detail}"
        for f in fsck(dirs, deep=True)
        if f.severity == "error" or f.id.startswith(("CHAIN_", "MANIFEST_"))
    ]


def assert_sidecars_carry_the_media(t: Tiers, c: Conversation) -> None:
    assert t.cold is not None
    for seg in c.segment_keys(FP.digest()):
        assert t.cold.store.sidecar(seg.key).media == seg.media  # F-KEY-7: offsets in segment


# -- item 2: pictures survive a park to disk ---------------------------------------------------
def test_multimodal_conversation_parked_to_disk_restores_whole(tmp_path: Path) -> None:
    """Park target disk: every segment is filed under its media key, its sidecar carries its
    media, fsck is clean (no CHAIN_BROKEN) and the conversation restores bit-identical, by
    prompt (with its pictures) in this process and in another one (spec F-SEG-7)."""
    t = tiers(tmp_path, park="disk")
    s = snap("mm", MEDIA)
    assert t.park(s).where == "disk"
    assert no_errors([str(tmp_path / "cold")]) == []
    assert_sidecars_carry_the_media(t, s.conv)
    for reader in (t, tiers(tmp_path, park="disk")):  # this process, then another one
        out = np.zeros(N * TB, np.uint8)
        r = reader.restore(s.conv.tokens, out, media=s.conv.media)
        assert (r.source, r.tokens) == ("disk", N) and np.array_equal(out, s.kv)
        assert reader.skipped_manifests == []
        reader.close()


def test_multimodal_session_loads_whole(tmp_path: Path) -> None:
    t = tiers(tmp_path)
    s = snap("session", MEDIA, seed=3)
    t.save_session(s)
    out = np.zeros(N * TB, np.uint8)
    assert len(t.load_session("session", out).tokens) == N and np.array_equal(out, s.kv)
    assert no_errors([str(tmp_path / "cold")]) == []
    t.close()


def test_text_only_conversation_is_never_served_the_pictures_kv(tmp_path: Path) -> None:
    """Same token ids, no pictures: its segments past the first picture have other keys, so it
    neither deduplicates onto the picture's segments nor restores them."""
    t = tiers(tmp_path, park="disk")
    mm, text = snap("mm", MEDIA, seed=1), snap("text", seed=2)
    text.kv[: 20 * TB] = mm.kv[: 20 * TB]  # causal: the K/V before the first picture is equal
    t.park(mm)
    # before the text-only one is parked: a prompt without the pictures resumes at most at the
    # first picture, with the K/V of the tokens before it (they do not depend on it)
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(text.conv.tokens, out)
    assert r.tokens <= 20 and np.array_equal(out[: r.tokens * TB], mm.kv[: r.tokens * TB])
    t.park(text)
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(text.conv.tokens, out)
    assert r.tokens == N and np.array_equal(out, text.kv)  # not the picture's K/V past 20
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(mm.conv.tokens, out, media=MEDIA)
    assert r.tokens == N and np.array_equal(out, mm.kv)  # and the pictures' still theirs
    assert no_errors([str(tmp_path / "cold")]) == []
    t.close()


@pytest.mark.parametrize("spill_on", ["evict", "park"])
def test_multimodal_conversation_spilled_from_ram_restores_whole(
    tmp_path: Path, spill_on: str
) -> None:
    """RAM -> disk: the spill (on eviction, or the mirror on park) writes the same segments."""
    t = tiers(tmp_path, slots=1, spill_on=spill_on)
    a, b = snap("a", MEDIA, seed=4), snap("b", seed=5)
    b.conv.tokens = b.conv.tokens + 5000  # another conversation: evicts a from the one slot
    assert t.park(a).where == "ram"
    t.park(b)
    assert "a" not in t.ram.entries
    assert no_errors([str(tmp_path / "cold")]) == []
    assert_sidecars_carry_the_media(t, a.conv)
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(a.conv.tokens, out, media=a.conv.media)
    assert (r.source, r.tokens) == ("disk", N) and np.array_equal(out, a.kv)
    t.close()


def test_spill_writer_of_the_store_writes_the_media(tmp_path: Path) -> None:
    """Through the facade: the async spill writer, then flush; another process restores."""
    cfg = store_cfg(tmp_path)
    s = snap("mm", MEDIA, seed=6)
    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        store.park(s.conv, s.kv.copy())
        store.flush()
    assert no_errors([str(tmp_path / "cold")]) == []
    t = tiers(tmp_path, park="disk")
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(s.conv.tokens, out, media=MEDIA)
    assert (r.source, r.tokens) == ("disk", N) and np.array_equal(out, s.kv)
    t.close()


def test_store_restores_a_multimodal_prompt_given_its_pictures(tmp_path: Path) -> None:
    """``Store.lookup``/``restore``/``restore_many`` take the prompt's media: with its pictures
    the whole conversation restores; without them only the prefix before the first picture's
    page (the picture's K/V is never served to a text-only prompt)."""
    cfg = store_cfg(tmp_path)
    s = snap("mm", MEDIA, seed=7)
    with Store.open(FP, cfg, probe=lambda: 1 << 40) as store:
        store.park(s.conv, s.kv.copy())
        store.flush()
        assert store.lookup(s.conv.tokens, MEDIA) == ("disk", N)
        out = np.zeros(N * TB, np.uint8)
        assert store.restore(s.conv.tokens, out, MEDIA).tokens == N
        assert np.array_equal(out, s.kv)
        many = np.zeros(N * TB, np.uint8)
        assert store.restore_many([(s.conv.tokens, many)], [MEDIA])[0].tokens == N
        assert np.array_equal(many, s.kv)
        text = np.zeros(N * TB, np.uint8)
        got = store.restore(s.conv.tokens, text).tokens
        assert got <= 16 and np.array_equal(text[: got * TB], s.kv[: got * TB])


# -- item 3: a manifest is checked against its keys --------------------------------------------
def forge(tmp_path: Path) -> tuple[Snapshot, Snapshot]:
    """Park a and b, then replace a's manifest by one with a's tokens and b's segment keys,
    its checksum intact (what a faulty writer or a forger leaves)."""
    t = tiers(tmp_path, park="disk")
    a, b = snap("a", seed=7), snap("b", seed=8)
    b.conv.tokens = b.conv.tokens + 7000
    t.park(a)
    t.park(b)
    t.close()
    cold = tmp_path / "cold"
    ma = decode_manifest((cold / chain_name("a")).read_bytes())
    mb = decode_manifest((cold / chain_name("b")).read_bytes())
    forged = dataclasses.replace(ma, segments=mb.segments)
    (cold / chain_name("a")).write_bytes(encode_manifest(forged))
    return a, b


def test_forged_manifest_is_refused_by_the_reader(tmp_path: Path) -> None:
    a, b = forge(tmp_path)
    warned: list[str] = []
    t = Tiers(
        StoreConfig.from_mapping(
            {
                "ram_mib": 1,
                "min_free_mib": 1,
                "park": "disk",
                "cold_dir": str(tmp_path / "cold"),
                "cold_mib": 64,
            }
        ),
        FP,
        probe=lambda: 1 << 40,
        warn=warned.append,
    )
    out = np.zeros(N * TB, np.uint8)
    r = t.restore(a.conv.tokens, out)
    assert (r.source, r.tokens) == ("none", 0) and not out.any()  # never b's K/V
    assert [n for n, _ in t.skipped_manifests] == [chain_name("a")]
    assert t.stats()["unreadable_manifests"] == [chain_name("a")]
    assert any("F-CHAIN-2" in w for w in warned)
    r = t.restore(b.conv.tokens, out)  # b itself is untouched
    assert r.tokens == N and np.array_equal(out, b.kv)
    t.close()


def test_forged_manifest_is_named_by_fsck_and_conformance(tmp_path: Path) -> None:
    forge(tmp_path)
    cold = str(tmp_path / "cold")
    found = [f for f in fsck([cold], deep=True) if f.severity == "error"]
    assert [(f.id, Path(f.object).name) for f in found] == [
        ("MANIFEST_KEY_MISMATCH", chain_name("a"))
    ]
    report = check_conformance([cold])
    assert not report.conforms
    assert [Path(f.object).name for f in report.violations["F-CHAIN-2"]] == [chain_name("a")]
    actions = repair([cold])  # the forged manifest is quarantined, b's left alone
    assert [(x.kind, Path(x.object).name) for x in actions if x.kind == "quarantine"] == [
        ("quarantine", chain_name("a"))
    ]
    assert no_errors([cold]) == [] and (tmp_path / "cold" / chain_name("b")).exists()


def test_a_manifest_under_another_conversations_name_is_refused(tmp_path: Path) -> None:
    """F-CHAIN-4: a valid manifest of conversation a copied over b's file name does not
    replace b for a reader (nor serve a's K/V as b's), and fsck names it CHAIN_INVALID."""
    t = tiers(tmp_path, park="disk")
    a, b = snap("a", seed=11), snap("b", seed=12)
    b.conv.tokens = as_tokens(np.arange(N) + 5000)
    assert t.park(a).where == "disk" and t.park(b).where == "disk"
    t.close()
    cold = tmp_path / "cold"
    (cold / chain_name("b")).write_bytes((cold / chain_name("a")).read_bytes())
    reader = tiers(tmp_path, park="disk")
    out = np.zeros(N * TB, np.uint8)
    assert reader.restore(a.conv.tokens, out).tokens == N  # a is still a's
    assert any(name == chain_name("b") for name, _ in reader.skipped_manifests)
    reader.close()
    found = [f for f in fsck([str(cold)]) if f.object.endswith(chain_name("b"))]
    assert [f.id for f in found] == ["CHAIN_INVALID"]
