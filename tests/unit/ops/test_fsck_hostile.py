"""fsck/repair against what a hostile tester found.

Repair cuts a chain at a segment absent from every level only when the levels are known to be
the whole store (a config file, or a store root with both warm/ and cold/ or a strata.toml); a
linked level is a level; what counts as present is one definition (a regular sidecar, lstat)
shared by fsck and repair; links in strata-index/ are findings; messages say what happens.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stratastore import Checkpoint, Conversation, Store
from stratastore.chain import as_tokens
from stratastore.cli import main
from stratastore.format import ChecksumMismatch, data_name, sidecar_name
from stratastore.format.naming import INDEX_DIR, is_chain_name
from stratastore.levels.local import SegmentStore
from stratastore.ops.fsck import fsck
from tests.conftest import kv_bytes, tiny_fp
from tests.unit.ops.test_fsck_levels import _restores

FP = tiny_fp()


def _store(warm: Path, cold: Path) -> tuple[dict[str, Any], Conversation, Any]:
    """One chain: its manifest in cold, its segments in warm (where parks go)."""
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
    conv = Conversation(
        "c",
        as_tokens(np.arange(48)),
        [Checkpoint(16), Checkpoint(32), Checkpoint(48)],
        cuts=[0, 16, 32],
    )
    kv = kv_bytes(FP, 48)
    with Store.open(FP, cfg) as store:
        store.park(conv, kv.copy())
        store.flush()
    assert [p for p in cold.iterdir() if is_chain_name(p.name)]
    assert list(warm.glob("strata-conv-*.side")) and not list(cold.glob("strata-conv-*"))
    return cfg, conv, kv


def _snapshot(*dirs: Path) -> dict[str, bytes]:
    return {
        str(p): p.read_bytes()
        for d in dirs
        for p in sorted(d.rglob("*"))
        if p.is_file() and INDEX_DIR not in p.parts
    }


def _make_special(path: Path, kind: str, tmp_path: Path) -> None:
    """Replace the store file ``path`` by a link to a copy of it, or by a FIFO."""
    if kind == "symlink":
        shutil.copy(path, tmp_path / "copy.side")
        path.unlink()
        path.symlink_to(tmp_path / "copy.side")
    else:
        path.unlink()
        os.mkfifo(path)


def test_a_linked_level_of_a_store_root_is_a_level(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``root/warm`` a link to the real warm (the user's configured path may be one): it is a
    level, checked and named; repair of the root cuts nothing (it quarantined every chain)."""
    root = tmp_path / "root"
    cfg, conv, kv = _store(root / "warm", root / "cold")
    real = tmp_path / "elsewhere-warm"
    (root / "warm").rename(real)
    (root / "warm").symlink_to(real, target_is_directory=True)
    before = _snapshot(real, root / "cold")
    capsys.readouterr()
    assert main(["fsck", str(root), "--repair", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"levels checked: {root / 'warm'}, {root / 'cold'}"), out
    assert "truncate_chain" not in out and "quarantine" not in out, out
    assert "0o777" not in out, out  # the level's own mode, not the link's
    assert _snapshot(real, root / "cold") == before
    assert _restores(cfg, conv, kv) == 48


def test_discovery_says_what_it_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    _store(root / "warm", root / "cold")
    (root / "gone").symlink_to(tmp_path / "nothing-here")
    capsys.readouterr()
    assert main(["fsck", str(root)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "skipped" in first and "gone" in first, first


def test_a_root_holding_only_cold_is_not_the_whole_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """warm configured on another disk: the root holds only cold/, so repair cannot know where
    the chain's segments are; it refuses (exit 2, nothing changed) and names the fix."""
    warm, root = tmp_path / "ssd" / "warm", tmp_path / "root"
    cfg, conv, kv = _store(warm, root / "cold")
    before = _snapshot(warm, root / "cold")
    capsys.readouterr()
    assert main(["fsck", str(root), "--repair", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "nothing was changed" in err and "'c'" in err and "--config" in err, err
    assert "Traceback" not in err
    assert _snapshot(warm, root / "cold") == before
    assert _restores(cfg, conv, kv) == 48


def test_two_levels_given_are_not_the_whole_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any two level directories (here the chains' cold and an unrelated empty level) are not
    "warm and cold of one store": repair refuses rather than cut every chain."""
    warm, cold = tmp_path / "ssd" / "warm", tmp_path / "hdd" / "cold"
    cfg, conv, kv = _store(warm, cold)
    other = tmp_path / "other" / "cold"
    (other / INDEX_DIR).mkdir(parents=True)
    before = _snapshot(warm, cold)
    capsys.readouterr()
    assert main(["fsck", str(cold), str(other), "--repair", "--yes"]) == 2
    assert "nothing was changed" in capsys.readouterr().err
    assert main(["fsck", str(cold), str(cold) + "/.", "--repair", "--yes"]) == 2
    assert _snapshot(warm, cold) == before
    assert _restores(cfg, conv, kv) == 48


def test_a_config_file_in_the_store_root_names_the_whole_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``root/strata.toml`` (what ``strata demo --dir`` writes) names warm on another disk: fsck
    of the root checks both levels, and repair knows the store is whole and cuts nothing."""
    warm, root = tmp_path / "ssd" / "warm", tmp_path / "root"
    cfg, conv, kv = _store(warm, root / "cold")
    (root / "strata.toml").write_text(
        f'warm_dir = "{warm}"\nwarm_mib = 64\ncold_dir = "{root / "cold"}"\ncold_mib = 64\n'
    )
    before = _snapshot(warm, root / "cold")
    capsys.readouterr()
    assert main(["fsck", str(root), "--repair", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"levels checked: {warm}, {root / 'cold'}"), out
    assert "strata.toml" in out.splitlines()[0]
    assert _snapshot(warm, root / "cold") == before
    assert _restores(cfg, conv, kv) == 48


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_repair_with_a_special_sidecar_does_not_crash(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chain's sidecar a link or a FIFO: fsck calls the chain broken, and repair's notion of
    a present segment is fsck's (a regular sidecar), so it finds the gap: no StopIteration."""
    root = tmp_path / "root"
    _store(root / "warm", root / "cold")
    side = sorted((root / "warm").glob("strata-conv-*.side"))[0]
    _make_special(side, kind, tmp_path)
    before = _snapshot(root / "cold")
    capsys.readouterr()
    assert main(["fsck", str(root), "--repair", "--yes"]) == 1  # the link/FIFO stays an error
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err and "StopIteration" not in cap.err, cap.err
    assert ("SYMLINK" if kind == "symlink" else "NOT_REGULAR_FILE") in cap.out
    assert "stops here" in cap.out and "CHAIN_BROKEN" not in cap.out, cap.out
    # left alone, and so is what depends on it: replacing the link by the file heals the store
    assert "truncate_chain" not in cap.out and "ORPHAN_FILE" not in cap.out, cap.out
    assert os.path.lexists(side) and side.with_suffix(".seg").exists()
    assert _snapshot(root / "cold") == before


@pytest.mark.parametrize("victim", ["data.mdb", "lock.mdb", "write.lock", "monitor.json"])
def test_links_in_the_index_folder_are_findings(tmp_path: Path, victim: str) -> None:
    """Store.open refuses a linked index file; fsck names it (SYMLINK) and repair's rebuild
    does not follow it: the file it points at is unchanged."""
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0)
    canary = tmp_path / "canary"
    canary.write_bytes(b"canary")
    link = d / INDEX_DIR / victim
    if os.path.lexists(link):
        link.unlink()
    link.symlink_to(canary)
    found = [(f.id, f.object) for f in fsck([str(d)])]
    assert ("SYMLINK", str(link)) in found, found
    (d / "strata-tmp-00-x").write_bytes(b"x")
    seg = next(d.glob("strata-conv-*.seg"))
    raw = bytearray(seg.read_bytes())
    raw[-1] ^= 1  # a damage, so repair rebuilds the index
    seg.write_bytes(bytes(raw))
    assert main(["fsck", str(d), "--repair", "--yes"]) == 1
    assert canary.read_bytes() == b"canary" and link.is_symlink()


def test_a_fifo_in_the_index_folder_is_a_finding(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0)
    fifo = d / INDEX_DIR / "monitor.json"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    assert ("NOT_REGULAR_FILE", str(fifo)) in [(f.id, f.object) for f in fsck([str(d)])]


def test_orphan_file_detail_says_quarantine(tmp_path: Path) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        key = s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0).key
    (d / sidecar_name(key)).unlink()
    (orphan,) = [f for f in fsck([str(d)]) if f.id == "ORPHAN_FILE"]
    assert orphan.object == str(d / data_name(key))
    assert "quarantines" in orphan.detail and "removes" not in orphan.detail


def test_checksum_mismatch_shows_where_the_digests_differ() -> None:
    a = bytes.fromhex("c1afeca2a284d8d3" + "00" * 24)
    b = bytes.fromhex("c1afeca2a284d8d3" + "00" * 23 + "01")
    msg = str(ChecksumMismatch("x.seg", a, b))
    expected, got = msg.split("expected ")[1].split(", got ")
    assert expected.split()[0].rstrip(".)") != got.split()[0].rstrip(".);"), msg


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_inspect_lists_a_special_sidecar_and_carries_on(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        for i in range(3):
            s.put_kv(s.root_key, np.arange(12) + 100 * i, kv_bytes(FP, 12, i), token_start=0)
    side = sorted(d.glob("strata-conv-*.side"))[0]  # the first: inspect reads it for the model
    _make_special(side, kind, tmp_path)
    capsys.readouterr()
    assert main(["inspect", str(d)]) == 0
    out = capsys.readouterr().out
    assert f"not adopted: {side.name}" in out, out
    assert "2 segments" in out.splitlines()[0], out


def test_repair_in_a_linked_level_takes_the_levels_own_mode(tmp_path: Path) -> None:
    """A level named through a link: the quarantine repair makes gets the mode of the level
    directory itself, not the link's own 0o777."""
    from stratastore.ops.repair import repair

    real, link = tmp_path / "real", tmp_path / "link"
    with SegmentStore.open(real, FP) as s:
        s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0)
    os.chmod(real, 0o700)
    link.symlink_to(real, target_is_directory=True)
    seg = next(real.glob("strata-conv-*.seg"))
    raw = bytearray(seg.read_bytes())
    raw[-1] ^= 1
    seg.write_bytes(bytes(raw))
    assert any(a.kind == "quarantine" for a in repair([str(link)]))
    assert (real / "strata-quarantine").stat().st_mode & 0o077 == 0


def test_both_special_files_of_one_segment_are_named(tmp_path: Path) -> None:
    """The segment is left alone as a whole, but each of its special files is still a finding."""
    d = tmp_path / "s"
    with SegmentStore.open(d, FP) as s:
        s.put_kv(s.root_key, np.arange(12), kv_bytes(FP, 12), token_start=0)
    key = bytes.fromhex("ab" * 32)
    os.mkfifo(d / sidecar_name(key))
    os.mkfifo(d / data_name(key))
    found = [(f.id, Path(f.object).name) for f in fsck([str(d)]) if f.severity == "error"]
    assert sorted(found) == [
        ("NOT_REGULAR_FILE", data_name(key)),
        ("NOT_REGULAR_FILE", sidecar_name(key)),
    ], found
