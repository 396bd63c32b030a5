"""``SEGMENT_UNREACHABLE``: fsck names each committed segment no chain reaches (spec F-CHAIN-3: a
restore stops at a chain's first missing or damaged segment), only when the level set is the whole
store; repair quarantines them and a second fsck is clean."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.cli import main
from stratastore.format import Level, data_name, sidecar_name
from stratastore.format.manifest import ChainManifest, ManifestCheckpoint, decode_manifest
from stratastore.format.naming import QUARANTINE_DIR, chain_name
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import Finding, fsck
from stratastore.ops.level_dirs import StoreLevels
from stratastore.ops.reachability import reachability
from stratastore.ops.repair import repair
from stratastore.testing import check_conformance
from tests.conftest import tiny_fp

FP = tiny_fp()
SEG = 16  #: tokens a segment (every conversation is cut every 16 tokens)
rng = np.random.default_rng(12)
PREFIX, SHARED = rng.integers(0, 50_000, SEG), rng.integers(0, 50_000, SEG)
#: a and b share their first two segments, c only the first; a has four, b three, c two
TOKENS = {
    "a": np.concatenate([PREFIX, SHARED, rng.integers(0, 50_000, 2 * SEG)]),
    "b": np.concatenate([PREFIX, SHARED, rng.integers(0, 50_000, SEG)]),
    "c": np.concatenate([PREFIX, rng.integers(0, 50_000, SEG)]),
}


def _kv(tokens: npt.NDArray[np.integer]) -> npt.NDArray[np.uint8]:
    """The K/V a deterministic model computes: equal prefixes give equal bytes."""
    base = (tokens.astype(np.uint64) * 31 + np.arange(len(tokens))) % 251
    return np.repeat(base.astype(np.uint8), FP.token_bytes)


def _store(warm: Path, cold: Path) -> dict[str, Any]:
    """Parks a, b and c to disk (segments in warm, manifests in cold); returns the config."""
    # the store root (the levels' parent) is made with its levels
    cfg = {
        "ram_mib": 1,
        "park": "disk",
        "min_free_mib": 1,
        "warm_dir": str(warm),
        "warm_mib": 64,
        "cold_dir": str(cold),
        "cold_mib": 64,
        "create_dirs": True,
    }
    with Store.open(FP, cfg) as store:
        for cid, tokens in TOKENS.items():
            n = len(tokens)
            conv = Conversation(
                cid,
                as_tokens(tokens),
                [Checkpoint(x) for x in range(SEG, n + 1, SEG)],
                cuts=list(range(0, n, SEG)),
            )
            store.park(conv, _kv(tokens))
        store.flush()
    return cfg


def _segments(cold: Path, cid: str) -> list[bytes]:
    path = cold / chain_name(cid)
    return [k for _, _, k in decode_manifest(path.read_bytes(), str(path)).segments]


def _unreachable(found: list[Finding]) -> dict[str, Finding]:
    return {f.object: f for f in found if f.id == "SEGMENT_UNREACHABLE"}


def _restores(cfg: dict[str, Any], cid: str) -> int:
    tokens = TOKENS[cid]
    with Store.open(FP, cfg) as store:
        out = np.zeros(len(tokens) * FP.token_bytes, np.uint8)
        n = int(store.restore(tokens, out).tokens)
    assert np.array_equal(out[: n * FP.token_bytes], _kv(tokens)[: n * FP.token_bytes])
    return n


def _delete(level: Path, key: bytes) -> None:
    os.unlink(level / sidecar_name(key))
    os.unlink(level / data_name(key))


def _real(found: list[Finding]) -> list[Finding]:
    return [f for f in found if f.severity != "info"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    _store(tmp_path / "store" / "warm", tmp_path / "store" / "cold")
    return tmp_path / "store"


def test_a_fresh_store_has_no_unreachable_segment(root: Path) -> None:
    for deep in (False, True):
        assert _real(list(fsck([str(root / "warm"), str(root / "cold")], deep=deep))) == []


def test_the_segments_after_a_hole_and_only_those(root: Path) -> None:
    """a's third segment gone: its fourth is unreachable; its first two (b and c reach them
    too, and a still does) are not, nor any of b's or c's."""
    warm, cold = root / "warm", root / "cold"
    a = _segments(cold, "a")
    _delete(warm, a[2])
    for deep in (False, True):
        found = list(fsck([str(warm), str(cold)], deep=deep))
        gone = _unreachable(found)
        assert list(gone) == [str(warm / data_name(a[3]))], found
        detail = gone[str(warm / data_name(a[3]))].detail
        assert a[2].hex() in detail and "'a'" in detail and str(warm) in detail
        assert chain_name("a") in detail and "missing" in detail
        assert sorted(f.id for f in _real(found)) == [  # the index still names the hole
            "CHAIN_BROKEN",
            "INDEX_DANGLING",
            "SEGMENT_UNREACHABLE",
        ]


def test_a_hole_in_a_shared_segment(root: Path) -> None:
    """The segment a and b share gone: what follows it in both chains is unreachable; the
    prefix c also names is not."""
    warm, cold = root / "warm", root / "cold"
    a, b = _segments(cold, "a"), _segments(cold, "b")
    assert a[:2] == b[:2]
    _delete(warm, a[1])
    gone = _unreachable(list(fsck([str(warm), str(cold)])))
    assert set(gone) == {str(warm / data_name(k)) for k in (a[2], a[3], b[2])}


def test_a_segment_no_manifest_names(root: Path) -> None:
    warm, cold = root / "warm", root / "cold"
    with SegmentStore.open(warm, FP, level=Level.WARM) as s:
        tokens = rng.integers(0, 50_000, SEG)
        key = s.put_kv(s.root_key, tokens, _kv(tokens), token_start=0).key
    gone = _unreachable(list(fsck([str(warm), str(cold)])))
    assert list(gone) == [str(warm / data_name(key))]
    assert "no chain manifest names it" in gone[str(warm / data_name(key))].detail


def test_an_incomplete_level_set_reports_nothing(tmp_path: Path) -> None:
    """Warm on one disk, cold on another: fsck given warm alone sees no manifest (they are in
    cold) and cannot know the store has no other level, so it reports no segment unreachable;
    given the whole store it reports exactly the one past the hole."""
    warm, cold = tmp_path / "ssd" / "warm", tmp_path / "hdd" / "cold"
    _store(warm, cold)
    a = _segments(cold, "a")
    _delete(warm, a[2])
    assert _unreachable(list(fsck([str(warm)]))) == {}
    assert _unreachable(list(fsck([str(cold)]))) == {}
    guessed = StoreLevels((str(warm), str(cold)), (str(warm), str(cold)), False, "guessed")
    assert _unreachable(list(fsck([str(warm), str(cold)], levels=guessed))) == {}
    whole = StoreLevels((str(warm), str(cold)), (str(warm), str(cold)), True, "config")
    assert list(_unreachable(list(fsck([str(warm), str(cold)], levels=whole)))) == [
        str(warm / data_name(a[3]))
    ]
    assert list(_unreachable(list(fsck([str(warm)], levels=whole)))) == [
        str(warm / data_name(a[3]))
    ]  # manifests of a level only looked in count too


def test_repair_quarantines_them_and_fscks_clean(root: Path) -> None:
    warm, cold = root / "warm", root / "cold"
    cfg = {
        "ram_mib": 1,
        "park": "disk",
        "min_free_mib": 1,
        "warm_dir": str(warm),
        "warm_mib": 64,
        "cold_dir": str(cold),
        "cold_mib": 64,
    }
    a = _segments(cold, "a")
    _delete(warm, a[2])
    with SegmentStore.open(warm, FP, level=Level.WARM) as s:
        tokens = rng.integers(0, 50_000, SEG)
        stray = s.put_kv(s.root_key, tokens, _kv(tokens), token_start=0).key
    actions = repair([str(warm), str(cold)])
    moved = {os.path.basename(x.object) for x in actions if x.kind == "quarantine"}
    assert moved == {n(k) for k in (a[3], stray) for n in (sidecar_name, data_name)}, actions
    assert (warm / QUARANTINE_DIR / data_name(a[3])).is_file()  # never deleted
    assert _real(list(fsck([str(warm), str(cold)], deep=True))) == []
    assert repair([str(warm), str(cold)]) == []  # a second repair changes nothing
    assert _restores(cfg, "a") == 2 * SEG and _restores(cfg, "b") == 3 * SEG


def test_segments_behind_a_damaged_one_are_part_of_its_finding(root: Path) -> None:
    """One problem, one finding: the segment past a damaged one is in the damage's detail, not
    a SEGMENT_UNREACHABLE; repair quarantines the damaged one, cuts the chain, then quarantines
    what the cut chain no longer names, and the store fscks clean."""
    warm, cold = root / "warm", root / "cold"
    a = _segments(cold, "a")
    raw = bytearray((warm / data_name(a[2])).read_bytes())
    raw[4096 + 5] ^= 0x10
    (warm / data_name(a[2])).write_bytes(bytes(raw))
    found = _real(list(fsck([str(warm), str(cold)], deep=True)))
    assert [f.id for f in found] == ["PAGE_HASH_MISMATCH"], found
    assert data_name(a[3]) in found[0].detail and "reached by no chain" in found[0].detail
    actions = repair([str(warm), str(cold)])
    moved = {os.path.basename(x.object) for x in actions if x.kind == "quarantine"}
    assert {data_name(a[2]), data_name(a[3])} <= moved, actions
    assert "truncate_chain" in {x.kind for x in actions}
    assert _real(list(fsck([str(warm), str(cold)], deep=True))) == []


def test_cli_json_and_conformance_carry_the_id(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warm, cold = root / "warm", root / "cold"
    a = _segments(cold, "a")
    _delete(warm, a[2])
    capsys.readouterr()
    assert main(["fsck", str(root), "--deep", "--json"]) == 1  # the hole's INDEX_DANGLING
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {
        "dirs",
        "levels",
        "store_levels",
        "levels_complete",
        "levels_from",
        "deep",
        "errors",
        "findings",
    }
    assert doc["levels_complete"] is True and doc["errors"] == 1
    ours = [f for f in doc["findings"] if f["id"] == "SEGMENT_UNREACHABLE"]
    assert [(f["id"], f["severity"], f["object"]) for f in ours] == [
        ("SEGMENT_UNREACHABLE", "warning", str(warm / data_name(a[3])))
    ]
    assert set(ours[0]) == {"id", "severity", "object", "detail"} and "'a'" in ours[0]["detail"]
    report = check_conformance([str(warm), str(cold)])
    assert "SEGMENT_UNREACHABLE" in {f.id for f in report.allowed}  # F-CHAIN-3 allows it
    assert [f.id for fs in report.violations.values() for f in fs] == ["INDEX_DANGLING"]
    assert main(["fsck", str(root), "--repair", "--yes"]) == 0
    out = capsys.readouterr().out
    assert f"repair: quarantine: {warm / data_name(a[3])}: SEGMENT_UNREACHABLE" in out, out
    assert out.endswith("0 findings, 0 errors in 2 level(s)\n"), out
    assert main(["fsck", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


def _manifest(cid: str, n: int, keys: list[bytes], states: dict[int, bytes]) -> ChainManifest:
    bounds = [(i * SEG, (i + 1) * SEG, k) for i, k in enumerate(keys)]
    ckpts = tuple(ManifestCheckpoint(x, state_key=states.get(x)) for x in range(SEG, n + 1, SEG))
    return ChainManifest(cid, b"m" * 32, np.zeros(n, np.uint32), ckpts, (), tuple(bounds), 0)


def test_reachability_of_states_and_every_chain_that_stops() -> None:
    """The pure computation: a state is reachable when its checkpoint is within the readable
    prefix of a chain naming it; an unreachable key lists every chain that stops before it."""
    k = [bytes([i]) * 32 for i in range(6)]
    s16, s48 = b"s" * 32, b"t" * 32
    m1 = _manifest("x", 3 * SEG, k[:3], {SEG: s16, 3 * SEG: s48})
    m2 = _manifest("y", 3 * SEG, [k[0], k[1], k[3]], {})
    here = {k[0], k[2], k[3], k[5], s16, s48}  # k[1] is missing
    r = reachability([("m1", m1), ("m2", m2)], sorted(here), here.__contains__)
    assert r.reachable == {k[0], k[1], s16}
    assert set(r.unreachable) == {k[2], k[3], k[5], s48}
    assert [s.manifest for s in r.unreachable[k[2]].stops] == ["m1"]
    assert r.unreachable[s48].stops[0].key == k[1] and r.unreachable[s48].stops[0].missing
    assert r.unreachable[k[5]].stops == () and "no chain" in r.unreachable[k[5]].reason()
    damaged = reachability([("m1", m1)], [k[2]], lambda key: True, {k[1]}.__contains__)
    assert damaged.unreachable[k[2]].only_damage and k[1] in damaged.reachable
