"""fsck: a clean store has no finding; each kind of damage gets its stable id; read-only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from stratastore.cli import main
from stratastore.format import data_name, sidecar_name
from stratastore.format.naming import INDEX_DIR
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from tests.conftest import kv_bytes, tiny_fp

FP = tiny_fp()
ROOT = Path(__file__).resolve().parents[3]


def make(d: Path, n: int = 3) -> list[bytes]:
    with SegmentStore.open(d, FP) as s:
        return [
            s.put_kv(s.root_key, np.arange(12) + 100 * i, kv_bytes(FP, 12, i), token_start=0).key
            for i in range(n)
        ]


def ids(*dirs: Path, deep: bool = False) -> set[str]:
    return {f.id for f in fsck([str(d) for d in dirs], deep=deep)}


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_clean_store_and_read_only(tmp_path: Path) -> None:
    d = tmp_path / "s"
    make(d)
    before = snapshot(d)
    assert ids(d, deep=True) == set()
    assert snapshot(d) == before  # fsck wrote nothing, not even the LMDB lock file


@pytest.mark.parametrize(
    ("damage", "finding"),
    [
        ("flip_page", "PAGE_HASH_MISMATCH"),
        ("flip_header", "SEGMENT_HEADER_INVALID"),
        ("truncate_data", "SEGMENT_SIZE_MISMATCH"),
        ("drop_data", "DATA_MISSING"),
        ("flip_sidecar", "SIDECAR_CHECKSUM"),
        ("garbage_sidecar", "SIDECAR_INVALID"),
        ("drop_sidecar", "ORPHAN_FILE"),
        ("temp_file", "ORPHAN_TEMP"),
        ("drop_index", "INDEX_ABSENT"),
        ("rename_sidecar", "SIDECAR_KEY_MISMATCH"),
    ],
)
def test_each_damage_has_its_id(tmp_path: Path, damage: str, finding: str) -> None:
    d = tmp_path / "s"
    key = make(d)[1]
    _damage(d, key, damage)
    found = ids(d)
    assert finding in found, found


def test_index_dangling_and_missing(tmp_path: Path) -> None:
    d = tmp_path / "s"
    keys = make(d)
    (d / sidecar_name(keys[0])).unlink()  # the index still names it
    assert {"INDEX_DANGLING", "ORPHAN_FILE"} <= ids(d)
    e = tmp_path / "e"
    with SegmentStore.open(e, FP) as s:
        s.put_kv(s.root_key, [7, 7, 7], kv_bytes(FP, 3), token_start=0)
    for name in (sidecar_name(keys[1]), data_name(keys[1])):  # committed behind e's index
        shutil.copy(d / name, e / name)
    assert ids(e) == {"INDEX_MISSING"}


def test_across_levels_and_manifests(tmp_path: Path) -> None:
    from stratastore import Checkpoint, Conversation, Store
    from stratastore.chain import as_tokens

    cold = tmp_path / "cold"
    with Store.open(
        FP, {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64, "min_free_mib": 1}
    ) as store:
        conv = Conversation(
            "c", as_tokens(np.arange(40)), [Checkpoint(16), Checkpoint(40)], cuts=[0, 16]
        )
        store.park(conv, kv_bytes(FP, 40))
    assert ids(cold) == set()
    warm = tmp_path / "warm"
    warm.mkdir()
    victim = next(p for p in cold.glob("strata-conv-*.side"))
    shutil.copy(victim, warm / victim.name)
    shutil.copy(victim.with_suffix(".seg"), warm / victim.with_suffix(".seg").name)
    assert "DUPLICATE_ACROSS_LEVELS" in ids(warm, cold)
    for p in cold.glob("strata-conv-*"):
        p.unlink()
    assert "CHAIN_BROKEN" in ids(cold)


def test_cli_exit_codes_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "s"
    key = make(d)[0]
    assert main(["fsck", str(d)]) == 0
    assert "0 errors" in capsys.readouterr().out
    (d / data_name(key)).write_bytes(b"x")
    assert main(["fsck", str(d), "--json", "--deep"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["errors"] >= 1 and doc["findings"][0]["severity"] in ("error", "warning", "info")
    assert main(["fsck", str(tmp_path / "nope")]) == 2


def test_every_id_is_documented() -> None:
    from tests.unit.ops.test_findings_table import fsck_ids

    used = fsck_ids()
    documented = set(
        re.findall(r"^\| `([A-Z_]+)` \|", (ROOT / "format-spec" / "FSCK.md").read_text(), re.M)
    )
    assert used and used == documented


DAMAGES = [
    "flip_page",
    "flip_header",
    "truncate_data",
    "drop_data",
    "flip_sidecar",
    "garbage_sidecar",
    "drop_sidecar",
    "temp_file",
    "drop_index",
    "rename_sidecar",
]


@pytest.mark.parametrize("damage", DAMAGES)
def test_repair_cleans_without_losing_valid_data(tmp_path: Path, damage: str) -> None:
    from stratastore.ops.repair import repair

    d = tmp_path / "s"
    keys = make(d)
    _damage(d, keys[1], damage)
    repair([str(d)])
    after = list(fsck([str(d)], deep=True))
    assert [f for f in after if f.severity != "info"] == [], after
    with SegmentStore.open(d, FP) as s:  # the untouched segments are all still there, valid
        for k in (keys[0], keys[2]):
            assert s.verify(k) == -1
    quarantined = d / "strata-quarantine"
    if damage not in ("temp_file", "drop_index"):
        assert quarantined.is_dir() and any(quarantined.iterdir())  # moved aside, not deleted
    assert repair([str(d)]) == []  # a second repair changes nothing


def _damage(d: Path, key: bytes, damage: str) -> None:
    data, side = d / data_name(key), d / sidecar_name(key)
    if damage == "flip_page":
        raw = bytearray(data.read_bytes())
        raw[4096 + 3 * FP.page_bytes - 1] ^= 1
        data.write_bytes(bytes(raw))
    elif damage == "flip_header":
        raw = bytearray(data.read_bytes())
        raw[30] ^= 1
        data.write_bytes(bytes(raw))
    elif damage == "truncate_data":
        data.write_bytes(data.read_bytes()[:-1])
    elif damage == "drop_data":
        data.unlink()
    elif damage == "flip_sidecar":
        raw = bytearray(side.read_bytes())
        raw[-40] ^= 1
        side.write_bytes(bytes(raw))
    elif damage == "garbage_sidecar":
        side.write_bytes(b"junk" * 10)
    elif damage == "drop_sidecar":
        side.unlink()
    elif damage == "temp_file":
        (d / "strata-tmp-0011223344556677-x").write_bytes(b"partial")
    elif damage == "drop_index":
        shutil.rmtree(d / INDEX_DIR)
    elif damage == "rename_sidecar":
        side.rename(d / sidecar_name(bytes(32)))
        data.rename(d / data_name(bytes(32)))


def test_repair_truncates_a_broken_chain(tmp_path: Path) -> None:
    from stratastore import Checkpoint, Conversation, Store
    from stratastore.chain import as_tokens
    from stratastore.ops.repair import repair

    cold = tmp_path / "cold"
    cfg = {"ram_mib": 1, "park": "disk", "cold_dir": str(cold), "cold_mib": 64, "min_free_mib": 1}
    ckpts = [Checkpoint(16), Checkpoint(32), Checkpoint(48)]
    conv = Conversation("c", as_tokens(np.arange(48)), ckpts, cuts=[0, 16, 32])
    kv = kv_bytes(FP, 48)
    with Store.open(FP, cfg) as store:
        store.park(conv, kv.copy())
        store.flush()
    _damage(cold, conv.segment_keys(FP.digest())[2].key, "flip_page")  # the last segment is damaged
    actions = repair([str(cold)])
    assert {a.kind for a in actions} >= {"quarantine", "rebuild_index", "truncate_chain"}
    assert [f for f in fsck([str(cold)], deep=True) if f.severity != "info"] == []
    with Store.open(FP, cfg) as store:
        out = np.zeros_like(kv)
        r = store.restore(conv.tokens, out)
        assert r.tokens == 32 and np.array_equal(
            out[: 32 * FP.token_bytes], kv[: 32 * FP.token_bytes]
        )


def test_cli_repair_needs_confirmation(tmp_path: Path) -> None:
    import subprocess
    import sys

    d = tmp_path / "s"
    make(d)
    (d / "strata-tmp-00-x").write_bytes(b"x")
    cmd = [sys.executable, "-m", "stratastore.cli", "fsck", str(d), "--repair"]
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert r.returncode == 2 and "--yes" in r.stderr and (d / "strata-tmp-00-x").exists()
    r = subprocess.run([*cmd, "--yes"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "remove_temp" in r.stdout and not (d / "strata-tmp-00-x").exists()


def test_five_damages_at_once_then_repair_via_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store of three conversations damaged by hand in five ways (a flipped page byte, a deleted
    sidecar, an orphan temp file, a truncated segment, a deleted index): ``strata fsck`` names each
    with its id and exits 1; ``--repair --yes`` brings it to exit 0, and each damaged conversation
    restores its valid prefix."""
    from stratastore import Store
    from stratastore.format.manifest import decode_manifest
    from stratastore.format.naming import chain_name
    from tests.reliability.harness import FP as RFP
    from tests.reliability.harness import TB, WORKLOADS, conversation

    w = WORKLOADS["park"]
    w.run(tmp_path, lambda i: None)
    cold = tmp_path / "cold"

    def seg_of(conv: str, start: int) -> bytes:
        m = decode_manifest((cold / chain_name(conv)).read_bytes())
        return next(k for s, _, k in m.segments if s == start)

    flipped, unsided, cut = seg_of("conv0", 64), seg_of("conv1", 32), seg_of("conv2", 64)
    raw = bytearray((cold / data_name(flipped)).read_bytes())
    raw[4096 + 7] ^= 0x20
    (cold / data_name(flipped)).write_bytes(bytes(raw))
    (cold / sidecar_name(unsided)).unlink()
    (cold / "strata-tmp-0123456789abcdef-x").write_bytes(b"half a segment")
    (cold / data_name(cut)).write_bytes((cold / data_name(cut)).read_bytes()[:-1000])
    shutil.rmtree(cold / INDEX_DIR)

    assert main(["fsck", str(cold), "--json"]) == 1
    found = {
        (f["id"], Path(f["object"]).name) for f in json.loads(capsys.readouterr().out)["findings"]
    }
    assert ("PAGE_HASH_MISMATCH", data_name(flipped)) in found, found
    assert ("ORPHAN_FILE", data_name(unsided)) in found, found
    assert ("ORPHAN_TEMP", "strata-tmp-0123456789abcdef-x") in found, found
    assert ("SEGMENT_SIZE_MISMATCH", data_name(cut)) in found, found
    assert ("INDEX_ABSENT", INDEX_DIR) in found, found

    assert main(["fsck", str(cold), "--repair", "--yes"]) == 0
    capsys.readouterr()
    assert main(["fsck", str(cold), "--deep"]) == 0
    with Store.open(RFP, w.cfg(tmp_path)) as store:
        for i, want in enumerate([64, 32, 64]):
            conv, kv = conversation(i)
            out = np.zeros_like(kv)
            assert store.restore(conv.tokens, out).tokens == want
            assert np.array_equal(out[: want * TB], kv[: want * TB])
